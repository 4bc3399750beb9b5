//! The fleet-wide state of the jobs (their ledgers, their suspensions) for one request: each job
//! read at most once, on the server's own links (never the claims thread's), all within a bound;
//! a job not read in time is shown as unknown.

use std::collections::HashMap;
use std::time::Duration;

use crate::clock::Instant;
use crate::store::inspect::{merge, Snapshot};
use crate::store::keys::Keys;
use crate::store::quorum::Masters;

use super::board::{Failed, Fleetwide, JobLine};

/// The longest a request waits for Redis in all.
pub const READ_WITHIN: Duration = Duration::from_millis(1500);

/// The server's links, one per server list.
pub struct Reader {
    links: HashMap<Vec<u64>, Masters>,
    /// `--show-output`: read each job's kept runs for its last failure's output.
    show_output: bool,
}

/// How many of a job's newest runs `--show-output` looks through for its last failure.
const FAILURE_AMONG: u32 = 10;

/// The newest run of the snapshot (last run, then history) that did not succeed.
fn last_failure(snap: &Snapshot) -> Option<Failed> {
    let failed = snap
        .last_run
        .iter()
        .chain(&snap.history)
        .filter_map(|r| r.ours())
        .find(|r| r.exit_status.is_some_and(|s| s != 0))?;
    Some(Failed {
        started: failed.started,
        host: failed.host.clone(),
        exit_status: failed.exit_status,
        output: failed.output.clone().unwrap_or_default(),
    })
}

/// When a run of the snapshot's KEY last succeeded (Unix ms): the last run's end when it exited
/// 0, or the newest succeeded attempt's in the ledger, whichever is later.
fn last_success(snap: &Snapshot) -> Option<u64> {
    let last_run = snap
        .last_run
        .as_ref()
        .and_then(|r| r.ours())
        .filter(|r| r.exit_status == Some(0))
        .and_then(|r| r.finished);
    let ledger = snap
        .ledger
        .iter()
        .filter_map(|l| l.entry.ours())
        .flat_map(|e| e.attempts.iter())
        .filter(|a| a.state.as_deref() == Some("succeeded"))
        .filter_map(|a| a.ended)
        .max();
    last_run.max(ledger)
}

/// What [`Reader::read`] found.
pub struct FleetRead {
    /// Each job read, by KEY.
    pub by_key: HashMap<String, Fleetwide>,
    /// A line for the first job that could not be read.
    pub trouble: Option<String>,
}

impl Reader {
    pub fn new(show_output: bool) -> Reader {
        Reader {
            links: HashMap::new(),
            show_output,
        }
    }

    /// Each job's fleet-wide state, read within [`READ_WITHIN`].
    pub fn read(&mut self, jobs: &[JobLine]) -> FleetRead {
        let until = Instant::now() + READ_WITHIN;
        let mut out = HashMap::new();
        let mut trouble = None;
        for job in jobs {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                trouble.get_or_insert_with(|| "redis did not answer in time".to_string());
                break;
            }
            let config = &job.config;
            let servers = config.servers.iter().map(|r| r.fingerprint).collect();
            let masters = self
                .links
                .entry(servers)
                .or_insert_with(|| Masters::new(&config.servers));
            let keys = Keys::new(&config.prefix, &config.key);
            let within = left.min(config.connect_timeout);
            let history = self.show_output.then_some(FAILURE_AMONG);
            let snaps = masters.snapshots(within, &keys, history);
            match merge(snaps, masters.majority()) {
                Ok(crate::store::inspect::Merged { view: snap, .. }) => {
                    out.insert(
                        job.key.clone(),
                        Fleetwide {
                            last_success: last_success(&snap),
                            failed: if self.show_output {
                                last_failure(&snap)
                            } else {
                                None
                            },
                            suspended: snap.suspended,
                            ledger: snap.ledger,
                        },
                    );
                }
                Err(e) => {
                    trouble.get_or_insert_with(|| format!("{}: {e:#}", job.key));
                }
            }
        }
        FleetRead {
            by_key: out,
            trouble,
        }
    }
}
