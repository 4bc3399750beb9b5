//! `--suspend KEY [--reason TEXT]` and `--resume KEY`: the fleet-wide switch that stops a job
//! from running anywhere (Kubernetes' `suspend` for a job every host fires), without touching a
//! single crontab. The record (who, where, since when, why) lives with KEY in Redis; every
//! acquire reads it (see `acquire.lua`), so a firing skips with the `-E` status, and an instant that
//! passes meanwhile is recorded `skipped` and never caught up. A running command is not stopped.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{anyhow, Result};
use serde_json::{json, Value};

use crate::fleet::describe::{describe_suspension, suspension_json};
use crate::host;
use crate::record::suspension::Suspension;
use crate::record::Stored;
use crate::store::keys::Keys;
use crate::store::quorum::Masters;

/// The answer of a majority of masters (the first that answered stands for them), or the first
/// error when too few answered.
pub(crate) fn majority<T>(masters: &Masters, mut answers: Vec<Result<T>>, what: &str) -> Result<T> {
    let ok = answers.iter().filter(|a| a.is_ok()).count();
    if ok >= masters.majority() {
        let first = answers
            .iter()
            .position(|a| a.is_ok())
            .expect("one answered");
        return answers.swap_remove(first);
    }
    let first = answers
        .into_iter()
        .find_map(Result::err)
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    if masters.len() == 1 {
        return Err(anyhow!(first));
    }
    Err(anyhow!(
        "cannot {what}: only {ok} of {} masters answered, {} needed ({first})",
        masters.len(),
        masters.majority()
    ))
}

/// What `--suspend` asks for: why, and for how long (`None`: until `--resume`).
pub struct SuspendAsked<'a> {
    pub reason: Option<&'a str>,
    pub lasting: Option<Duration>,
}

/// `--suspend KEY [--reason TEXT] [--for DURATION]`.
pub fn suspend(
    masters: &mut Masters,
    within: Duration,
    keys: &Keys,
    asked: &SuspendAsked,
    as_json: bool,
) -> Result<String> {
    let record = crate::record::to_text(&Suspension {
        host: Some(host::hostname()),
        reason: Some(asked.reason.unwrap_or("").to_string()),
        since: None,
        until: None,
        user: Some(host::user()),
        rest: Default::default(),
    });
    let lasting = asked.lasting.unwrap_or_default();
    let answers = masters.suspend(within, keys, &record, lasting);
    let crate::store::inspect::Suspended { before, now } =
        majority(masters, answers, &format!("suspend lock '{}'", keys.name))?;
    let now: Stored<Suspension> = Stored::read(&now);
    let mut out = String::new();
    if as_json {
        let doc = json!({
            "key": keys.name,
            "suspended": true,
            "was_suspended": before.is_some(),
            "suspension": suspension_json(&now),
        });
        w!(out, "{doc}");
        return Ok(out);
    }
    if before.is_some() {
        w!(
            out,
            "lock '{}' was already suspended; the record now says:",
            keys.name
        );
    }
    let ends = match now.ours().and_then(|s| s.until) {
        Some(_) => "until then (or cronlock --resume {KEY})",
        None => "until cronlock --resume {KEY}",
    };
    w!(
        out,
        "lock '{}' is suspended {}; every firing skips {}",
        keys.name,
        describe_suspension(&now),
        ends.replace("{KEY}", &keys.name)
    );
    Ok(out)
}

/// `--resume KEY`.
pub fn resume(
    masters: &mut Masters,
    within: Duration,
    keys: &Keys,
    as_json: bool,
) -> Result<String> {
    let answers = masters.resume(within, keys);
    // With several masters: the record of any that had one (a minority may have missed it).
    let record: Option<Stored<Suspension>> = answers
        .iter()
        .find_map(|a| a.as_ref().ok().cloned().flatten())
        .map(|r| Stored::read(&r));
    majority(
        masters,
        answers.into_iter().map(|a| a.map(|_| ())).collect(),
        &format!("resume lock '{}'", keys.name),
    )?;
    let mut out = String::new();
    if as_json {
        let doc = json!({
            "key": keys.name,
            "resumed": record.is_some(),
            "suspension": record.as_ref().map(suspension_json).unwrap_or(Value::Null),
        });
        w!(out, "{doc}");
        return Ok(out);
    }
    match record {
        Some(r) => w!(
            out,
            "lock '{}' resumed; it was suspended {}; the instants that passed meanwhile stay \
             skipped",
            keys.name,
            describe_suspension(&r)
        ),
        None => w!(out, "lock '{}' was not suspended", keys.name),
    }
    Ok(out)
}
