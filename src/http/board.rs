//! The board a replica writes and its server reads: the loop's last turn (lock-free, written at
//! every turn) and the [`BoardState`] under one mutex, as typed values.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::Instant;
use crate::config::RunConfig;
use crate::fleet::metrics::{self, MetricsAttempt, OUTCOMES};
use crate::fleet::schedule::Schedule;
use crate::record::ledger::{LedgerInstant, MissedReason};
use crate::record::suspension::Suspension;
use crate::record::Stored;

/// `/healthz` answers 503 once the replica's loop has not turned for this long. The loop turns at
/// least every 2 s (it looks at the crontab's modification time), so a loop three times that
/// late is stuck.
pub const STUCK: Duration = Duration::from_secs(6);
/// `/readyz` answers 503 when Redis has not answered a heartbeat (sent every second, or more
/// rarely in fleets above 5 replicas) for this long (or for 2.5 periods, if longer), or the last
/// one failed.
pub const UNANSWERED: Duration = Duration::from_millis(2500);

/// One job of the table, as the page and the metrics show it (and where its state is read).
#[derive(Clone)]
pub struct JobLine {
    pub key: String,
    pub schedule: Schedule,
    pub config: Arc<RunConfig>,
    /// When this replica began to serve it (Unix ms).
    pub since_ms: u64,
}

/// A run of this replica, from its start.
#[derive(Clone, Copy)]
pub struct Running {
    /// Unix ms.
    pub since_ms: u64,
    pub attempt: u32,
    pub instant: Option<i64>,
}

/// The fleet-wide state of one job, read from Redis for a request.
#[derive(Clone, Default)]
pub struct Fleetwide {
    /// While `--suspend` is in force: its record.
    pub suspended: Option<Stored<Suspension>>,
    /// The ledger, newest first.
    pub ledger: Vec<LedgerInstant>,
    /// When a run last succeeded (Unix ms), by the last-run record and the ledger; `None` when
    /// neither has one.
    pub last_success: Option<u64>,
    /// With `--show-output`: the newest kept run that did not succeed, with its kept output.
    pub failed: Option<Failed>,
}

/// A run that did not succeed, as the page shows it (`--show-output`).
#[derive(Clone, Debug)]
pub struct Failed {
    /// When it started (Unix ms).
    pub started: Option<u64>,
    pub host: Option<String>,
    pub exit_status: Option<i64>,
    /// Its kept output (`--keep-output`), oldest first.
    pub output: Vec<crate::record::run::KeptLine>,
}

/// The round-trip times to Redis, as a histogram (upper bounds in seconds).
pub const RTT_BOUNDS: [f64; 10] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
];

/// What the replica's threads write and the server reads.
#[derive(Default)]
pub struct BoardState {
    pub jobs: Vec<JobLine>,
    pub max_jobs: u32,
    pub running: HashMap<String, Running>,
    /// Claims sent and not yet answered.
    pub in_flight: usize,
    pub draining: bool,
    pub claims_won: u64,
    pub claims_lost: u64,
    /// Per job: what a `--metrics-dir` file of it would hold now.
    pub files: HashMap<String, String>,
    /// Per job: its runs and attempts here, by outcome (indexed as [`OUTCOMES`]).
    pub outcomes: HashMap<String, [u64; OUTCOMES.len()]>,
    /// Calls to Redis: each one's time, by bucket of [`RTT_BOUNDS`] (the last: above them all).
    pub rtt: [u64; RTT_BOUNDS.len() + 1],
    pub rtt_sum: f64,
    pub redis_errors: u64,
    /// The last heartbeat: when it was answered, or why it failed; the heartbeats' period.
    pub answered: Option<Instant>,
    pub beat_every: Duration,
    pub failing: Option<String>,
    /// Why this replica cannot start runs (it claims nothing until it can).
    pub sick: Option<String>,
    /// Instants this replica recorded missed, by job and reason.
    pub missed: HashMap<(String, MissedReason), u64>,
    /// How far Redis's clock is ahead of this host's (ms), once measured.
    pub clock_offset_ms: Option<i64>,
}

/// The replica's board: the loop's last turn (lock-free, written every turn) and the [`BoardState`].
pub struct Board {
    born: Instant,
    /// Milliseconds from `born` to the loop's last turn.
    turned: AtomicU64,
    /// The test hook [`crate::hooks::HOLD_LOOP`]: the loop stops turning while this file exists.
    pub hold: Option<std::path::PathBuf>,
    state: Mutex<BoardState>,
}

impl Board {
    pub fn new(max_jobs: u32) -> Arc<Board> {
        Arc::new(Board {
            born: Instant::now(),
            turned: AtomicU64::new(0),
            hold: crate::hooks::file(crate::hooks::HOLD_LOOP),
            state: Mutex::new(BoardState {
                max_jobs,
                ..BoardState::default()
            }),
        })
    }

    /// The loop turned (and, with the test hook, waits while the hook's file exists).
    pub fn turned(&self) {
        if let Some(path) = &self.hold {
            while path.exists() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let ms = self.born.elapsed().as_millis() as u64;
        self.turned.store(ms, Ordering::Relaxed);
    }

    /// How long since the loop last turned.
    pub fn since_turn(&self) -> Duration {
        let at = Duration::from_millis(self.turned.load(Ordering::Relaxed));
        self.born.elapsed().saturating_sub(at)
    }

    /// The state, to read or write (a panic elsewhere never leaves it unreadable).
    pub fn state(&self) -> MutexGuard<'_, BoardState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A batch of calls to Redis took `took`.
    pub fn called(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let bucket = RTT_BOUNDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(RTT_BOUNDS.len());
        let mut s = self.state();
        s.rtt[bucket] += 1;
        s.rtt_sum += secs;
    }

    /// An attempt of KEY here ended as `attempt` says (a run's end, a lost claim, a missed
    /// instant): its outcome counted, its series updated, a run of it here over.
    pub fn attempted(&self, key: &str, host: &str, attempt: &MetricsAttempt) {
        let mut s = self.state();
        let i = OUTCOMES
            .iter()
            .position(|o| *o == attempt.outcome)
            .unwrap_or(0);
        s.outcomes.entry(key.to_string()).or_default()[i] += 1;
        if attempt.run.is_some() {
            s.running.remove(key);
        }
        let old = s.files.remove(key).unwrap_or_default();
        s.files
            .insert(key.to_string(), metrics::render(key, host, attempt, &old));
    }

    /// KEY's command started here.
    pub fn started(&self, key: &str, host: &str, running: Running) {
        let mut s = self.state();
        let old = s.files.remove(key).unwrap_or_default();
        let text = metrics::render_started(key, host, running.attempt, &old);
        s.files.insert(key.to_string(), text);
        s.running.insert(key.to_string(), running);
    }
}
