//! The crontab tests that measure time: each takes the cores for itself while it measures
//! (`common::alone`), and `scripts/test.sh` runs them after the others.

use super::*;

/// A replica SIGKILLed, or SIGTERMed with a run longer than --drain: its instant runs again on
/// another replica within TTL + 2 s.
#[test]
fn a_dead_or_drained_replicas_run_is_retried_on_another() {
    replicas::retried_on_another(&Redis::start().url(), "retry");
}
