//! The cluster tests that measure time: each takes the cores for itself while it measures
//! (`common::alone`), and `scripts/test.sh` runs them after the others.

use super::*;

/// `--crontab` on a Cluster: a dead or drained replica's instant runs again on another.
#[test]
fn crontab_retries_a_dead_replicas_run_on_a_cluster() {
    replicas::retried_on_another(&cluster().url(), "cl-retry");
}

/// The lock deleted on its slot owner is noticed at once (the watch is on that node).
#[test]
fn a_deleted_lock_is_noticed_on_its_slot_owner() {
    let c = cluster();
    for key in keys_on_each_primary(c, "tracked") {
        let lock = format!("cronlock:{{{key}}}");
        let owner = c.owner(&lock);
        stopped_at_once(cronlock_at(&c.url()), &key, || owner.del(&lock));
    }
}
