//! The first step of a run a replica (`--crontab`) started: instead of taking the lock, receive
//! the lock the replica claimed, over the channel it named ([`crate::handover`]), and
//! check it against this run's own configuration. A lock that does not match is released (it is
//! ours by handover) and the command does not run. A replica claims a scheduled instant a little
//! ahead of it (`LEAD_MS` in `replica/entry.rs`), so the run waits for the instant by Redis's
//! clock (`wait_for_instant` in `run/mod.rs`): its command starts on time, never before.

use anyhow::{bail, Result};

use crate::config::RunConfig;
use crate::handover::RunSide;
use crate::log::Log;
use crate::store::keys::Keys;
use crate::store::lock::{Held, ReleaseOptions};
use crate::store::quorum::Masters;

/// The handed-over lock, the masters to keep it with, and the channel to report on.
pub(super) struct Handed {
    pub held: Held,
    pub masters: Masters,
    pub side: RunSide,
}

/// The lock the replica hands over on the channel `fd`.
pub(super) fn receive(config: &RunConfig, fd: i32, log: &Log) -> Result<Handed> {
    let mut side = RunSide::adopt(fd)?;
    let handed = side.receive(config.connect_timeout)?;
    // (Named by the KEY handed over: a lock of another KEY is released as the lock it is.)
    let keys = Keys::new(&config.prefix, &handed.key);
    let held = handed.into_held(keys);
    let why = config.mismatch(&held);
    let masters = Masters::new(&config.servers);
    if let Some(why) = why {
        let until = held.sent_at + held.ttl;
        let opts = ReleaseOptions::default();
        super::release(
            &config.servers,
            config.connect_timeout,
            Some(masters),
            &held,
            until,
            &opts,
            log,
        );
        bail!(
            "the lock the replica handed over is not this run's ({why}); not running the command"
        );
    }
    Ok(Handed {
        held,
        masters,
        side,
    })
}
