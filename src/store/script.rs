//! The one way the store runs a Lua script: by SHA1 (`EVALSHA`) on the node that serves its first
//! key, with its text when the server does not have it yet, within a deadline for the whole call,
//! its reply read by the caller's reader (a reply of the wrong shape drops the connection); and
//! several calls of one script as one pipeline. Every script call of `store/` goes through here.

use std::time::Duration;

use redis::{Script, Value};

use crate::clock::Instant;
use crate::store::topology::{Call, Failure, Link};

/// A duration in whole milliseconds, at least 1 (a script's `PX` and its like).
pub(super) fn ms(d: Duration) -> u64 {
    d.as_millis().max(1) as u64
}

/// Run `script` with `keys` and `args` on the node that serves `keys[0]`, within `within` in all:
/// by SHA1 (`EVALSHA`), and with its text when the server does not have it yet (a new server, a
/// restart, a promoted replica: the script cache is not replicated).
///
/// `read` turns the reply into the answer: a reply it refuses (the wrong type or shape) drops
/// the connection, so no later request is answered by what that server sends next.
pub(super) fn eval<T>(
    link: &mut Link,
    within: Duration,
    script: &Script,
    text: &str,
    keys: &[&str],
    args: &[String],
    read: impl FnOnce(&Value) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let deadline = Instant::now() + within;
    let n = keys.len().to_string();
    let call = |link: &mut Link, verb: &str, body: &str| {
        let mut all: Vec<&[u8]> = vec![verb.as_bytes(), body.as_bytes(), n.as_bytes()];
        all.extend(keys.iter().map(|k| k.as_bytes()));
        all.extend(args.iter().map(|a| a.as_bytes()));
        link.call(
            deadline.saturating_duration_since(Instant::now()),
            keys[0],
            &all,
        )
    };
    let reply = match call(link, "EVALSHA", script.get_hash()) {
        Err(Failure::Call(e)) if e.code() == Some("NOSCRIPT") => call(link, "EVAL", text),
        r => r,
    }?;
    link.read(reply, read)
}

/// One call of a script.
pub(super) struct ScriptCall<'a> {
    /// Its keys; the first names the node.
    pub keys: Vec<&'a str>,
    pub args: Vec<String>,
}

/// [`eval`] for several calls of `script` at once, as one pipeline ([`Link::call_many`]): each
/// one's answer, in order. A call the server had no script for (`NOSCRIPT`) is sent again alone,
/// with the script's text.
pub(super) fn eval_many<T>(
    link: &mut Link,
    within: Duration,
    script: &Script,
    text: &str,
    calls: &[ScriptCall<'_>],
    read: impl Fn(&Value) -> Result<T, Failure>,
) -> Vec<Result<T, Failure>> {
    let deadline = Instant::now() + within;
    let counts: Vec<String> = calls.iter().map(|c| c.keys.len().to_string()).collect();
    let frames: Vec<Vec<&[u8]>> = calls
        .iter()
        .zip(&counts)
        .map(|(ScriptCall { keys, args }, n)| {
            let mut all: Vec<&[u8]> = vec![b"EVALSHA", script.get_hash().as_bytes(), n.as_bytes()];
            all.extend(keys.iter().map(|k| k.as_bytes()));
            all.extend(args.iter().map(|a| a.as_bytes()));
            all
        })
        .collect();
    let pipeline: Vec<Call<'_>> = calls
        .iter()
        .zip(&frames)
        .map(|(c, frame)| Call {
            key: c.keys[0],
            args: frame.as_slice(),
        })
        .collect();
    let replies = link.call_many(within, &pipeline);
    replies
        .into_iter()
        .zip(calls)
        .map(|(reply, ScriptCall { keys, args })| match reply {
            Err(Failure::Call(e)) if e.code() == Some("NOSCRIPT") => {
                let left = deadline.saturating_duration_since(Instant::now());
                eval(link, left, script, text, keys, args, &read)
            }
            Err(f) => Err(f),
            Ok(v) => link.read(v, &read),
        })
        .collect()
}

/// The integer a script returns; anything else is a failure of the call, never an answer.
pub(super) fn int(v: &Value, what: &'static str) -> Result<i64, Failure> {
    match v {
        Value::Int(n) => Ok(*n),
        _ => Err(Failure::shape(what)),
    }
}

/// A string or nothing (Lua's `false`).
pub(super) fn text_or_nil(v: &Value, what: &'static str) -> Result<Option<String>, Failure> {
    match v {
        Value::Nil => Ok(None),
        Value::BulkString(b) => Ok(Some(String::from_utf8_lossy(b).into_owned())),
        _ => Err(Failure::shape(what)),
    }
}
