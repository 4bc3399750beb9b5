//! What cronlock was asked to do, as plain values resolved once: a run ([`RunConfig`]), an
//! admin mode ([`Admin`]) or a replica serving a crontab ([`Replica`]).
//!
//! It exists so that a run can be described by something other than a command line. `cli/`
//! resolves the arguments and variables into these values, with every check done and every
//! secret file read before anything talks to Redis; a crontab line resolves into the same
//! [`RunConfig`]. Nothing below `lib.rs` sees the parsed command line, and nothing here fails:
//! a value of these types is a request cronlock can carry out as it stands.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::fleet::next::NextQuery;
pub use crate::fleet::report::Reports;
use crate::fleet::schedule::Schedule;
use crate::lease::Timing;
use crate::log::{LogFormat, Verbosity};
use crate::record::run::CommandEnd;
use crate::record::run::KeptLine;
use crate::store::lock::{Held, InstantKind, Instants, LedgerEnd, ReleaseOptions};
use crate::store::overlap::Overlap;
use crate::store::topology::Redis;

/// How many instants before the candidates a `--catch-up` firing sends for the ledger's
/// `missed` (the ledger keeps 64 instants).
const EARLIER_MAX: usize = 60;

/// What to do: one run, one admin mode, or a replica serving a crontab.
pub enum Request {
    Run(Box<RunConfig>),
    Admin(Box<Admin>),
    Crontab(Box<Replica>),
    /// `--crontab FILE --test`: the file read and checked, its jobs shown; nothing runs.
    TestCrontab(Box<Replica>),
    /// `--next CRON`: needs no Redis.
    Next(Box<NextQuery>),
}

/// `--crontab FILE`: a long-lived replica that runs the file's jobs, each instant once across
/// every replica.
#[derive(Clone)]
pub struct Replica {
    /// The file, as given (read again on SIGHUP or when it changes).
    pub file: std::path::PathBuf,
    /// Its jobs, each checked as the run it makes would check it.
    pub jobs: Vec<CronJob>,
    /// `--max-jobs`: runs this replica supervises at once; at the limit it claims nothing.
    pub max_jobs: u32,
    /// `--drain`: how long running jobs may go on after SIGTERM or SIGINT.
    pub drain: Duration,
    /// `--grace`: between SIGTERM and SIGKILL when the drain runs out.
    pub grace: Duration,
    /// `--listen`: where to serve /metrics, the probes and the status page.
    pub listen: Option<std::net::SocketAddr>,
    /// `--show-output`: the page shows each job's last failure's kept output.
    pub show_output: bool,
}

/// An option of the replica itself: `--crontab` and the options that need it. A crontab line
/// refuses it (it is no job's), and the replica keeps its variable from its runs. The list is
/// checked against the clap definition (`cli` unit tests): every option clap says needs
/// `--crontab` is here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaOption {
    /// The long flag, `--max-jobs`.
    pub flag: &'static str,
    /// Its variable, `CRONLOCK_MAX_JOBS`.
    pub variable: &'static str,
}

/// Every [`ReplicaOption`]: the one list of them.
pub const REPLICA_OPTIONS: [ReplicaOption; 6] = [
    ReplicaOption {
        flag: "--crontab",
        variable: "CRONLOCK_CRONTAB",
    },
    ReplicaOption {
        flag: "--max-jobs",
        variable: "CRONLOCK_MAX_JOBS",
    },
    ReplicaOption {
        flag: "--drain",
        variable: "CRONLOCK_DRAIN",
    },
    ReplicaOption {
        flag: "--listen",
        variable: "CRONLOCK_LISTEN",
    },
    ReplicaOption {
        flag: "--test",
        variable: "CRONLOCK_CRONTAB_TEST",
    },
    ReplicaOption {
        flag: "--show-output",
        variable: "CRONLOCK_SHOW_OUTPUT",
    },
];

/// A crontab's `NAME=value` line, as the jobs below it give it to their commands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Variable {
    pub name: String,
    pub value: String,
}

/// A crontab's `NAME=value` lines in force for a job, shared between the jobs below them.
pub type Env = Arc<Vec<Variable>>;

/// One job line of a crontab, resolved: the run `cronlock --schedule SCHEDULE [OPTIONS] KEY -c
/// COMMAND-LINE` would make, and what the replica needs to fire it.
#[derive(Clone)]
pub struct CronJob {
    /// Its line in the file (from 1), for messages.
    pub line: usize,
    pub key: String,
    pub schedule: Schedule,
    /// The line as the run's words (`--schedule SCHEDULE [OPTIONS] KEY -c COMMAND-LINE`): the
    /// job's identity. A reload keeps the state of a job whose words and variables stay the
    /// same, and replicas name the fleet they share from them. Nothing reads them again.
    pub words: Vec<String>,
    /// The run it makes, resolved once.
    pub run: JobRun,
}

impl CronJob {
    /// Whether `other` is the same job (a reload keeps its state): the same words (its KEY
    /// among them) and variables.
    pub fn same_as(&self, other: &CronJob) -> bool {
        self.words == other.words && self.run.env == other.run.env
    }
}

/// A crontab job's run, as its line resolved: what the replica claims with and checks the
/// claim against, and what its starter's child carries out. It crosses their link whole
/// (`starting/message.rs`): the run never reads the line again.
#[derive(Clone, Serialize, Deserialize)]
pub struct JobRun {
    pub config: Arc<RunConfig>,
    /// The `NAME=value` lines above it, its command's (shared with the jobs that have the same).
    pub env: Env,
    /// How much the run says (the line's `-q`, `-v`, or the replica's variables)...
    pub verbosity: Verbosity,
    /// ...and in which format.
    pub format: LogFormat,
}

/// One run of a command under a KEY's lock, fully described.
#[derive(Clone, Serialize, Deserialize)]
pub struct RunConfig {
    pub key: String,
    /// argv of the command: `[COMMAND, ARGS...]` or `["/bin/sh", "-c", SHELL_COMMAND]`.
    #[serde(with = "utf8_words")]
    pub argv: Vec<OsString>,
    /// `--prefix`: the namespace of the Redis keys.
    pub prefix: String,
    /// Where the lock lives: one topology, or the masters of a quorum.
    pub servers: Vec<Redis>,
    /// `--connect-timeout`: the budget of one Redis step (a connection, a call, the release).
    pub connect_timeout: Duration,
    /// `--ttl` and `--grace`, checked together.
    pub timing: Timing,
    /// How long to wait for the lock (`-n` already folded in: zero).
    pub wait: Duration,
    /// `--limit`: how many may hold the KEY at once.
    pub limit: u32,
    /// `--schedule`: once per scheduled instant.
    pub schedule: Option<Schedule>,
    /// `--jitter`: each instant's run starts KEY's offset within it after the instant (zero:
    /// none).
    pub jitter: Duration,
    /// `--overlap`: what an instant does that finds the lock held by an earlier one.
    pub overlap: Overlap,
    /// Set by a replica (`--crontab`) for the runs it starts: the descriptor of the channel on
    /// which it hands over the lock it claimed ([`crate::handover`]). The run then takes
    /// nothing itself. A descriptor is this process's: it never crosses to another.
    #[serde(skip)]
    pub handover: Option<i32>,
    /// `--catch-up`: the window in which a missed, failed or abandoned instant still runs.
    pub catch_up: Option<Duration>,
    /// `--retries`: more attempts at a failed or abandoned instant (0 without `--catch-up`).
    pub retries: u32,
    /// `-E`/`--conflict-exit-code`: the status when the lock is busy.
    pub conflict_exit_code: u8,
    /// `--max-runtime`, none when 0.
    pub max_runtime: Option<Duration>,
    /// `--min-hold`: keep the lock at least this long after it was taken.
    pub min_hold: Duration,
    /// `--history`: how many run records to keep.
    pub history: u32,
    /// `--history-ttl`: how long run records live.
    pub history_ttl: Option<Duration>,
    /// `--keep-output`: how much of the command's output its run record keeps.
    pub keep_output: KeepOutput,
    pub reports: Reports,
}

/// A command's words as they cross to another process: text (a crontab's are; it is UTF-8).
mod utf8_words {
    use std::ffi::OsString;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(words: &[OsString], s: S) -> Result<S::Ok, S::Error> {
        let text = words
            .iter()
            .map(|w| w.to_str())
            .collect::<Option<Vec<&str>>>()
            .ok_or_else(|| serde::ser::Error::custom("a command word that is not UTF-8"))?;
        text.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<OsString>, D::Error> {
        let text = Vec::<String>::deserialize(d)?;
        Ok(text.into_iter().map(OsString::from).collect())
    }
}

/// `--keep-output SIZE[,all]`: the last `bytes` of a run's output, kept with its record in
/// Redis for a run that did not succeed (`successes`: for every run).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeepOutput {
    pub bytes: usize,
    pub successes: bool,
}

impl Default for KeepOutput {
    /// 4 KiB of a run that did not succeed.
    fn default() -> KeepOutput {
        KeepOutput {
            bytes: 4096,
            successes: false,
        }
    }
}

impl KeepOutput {
    /// Whether a run that ended with `status` (after how it ended) keeps its output.
    pub fn keeps(&self, succeeded: bool) -> bool {
        self.bytes > 0 && (self.successes || !succeeded)
    }
}

impl RunConfig {
    /// What the release of a run that held `held` records, its command having ended so
    /// (`end`): the run record, with the lines `--keep-output` kept (`kept`, asked for only when
    /// it keeps them for this ending), the ledger's end of the instant, and `--min-hold`. The
    /// same for a replica that releases for its run and for a run that releases by itself.
    pub fn release_options(
        &self,
        held: &Held,
        end: &CommandEnd,
        kept: impl FnOnce() -> Vec<KeptLine>,
    ) -> ReleaseOptions {
        let output = self.keep_output.keeps(end.succeeded()).then(kept);
        let record = crate::fleet::record::run_record(held, end, output);
        ReleaseOptions {
            hold_until: (!self.min_hold.is_zero()).then(|| held.sent_at + self.min_hold),
            record: Some(crate::record::to_text(&record)),
            history: self.history,
            record_ttl: self.history_ttl,
            ledger: held.instant.map(|instant| LedgerEnd {
                instant,
                exit: end.exit.code(),
                interrupted: end.interrupted,
            }),
        }
    }

    /// How a lock a replica claimed differs from what a run of this configuration holds, if it
    /// does (another KEY, TTL or `--limit`, or an instant its schedule never names): the run
    /// refuses it, and a replica whose crontab changed while the claim was in flight undoes it.
    pub fn mismatch(&self, held: &Held) -> Option<String> {
        if held.keys.name != self.key {
            return Some(format!("KEY '{}', not '{}'", held.keys.name, self.key));
        }
        if held.ttl != self.timing.ttl {
            return Some(format!(
                "a TTL of {} ms, not {} ms",
                held.ttl.as_millis(),
                self.timing.ttl.as_millis()
            ));
        }
        if held.limit != self.limit {
            return Some(format!("--limit {}, not {}", held.limit, self.limit));
        }
        match (held.instant, &self.schedule) {
            (None, None) => None,
            (Some(_), Some(_)) if held.manual => None,
            (Some(at), Some(s)) if s.next_after(at - 1) == Some(at) => None,
            (Some(at), Some(_)) => Some(format!("an instant ({at}) its schedule never names")),
            (Some(_), None) => Some("an instant, and this run has no --schedule".into()),
            (None, Some(_)) => Some("no instant, and this run has --schedule".into()),
        }
    }

    /// With `--schedule`: what the acquire chooses the run's instant from. `fired_for` is the
    /// instant a replica claims: without `--catch-up` the claim is for that instant only, however
    /// late it is sent (a loaded replica), instead of the one nearest to Redis's clock.
    pub fn instants(&self, fired_for: Option<i64>) -> Option<Instants> {
        let s = self.schedule.as_ref()?;
        let now = crate::clock::unix_millis() as i64;
        let candidates = match (fired_for, self.catch_up) {
            (Some(at), None) => vec![at],
            _ => s.candidates(now),
        };
        // With --catch-up, the instants before those inside the window: the ledger records the
        // ones nobody ran as missed.
        let earlier = match (self.catch_up, candidates.first()) {
            (Some(window), Some(&first)) => {
                s.earlier(first, now - window.as_millis() as i64, EARLIER_MAX)
            }
            _ => Vec::new(),
        };
        Some(Instants {
            schedule: s.text.clone(),
            candidates,
            catch_up: self.catch_up,
            retries: self.retries,
            earlier,
            ledger_ttl: self.history_ttl,
            kind: InstantKind::Scheduled,
            overlap: self.overlap,
        })
    }

    /// What the acquire script takes for an instant of `kind` (`at`: the schedule's instant the
    /// replica fired for, or the manual one; unused for the one that waits).
    pub fn instants_of(&self, kind: InstantKind, at: i64) -> Option<Instants> {
        match kind {
            InstantKind::Scheduled => self.instants(Some(at)),
            InstantKind::Manual => self.manual_instants(at),
            InstantKind::Queued => self.queued_instants(),
        }
    }

    /// What the acquire script takes for the instant that waits under `--overlap queue`.
    pub fn queued_instants(&self) -> Option<Instants> {
        let mut instants = self.manual_instants(0)?;
        instants.candidates.clear();
        instants.kind = InstantKind::Queued;
        Some(instants)
    }

    /// KEY's offset after each instant (`--jitter`; zero without).
    pub fn jitter_offset(&self) -> Duration {
        crate::fleet::spread::offset(&self.key, self.jitter)
    }

    /// What the acquire script takes for the manual instant `at` (`--trigger`): that one, run
    /// once (again after a failure, with `--retries`) while its request is there.
    pub fn manual_instants(&self, at: i64) -> Option<Instants> {
        let s = self.schedule.as_ref()?;
        Some(Instants {
            schedule: s.text.clone(),
            candidates: vec![at],
            catch_up: self.catch_up,
            retries: self.retries,
            earlier: Vec::new(),
            ledger_ttl: self.history_ttl,
            kind: InstantKind::Manual,
            overlap: self.overlap,
        })
    }

    /// The command as one line for people (the holder's `command` field).
    pub fn command_line(&self) -> String {
        self.argv
            .iter()
            .map(|a| {
                let a = a.to_string_lossy();
                if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "'\"\\$`".contains(c))
                {
                    format!("'{}'", a.replace('\'', r"'\''"))
                } else {
                    a.into_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// An admin mode and what it needs.
pub struct Admin {
    pub mode: AdminMode,
    pub prefix: String,
    pub servers: Vec<Redis>,
    /// `--connect-timeout`: the budget of each step.
    pub timeout: Duration,
    /// `--json` output.
    pub json: bool,
}

/// The admin modes.
pub enum AdminMode {
    /// `--status KEY`, with `--history [N]` (`Some(None)`: all that are kept).
    Status {
        key: String,
        history: Option<Option<u32>>,
        schedule: Option<Schedule>,
        /// `--jitter`: KEY's offset after each instant (zero: none).
        offset: Duration,
    },
    /// `--check KEY`.
    Check {
        key: String,
        max_age: Option<Duration>,
        schedule: Option<Schedule>,
    },
    /// `--list`.
    List,
    /// `--force-release KEY [--token T]`.
    ForceRelease { key: String, token: Option<String> },
    /// `--trigger KEY [--reason TEXT] [--wait DURATION] [-E N]`.
    Trigger {
        key: String,
        reason: Option<String>,
        /// Wait this long for the run's end.
        wait: Option<Duration>,
        /// `-E`: the status of a skipped instant.
        conflict: u8,
    },
    /// `--suspend KEY [--reason TEXT] [--for DURATION]`.
    Suspend {
        key: String,
        reason: Option<String>,
        /// `--for`: the suspension ends by itself this long after it began.
        lasting: Option<Duration>,
    },
    /// `--resume KEY`.
    Resume { key: String },
}
