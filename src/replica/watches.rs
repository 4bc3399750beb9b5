//! The replica's watch of its runs' locks: one [`SharedWatch`] per server (a single node), so
//! that however many runs it supervises, their locks are watched over one pair of connections
//! instead of a pair per run. A run's lock is watched from a little after its command started
//! (its `started` report, plus the watch's settling time), until its release; a change is told
//! to the run on its channel (`changed`), and the run renews at once. Locks on a Sentinel's
//! primary, a Cluster or several masters are watched by their runs, as any run's are.

use std::collections::HashMap;
use std::sync::Arc;

use crate::clock::Instant;
use crate::config::RunConfig;
use crate::handover::ReplicaSide;
use crate::log::Log;
use crate::store::lock::Held;
use crate::store::tracking::shared::SharedWatch;
use crate::store::tracking::{Listener, WatchPlan};

/// The shared watches, by server.
pub struct Watches {
    by_server: HashMap<u64, SharedWatch>,
    /// Which server each watched run's lock is on (by the run's pid).
    watching: HashMap<u32, u64>,
    log: Log,
}

impl Watches {
    pub fn new(log: &Log) -> Watches {
        Watches {
            by_server: HashMap::new(),
            watching: HashMap::new(),
            log: log.clone(),
        }
    }

    /// Whether the replica watches the lock of a run of `config` (else the run does).
    pub fn covers(config: &RunConfig) -> bool {
        matches!(config.servers.as_slice(), [one] if one.single_node())
    }

    /// Watch the lock of run `pid` (its command just started), telling it on `channel`.
    pub fn add(&mut self, pid: u32, config: &RunConfig, held: &Held, channel: &ReplicaSide) {
        let ([server], Ok(channel)) = (config.servers.as_slice(), channel.try_clone()) else {
            return;
        };
        let watch = match self.by_server.entry(server.fingerprint) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                match SharedWatch::start(server.clone(), self.log.clone()) {
                    Ok(w) => e.insert(w),
                    // The run's renewals alone watch it.
                    Err(_) => return,
                }
            }
        };
        let from = WatchPlan::due(Instant::now());
        let tell = Arc::new(TellRun { channel });
        watch.add(
            u64::from(pid),
            &held.keys.lock,
            &held.holder.value,
            from,
            tell,
        );
        self.watching.insert(pid, server.fingerprint);
    }

    /// Stop watching run `pid`'s lock (it is being released, or the run is over).
    pub fn remove(&mut self, pid: u32) {
        if let Some(server) = self.watching.remove(&pid) {
            if let Some(watch) = self.by_server.get(&server) {
                watch.remove(u64::from(pid));
            }
        }
    }
}

/// A run told of a change to its lock, on its channel.
struct TellRun {
    channel: ReplicaSide,
}

impl Listener for TellRun {
    fn changed(&self) {
        // Never blocks: a run that does not read its channel still has its renewals.
        self.channel.changed();
    }

    fn lost(&self) -> bool {
        false
    }
}
