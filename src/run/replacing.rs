//! A step of a run under `--overlap replace` that took the lock from an earlier instant's run:
//! before its command starts, wait until that run is gone. The replaced run learns of it at once
//! (its lock changed hands: the lock watch), stops its command (SIGTERM, then SIGKILL after
//! `--grace`) and takes its name out of `keys.replaced` at its release. If it never does (its
//! host died or froze), its lock's own deadline bounds it: its guard stops its command before
//! that lock would have lapsed, which is `held.after` (measured from the reply, so never
//! earlier than Redis's; with the clock margin on top, as every deadline of a lock).

use std::time::Duration;

use crate::clock::Instant;
use crate::config::RunConfig;
use crate::lease::Validity;
use crate::log::Log;
use crate::signals;
use crate::store::lock::Held;
use crate::store::quorum::Masters;

/// How often the runs replaced are looked at while waiting.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// Wait until the runs `held` replaced are gone, or would be by their locks' deadlines. Ends
/// early when our own lock is lost or cronlock is asked to end (the command then does not start:
/// [`super::Run`]'s start checks both). The watchdog keeps our lock meanwhile.
pub(super) fn wait_for_replaced(config: &RunConfig, held: &Held, validity: &Validity, log: &Log) {
    let Some(after) = held.after else {
        return;
    };
    let until = after + validity.margin;
    log.info(
        "waiting_for_replaced",
        &format!(
            "lock '{}' was taken from an earlier instant's run; waiting for it to stop",
            config.key
        ),
        &[(
            "at_most_ms",
            (until.saturating_duration_since(Instant::now()).as_millis() as u64).into(),
        )],
    );
    let started = Instant::now();
    let mut masters = Masters::new(&config.servers);
    loop {
        let now = Instant::now();
        if now >= until || validity.is_lost() || signals::asked_to_end() {
            break;
        }
        let within = config.connect_timeout.min(until - now);
        if masters.replaced_gone(within, &held.keys) {
            break;
        }
        std::thread::sleep(LOOK_EVERY.min(until.saturating_duration_since(Instant::now())));
    }
    let waited = started.elapsed().as_millis() as u64;
    log.info(
        "replaced_gone",
        &format!("waited {waited} ms for the run it replaced"),
        &[("waited_ms", waited.into())],
    );
}
