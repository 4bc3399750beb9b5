//! The replica's claims: a due instant is claimed by the replica itself, with the same atomic
//! acquire a run makes (`acquire.lua`: the ledger, `--catch-up`, `--retries`, suspension), on a
//! thread of its own with long-lived connections (one set per distinct server list). The loop
//! only sends asks and reads answers, so a hung Redis never stops it from reaping, draining,
//! reloading or answering signals: a claim waits at most `--connect-timeout`.
//!
//! This file says what one ask is and how it is carried out; the thread that carries them out,
//! in batches, is [`super::claimer`].
//!
//! A claim that wins is a lock held by this replica until its run takes it over. A claim that
//! does not become a run (the spawn failed, the replica drains, the run died before starting its
//! command) is undone, not spent: the lock, the schedule record and the ledger entry it wrote are
//! rolled back (`abandon.lua`), so the instant can run elsewhere at once.
//!
//! An instant another replica owns is checked after [`crate::replica::fleets::FALLBACK_MS`]: one
//! read-only call per fleet for all of them (`claimed.lua`) says which are decided; the others
//! are claimed here (ownership is a preference, never a condition).
//! A run's release comes back here too: the run asks, this thread releases on its link and
//! answers on the run's channel; and the renewals of the runs' locks, those due together as one
//! pipeline per server list, the loop telling each run how its renewal went: so a run opens no
//! connection of its own.

use std::collections::HashMap;

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;
use crate::config::RunConfig;
use crate::handover::{ReleaseAnswer, ReplicaSide};
use crate::record::ledger::MissedReason;
use crate::record::suspension::Suspension;
use crate::record::Stored;
use crate::store::acquire::Acquire;
use crate::store::acquire::AcquireOutcome;
use crate::store::holder::Holder;
use crate::store::keys::Keys;
use crate::store::lock::{Held, InstantKind, KeyInstant, ReleaseOptions, Released, Undo};
use crate::store::members::{FleetView, Heartbeat};
use crate::store::quorum::{Masters, Refused, RoundOutcome};
use crate::store::topology::Failure;

use super::owed::{Owed, OwedRelease};
use super::skew::{CallWindow, ClockSample};

/// What the loop asks of the claim thread.
pub enum Ask {
    /// Claim `instant` of KEY (with `--catch-up`, Redis picks the instant due).
    Claim {
        key: String,
        config: Arc<RunConfig>,
        instant: i64,
        /// The schedule's, a manual one (`--trigger`), or the one that waits (`--overlap queue`:
        /// `instant` is then 0).
        kind: InstantKind,
    },
    /// A won claim that did not become a run: undo it (`RollBack`: the instant can be claimed
    /// again), or end its attempt `Abandoned` (its run died after starting, its lock lapsed).
    Unclaim {
        config: Arc<RunConfig>,
        held: Box<Held>,
        undo: Undo,
    },
    /// Which of these instants of one group are decided already.
    Check {
        config: Arc<RunConfig>,
        items: Vec<ToCheck>,
    },
    /// A run asked for its lock to be released, recording `opts` (its end): release it with the
    /// holder value this replica claimed with, and answer on the run's channel. `urgent`: an
    /// instant waits for room here, so the release may not wait for others to go with it.
    ReleaseRun {
        config: Arc<RunConfig>,
        held: Box<Held>,
        opts: Box<ReleaseOptions>,
        reply: ReplicaSide,
        urgent: bool,
    },
    /// Renew run `pid`'s lock, as it asked, with the holder value this replica claimed with
    /// (with the other renewals asked together, one pipeline per server list, before any
    /// release of the same batch).
    RenewRun {
        config: Arc<RunConfig>,
        pid: u32,
        held: Box<Held>,
    },
    /// Record an instant this replica gave up missed, for `reason`, unless the ledger has it.
    Missed {
        key: String,
        config: Arc<RunConfig>,
        instant: i64,
        reason: MissedReason,
    },
    /// This replica's heartbeat where `config`'s jobs are claimed: live for `lapse` more (zero:
    /// leaving), full or not, with its clock's offset from Redis's once measured.
    Beat {
        config: Arc<RunConfig>,
        group: Group,
        id: String,
        lapse: Duration,
        full: bool,
        offset: Option<i64>,
    },
}

/// Where a job's claims go (its servers and prefix) and which fleet ranks them: the replicas
/// serving the same jobs there. Replicas of different crontabs sharing a Redis never rank each
/// other (one would leave the other's instants to a replica that does not have the job).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Group {
    pub servers: Vec<u64>,
    pub prefix: String,
    /// A hash of the jobs this replica serves there (see `table.rs`); 0 until the table sets it.
    pub fleet: u64,
}

/// A group the jobs claim in, with one of its jobs' configuration to reach its servers.
#[derive(Clone)]
pub struct Reached {
    pub group: Group,
    pub config: Arc<RunConfig>,
}

/// An instant of KEY to check: is it decided already (its run started, or it was recorded)?
#[derive(Debug, Clone)]
pub struct ToCheck {
    pub key: String,
    pub instant: i64,
}

/// A checked instant, and whether it was decided.
#[derive(Debug, Clone)]
pub struct CheckedInstant {
    pub key: String,
    pub instant: i64,
    pub decided: bool,
}

/// The group of `config`'s job, its fleet not yet known.
pub fn group(config: &RunConfig) -> Group {
    Group {
        servers: config.servers.iter().map(|r| r.fingerprint).collect(),
        prefix: config.prefix.clone(),
        fleet: 0,
    }
}

/// How a claim went.
pub enum ClaimVerdict {
    Won(Box<Held>),
    /// Held elsewhere: the holder's value, and when its lock lapses unless renewed.
    Busy {
        holder: String,
        expires_in: Option<Duration>,
    },
    /// The instant's run already started (elsewhere, or a later one did).
    AlreadyRan,
    /// Claimed before Redis's clock reached the instant: Redis's clock as the reply told it.
    Early {
        clock: Option<ClockSample>,
    },
    /// KEY is suspended (`--suspend`): the record; the instant is recorded skipped.
    Suspended(Stored<Suspension>),
    /// Redis could not be asked, or refused: the line saying why.
    Failed(String),
}

/// What the thread tells the loop.
pub enum Answer {
    /// How a claim went.
    Claim {
        key: String,
        instant: i64,
        kind: InstantKind,
        verdict: ClaimVerdict,
        /// The job's configuration when the claim was sent (a reload may have removed it since).
        config: Arc<RunConfig>,
    },
    /// Whether a given-up instant was recorded missed (false: the ledger had it), or why not.
    Missed {
        key: String,
        config: Arc<RunConfig>,
        instant: i64,
        reason: MissedReason,
        recorded: Result<bool, String>,
    },
    /// Which of the checked instants are decided (their run started, or they were recorded);
    /// an instant that could not be checked is not.
    Checked { items: Vec<CheckedInstant> },
    /// An undo went through (`Ok`), or why not.
    Unclaimed {
        key: String,
        result: Result<(), String>,
    },
    /// How run `pid`'s renewal sent at `sent` went: confirmed (`true`), not ours, or why it
    /// failed.
    Renewed {
        pid: u32,
        sent: Instant,
        result: Result<bool, String>,
    },
    /// What came of a release owed (see [`super::owed`]): KEY's, for its instant.
    Owed {
        key: String,
        instant: Option<i64>,
        end: OwedEnd,
    },
    /// A heartbeat's view of the group's replicas, or why there is none; and Redis's clock as
    /// it told it.
    View {
        group: Group,
        view: Result<FleetView, String>,
        clock: Option<ClockSample>,
    },
}

/// The links of the claims thread: one set per distinct server list.
pub(super) type Links = HashMap<Vec<u64>, Masters>;

/// What the claims thread keeps between asks: its links, the releases it owes (Redis did not
/// take them yet), and the runs whose release it was asked, by holder token, until their locks
/// would lapse: a renewal of one of them that comes after is refused (it would keep a lock
/// released with `--min-hold`, or released by the run itself, for a whole TTL).
#[derive(Default)]
pub(super) struct Desk {
    pub links: Links,
    pub owed: Owed,
    pub released: Releasing,
}

/// The runs whose release the claims thread was asked, by holder token, until their locks
/// would lapse.
#[derive(Default)]
pub(super) struct Releasing(HashMap<String, Instant>);

impl Releasing {
    /// The run holding `held` asked for its release.
    pub(super) fn asked(&mut self, held: &Held) {
        let now = Instant::now();
        self.0.retain(|_, until| *until > now);
        self.0.insert(held.holder.token.clone(), now + held.ttl * 2);
    }

    /// Whether the run holding `held` asked for its release already.
    pub(super) fn has(&self, held: &Held) -> bool {
        self.0.contains_key(&held.holder.token)
    }
}

/// How an owed release ended.
pub enum OwedEnd {
    /// Redis took it.
    Written,
    /// Given up (the line says why): the instant reads abandoned once its lock lapsed.
    Dropped(String),
}

/// Do what `ask` says on its servers' links; what to tell the loop.
pub(super) fn carry_out(desk: &mut Desk, ask: Ask) -> Vec<Answer> {
    let links = &mut desk.links;
    let answer = match ask {
        Ask::Claim {
            key,
            config,
            instant,
            kind,
        } => {
            let verdict = claim(masters(links, &config), &config, instant, kind);
            Some(Answer::Claim {
                key,
                instant,
                kind,
                verdict,
                config,
            })
        }
        Ask::Missed {
            key,
            config,
            instant,
            reason,
        } => {
            let keys = Keys::new(&config.prefix, &config.key);
            let recorded = masters(links, &config)
                .record_missed(config.connect_timeout, &keys, instant, reason.name())
                .map_err(|e| e.to_string());
            Some(Answer::Missed {
                key,
                config,
                instant,
                reason,
                recorded,
            })
        }
        Ask::Check { config, items } => Some(check(links, &config, items)),
        Ask::Beat {
            config,
            group,
            id,
            lapse,
            full,
            offset,
        } => {
            let fleet = format!("{:016x}", group.fleet);
            let beat = Heartbeat {
                prefix: &config.prefix,
                fleet: &fleet,
                id: &id,
                lapse,
                full,
                offset,
            };
            let window = CallWindow::start();
            let view = masters(links, &config)
                .beat(config.connect_timeout, beat)
                .map_err(|e| e.to_string());
            let window = window.ended();
            let clock = view
                .as_ref()
                .ok()
                .and_then(|v| ClockSample::of(v.redis_ms, window));
            Some(Answer::View { group, view, clock })
        }
        Ask::Unclaim { config, held, undo } => {
            let result = masters(links, &config)
                .unclaim(config.connect_timeout, &held, undo)
                .map(drop)
                .map_err(|e| e.to_string());
            Some(Answer::Unclaimed {
                key: config.key.clone(),
                result,
            })
        }
        Ask::RenewRun { config, pid, held } => {
            let sent = Instant::now();
            if desk.released.has(&held) {
                return vec![refused_renewal(pid, sent)];
            }
            let result = masters(links, &config)
                .renew(config.connect_timeout, &held)
                .map_err(|e| e.to_string());
            Some(Answer::Renewed { pid, sent, result })
        }
        Ask::ReleaseRun {
            config,
            held,
            opts,
            mut reply,
            ..
        } => {
            desk.released.asked(&held);
            let released = masters(links, &config).release(config.connect_timeout, &held, &opts);
            let release = OwedRelease {
                config,
                held,
                opts,
                since: Instant::now(),
            };
            return settle_release(&mut desk.owed, release, Some(&mut reply), released);
        }
    };
    answer.into_iter().collect()
}

/// The answer to a renewal of a run that asked for its release already: refused.
pub(super) fn refused_renewal(pid: u32, sent: Instant) -> Answer {
    Answer::Renewed {
        pid,
        sent,
        result: Err("the run asked for its release".into()),
    }
}

/// Which of `items` are decided already, as one call per fleet.
fn check(links: &mut Links, config: &RunConfig, items: Vec<ToCheck>) -> Answer {
    let keys: Vec<Keys> = items
        .iter()
        .map(|i| Keys::new(&config.prefix, &i.key))
        .collect();
    let asked: Vec<KeyInstant<'_>> = keys
        .iter()
        .zip(&items)
        .map(|(keys, i)| KeyInstant {
            keys,
            instant: i.instant,
        })
        .collect();
    let decided = masters(links, config).claimed(config.connect_timeout, &asked);
    let items = items
        .into_iter()
        .zip(decided)
        .map(|(i, decided)| CheckedInstant {
            key: i.key,
            instant: i.instant,
            decided,
        })
        .collect();
    Answer::Checked { items }
}

/// The links for `config`'s servers, opened on first use and kept.
pub(super) fn masters<'a>(links: &'a mut Links, config: &RunConfig) -> &'a mut Masters {
    let id = group(config).servers;
    links
        .entry(id)
        .or_insert_with(|| Masters::new(&config.servers))
}

/// One claim: the acquire the run would have made, for `instant`.
fn claim(
    masters: &mut Masters,
    config: &RunConfig,
    instant: i64,
    kind: InstantKind,
) -> ClaimVerdict {
    let keys = Keys::new(&config.prefix, &config.key);
    let holder = Holder::new(&config.command_line());
    let instants = config.instants_of(kind, instant);
    let ask = Acquire {
        keys: &keys,
        holder: &holder,
        ttl: config.timing.ttl,
        instants: instants.as_ref(),
        limit: config.limit,
    };
    let window = CallWindow::start();
    let outcome = masters.acquire(config.connect_timeout, ask);
    verdict(outcome, config, window.ended())
}

/// What an acquisition round (asked in `window`) came to, for the loop.
pub(super) fn verdict(
    outcome: RoundOutcome,
    config: &RunConfig,
    window: CallWindow,
) -> ClaimVerdict {
    match outcome {
        Ok(AcquireOutcome::Held(held)) => ClaimVerdict::Won(held),
        Ok(AcquireOutcome::Busy {
            expires_in, holder, ..
        }) => ClaimVerdict::Busy { holder, expires_in },
        Ok(AcquireOutcome::AlreadyRan { .. }) => ClaimVerdict::AlreadyRan,
        Ok(AcquireOutcome::Early { instant, ahead }) => ClaimVerdict::Early {
            clock: ClockSample::of(instant - ahead.as_millis() as i64, window),
        },
        Ok(AcquireOutcome::Suspended { record, .. }) => ClaimVerdict::Suspended(record),
        Ok(AcquireOutcome::Mismatch(other)) => ClaimVerdict::Failed(format!(
            "lock '{}' is held with --limit {other} by its current holders",
            config.key
        )),
        Err(Refused { text, .. }) => ClaimVerdict::Failed(text),
    }
}

/// What came of a run's release (`reply`: the run's channel, when it asked now; none for a
/// release owed since): done, owed (a transient failure: kept, to be carried out again), or
/// failed for good. The run, if it asked now, is told (it waits for this; a run that is gone no
/// longer needs it); the loop is told what came of a release owed before, and of those dropped
/// to keep the owed ones bounded.
pub(super) fn settle_release(
    owed: &mut Owed,
    release: OwedRelease,
    reply: Option<&mut ReplicaSide>,
    released: Result<Released, Failure>,
) -> Vec<Answer> {
    let was_owed = reply.is_none();
    let ended = |release: &OwedRelease, end: OwedEnd| Answer::Owed {
        key: release.config.key.clone(),
        instant: release.held.instant,
        end,
    };
    let answer = match &released {
        Ok(r) => ReleaseAnswer::Done(*r),
        Err(e) if e.transient() => ReleaseAnswer::Owed(e.to_string()),
        Err(e) => ReleaseAnswer::Failed(e.to_string()),
    };
    if let Some(reply) = reply {
        reply.released(&answer);
    }
    match answer {
        ReleaseAnswer::Done(_) => was_owed
            .then(|| ended(&release, OwedEnd::Written))
            .into_iter()
            .collect(),
        ReleaseAnswer::Owed(_) => owed
            .keep(release)
            .iter()
            .map(|r| ended(r, OwedEnd::Dropped("too many run ends owed at once".into())))
            .collect(),
        ReleaseAnswer::Failed(why) => was_owed
            .then(|| ended(&release, OwedEnd::Dropped(why)))
            .into_iter()
            .collect(),
    }
}
