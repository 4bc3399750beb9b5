//! The one way the store runs a Lua script: by SHA1 (`EVALSHA`) on the node that serves its first
//! key, with its text when the server does not have it yet, within a deadline for the whole call,
//! its reply read by the caller's reader (a reply of the wrong shape drops the connection); and
//! several calls of one script as one pipeline. Every script call of `store/` goes through here.
//! A script's SHA1 is computed when cronlock is compiled ([`Script::new`] is a `const fn`).

use std::time::Duration;

use redis::Value;

use crate::clock::Instant;
use crate::store::topology::{Call, Failure, Link};

/// A Lua script: its text and the SHA1 `EVALSHA` names it by, both fixed at compile time. Hashing
/// the scripts a plain run sends (about 39 KB) when it starts cost about 0.18 ms of its CPU, some
/// 8 % of `flock`'s whole run (docs/benchmarks.md).
pub(super) struct Script {
    text: &'static str,
    sha1: [u8; 40],
}

impl Script {
    /// `text` and its SHA1; called in `static` items, so the hash is computed by the compiler.
    pub(super) const fn new(text: &'static str) -> Script {
        Script {
            text,
            sha1: sha1_hex(text.as_bytes()),
        }
    }

    /// The SHA1 in lowercase hex, as Redis names a script.
    fn sha1(&self) -> &str {
        // (Always ASCII: `sha1_hex` writes only hex digits.)
        std::str::from_utf8(&self.sha1).unwrap_or_default()
    }
}

/// SHA-1 (FIPS 180-4) of `data`, in lowercase hex: the name Redis gives a script. A `const fn`, so
/// that no run hashes its scripts again; checked against redis-rs's hash in the tests below.
const fn sha1_hex(data: &[u8]) -> [u8; 40] {
    let mut h: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];
    // The message, a 0x80 byte, zeros, and its length in bits: a whole number of 64-byte blocks.
    let total = (data.len() + 9).div_ceil(64) * 64;
    let mut block = 0;
    while block < total {
        let mut w = [0u32; 80];
        let mut t = 0;
        while t < 16 {
            let mut k = 0;
            while k < 4 {
                w[t] = (w[t] << 8) | padded_byte(data, block + t * 4 + k, total) as u32;
                k += 1;
            }
            t += 1;
        }
        while t < 80 {
            w[t] = (w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16]).rotate_left(1);
            t += 1;
        }
        let (mut a, mut b, mut c, mut d, mut e) = (h[0], h[1], h[2], h[3], h[4]);
        t = 0;
        while t < 80 {
            let (f, k) = match t / 20 {
                0 => ((b & c) | (!b & d), 0x5A82_7999),
                1 => (b ^ c ^ d, 0x6ED9_EBA1),
                2 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let next = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(w[t]);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = next;
            t += 1;
        }
        h[0] = h[0].wrapping_add(a);
        h[1] = h[1].wrapping_add(b);
        h[2] = h[2].wrapping_add(c);
        h[3] = h[3].wrapping_add(d);
        h[4] = h[4].wrapping_add(e);
        block += 64;
    }
    let mut hex = [0u8; 40];
    let mut i = 0;
    while i < 40 {
        let nibble = (h[i / 8] >> (28 - 4 * (i % 8))) & 0xf;
        hex[i] = b"0123456789abcdef"[nibble as usize];
        i += 1;
    }
    hex
}

/// Byte `i` of `data` padded to `total` bytes as SHA-1 pads it.
const fn padded_byte(data: &[u8], i: usize, total: usize) -> u8 {
    let len = data.len();
    if i < len {
        data[i]
    } else if i == len {
        0x80
    } else if i >= total - 8 {
        ((len as u64 * 8) >> ((total - 1 - i) * 8)) as u8
    } else {
        0
    }
}

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
    let reply = match call(link, "EVALSHA", script.sha1()) {
        Err(Failure::Call(e)) if e.code() == Some("NOSCRIPT") => call(link, "EVAL", script.text),
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
    calls: &[ScriptCall<'_>],
    read: impl Fn(&Value) -> Result<T, Failure>,
) -> Vec<Result<T, Failure>> {
    let deadline = Instant::now() + within;
    let counts: Vec<String> = calls.iter().map(|c| c.keys.len().to_string()).collect();
    let frames: Vec<Vec<&[u8]>> = calls
        .iter()
        .zip(&counts)
        .map(|(ScriptCall { keys, args }, n)| {
            let mut all: Vec<&[u8]> = vec![b"EVALSHA", script.sha1().as_bytes(), n.as_bytes()];
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
                eval(link, left, script, keys, args, &read)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The compile-time hash names every text as redis-rs (and Redis) would: the FIPS examples,
    /// and every length around the padding's block boundaries.
    #[test]
    fn the_sha1_is_the_one_redis_names_a_script_by() {
        assert_eq!(
            Script::new("abc").sha1(),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(
            Script::new("").sha1(),
            "da39a3ee5e6b4b0d3255bfef95601890afd80709"
        );
        let text: String = (0..300u32)
            .map(|i| char::from(b'!' + (i % 90) as u8))
            .collect();
        for len in 0..=text.len() {
            let part = &text[..len];
            let ours = sha1_hex(part.as_bytes());
            assert_eq!(
                std::str::from_utf8(&ours).unwrap(),
                redis::Script::new(part).get_hash(),
                "length {len}"
            );
        }
    }
}
