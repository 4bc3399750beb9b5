//! The replicated tests that measure time: each takes the cores for itself while it measures
//! (`common::alone`), and `scripts/test.sh` runs them after the others.

use super::*;

/// `--crontab` through the sentinels: a dead or drained replica's instant runs again on another.
#[test]
fn crontab_retries_a_dead_replicas_run_through_the_sentinels() {
    replicas::retried_on_another(&topology().url(SERVICE), "sn-retry");
}

/// The lock deleted on the primary the sentinels name is noticed at once.
#[test]
fn a_deleted_lock_is_noticed_on_the_named_primary() {
    let t = topology();
    let took = stopped_at_once(cronlock_at(&t.url(SERVICE)), "tracked", || {
        t.primary.del("cronlock:{tracked}")
    });
    eprintln!("sentinel: stopped {took:?} after the DEL");
}
