//! The first step of a run: ask for the lock (waiting as `--wait` says, for the instant
//! `--schedule` and `--catch-up` choose), and the lines that step logs: busy, already ran,
//! acquired.

use std::time::Duration;

use anyhow::Result;

use crate::clock::Instant;
use crate::config::RunConfig;
use crate::duration::Span;
use crate::exit::Exit;
use crate::fleet::describe;
use crate::log::Log;
use crate::record::suspension::Suspension;
use crate::record::Stored;
use crate::signals;
use crate::store::keys::Keys;
use crate::store::lock::Held;
use crate::store::quorum::Masters;
use crate::store::wait::{self, Acquired};

/// A lock granted, with the masters that granted it (to renew and release it with).
pub(super) struct Granted {
    pub held: Held,
    pub masters: Masters,
}

/// What asking for the lock came to.
pub(super) enum Taken {
    /// Ours.
    Held(Box<Granted>),
    /// The run does not start (busy, already ran, suspended, a signal), its reason logged: the
    /// exit status.
    NotRun(Exit),
}

/// Ask for the lock (waiting as `--wait` says). An error is our own failure (125).
/// A suspended KEY's firing notes when the suspension began in `suspended` (for the metrics).
pub(super) fn take(config: &RunConfig, log: &Log, suspended: &mut Option<u64>) -> Result<Taken> {
    let keys = Keys::new(&config.prefix, &config.key);
    let command = config.command_line();
    let asked = Instant::now();
    let instants = match jittered(config) {
        Jittered::Now => config.instants(None),
        Jittered::For(at) => config.instants(Some(at)),
        Jittered::Signalled(sig) => {
            log.info(
                "signal",
                &format!(
                    "received {} while waiting for --jitter's offset; not running the command",
                    signals::name(sig)
                ),
                &[("signal", sig.into())],
            );
            return Ok(Taken::NotRun(Exit::Signal(sig)));
        }
    };
    let ask = wait::AcquireRequest {
        ttl: config.timing.ttl,
        wait: queue_wait(config),
        instants,
        limit: config.limit,
    };
    let mut masters = Masters::new(&config.servers);
    let exit = match wait::acquire(&mut masters, &keys, &command, ask, log)? {
        Acquired::Held(held) => {
            return Ok(Taken::Held(Box::new(Granted {
                held: *held,
                masters,
            })))
        }
        Acquired::Busy { holder, expires_in } => {
            busy(config, &holder, expires_in, asked.elapsed(), log);
            Exit::Conflict(config.conflict_exit_code)
        }
        Acquired::AlreadyRan { instant, ran } => {
            already_ran(config, instant, ran, log);
            Exit::Conflict(config.conflict_exit_code)
        }
        Acquired::NotDue { instant, ahead } => {
            not_due(config, instant, ahead, log);
            Exit::Conflict(config.conflict_exit_code)
        }
        Acquired::Suspended { record, instant } => {
            say_suspended(config, &record, instant, log);
            *suspended = Some(describe::suspended_since(&record).unwrap_or(0));
            Exit::Conflict(config.conflict_exit_code)
        }
        Acquired::Signalled(sig) => {
            log.info(
                "signal",
                &format!(
                    "received {} while waiting; not running the command",
                    signals::name(sig)
                ),
                &[("signal", sig.into())],
            );
            Exit::Signal(sig)
        }
    };
    Ok(Taken::NotRun(exit))
}

/// How long a firing waits for the lock: `--wait`; under `--overlap queue` at least a period of
/// the schedule, so the instant that waits starts when the run before it ends (one that waits
/// longer is started by the first firing that finds the lock free: `acquire.lua`).
fn queue_wait(config: &RunConfig) -> Duration {
    let Some(schedule) = config.schedule.as_ref().filter(|_| config.overlap.waits()) else {
        return config.wait;
    };
    let now = crate::clock::unix_millis() as i64;
    let period = schedule
        .next_after(now)
        .and_then(|a| Some(schedule.next_after(a)? - a))
        .unwrap_or(60_000);
    config.wait.max(Duration::from_millis(period.max(0) as u64))
}

/// What `--jitter` made of a firing.
enum Jittered {
    /// No offset (or `--catch-up`, whose instant Redis picks): ask now, as without it.
    Now,
    /// Waited until KEY's offset after the instant the host fired for: ask for that one.
    For(i64),
    /// A signal ended the wait.
    Signalled(libc::c_int),
}

/// With `--jitter`, wait until KEY's offset after the instant this host fired for (the one
/// nearest its clock), answering signals. With `--catch-up` the wait is the same, and Redis then
/// picks the instant due, as it does without a jitter.
fn jittered(config: &RunConfig) -> Jittered {
    let offset = config.jitter_offset();
    let Some(schedule) = config.schedule.as_ref().filter(|_| !offset.is_zero()) else {
        return Jittered::Now;
    };
    let now = crate::clock::unix_millis() as i64;
    let nearest = [schedule.at_or_before(now), schedule.next_after(now)]
        .into_iter()
        .flatten()
        .min_by_key(|at| (at - now).abs());
    let Some(at) = nearest else {
        return Jittered::Now;
    };
    let start = at + offset.as_millis() as i64;
    let set = signals::SigSet::of(signals::forwarded());
    loop {
        let left = start - crate::clock::unix_millis() as i64;
        if left <= 0 {
            break;
        }
        let got = signals::wait(&set, Duration::from_millis(left as u64));
        if let Some(sig) =
            got.filter(|s| !signals::is_stop(*s) && *s != libc::SIGCONT && *s != libc::SIGWINCH)
        {
            return Jittered::Signalled(sig);
        }
    }
    match config.catch_up {
        Some(_) => Jittered::Now,
        None => Jittered::For(at),
    }
}

/// The lock (or every slot) is held elsewhere: say by whom, and how long we waited.
fn busy(
    config: &RunConfig,
    value: &str,
    expires_in: Option<Duration>,
    waited: Duration,
    log: &Log,
) {
    let after = if config.wait.is_zero() {
        String::new()
    } else {
        format!(
            " after waiting {}",
            Span(Duration::from_millis(waited.as_millis() as u64))
        )
    };
    let holder = describe::describe_holder(value);
    let text = if config.limit > 1 {
        format!(
            "all {} slots of lock '{}' are held (the first to free by {holder}){after}; not \
             running the command",
            config.limit, config.key,
        )
    } else {
        format!(
            "lock '{}' is held by {holder}{after}; not running the command",
            config.key
        )
    };
    log.info(
        "busy",
        &text,
        &[
            ("conflict_exit_code", config.conflict_exit_code.into()),
            ("waited_ms", (waited.as_millis() as u64).into()),
            ("holder", describe::holder_identity(value)),
            // When the holder's lock lapses unless renewed: a replica (--crontab) looks again
            // then, in case the holder died and --retries may run the instant again.
            (
                "expires_in_ms",
                expires_in.map(|d| d.as_millis() as u64).into(),
            ),
        ],
    );
}

/// KEY is suspended (`--suspend`): by whom, since when, why; the instant is recorded skipped.
fn say_suspended(config: &RunConfig, record: &Stored<Suspension>, instant: Option<i64>, log: &Log) {
    let run = match (instant, &config.schedule) {
        (Some(at), Some(s)) => format!(", the {} run is recorded skipped", s.label(at)),
        _ => String::new(),
    };
    log.info(
        "suspended",
        &format!(
            "lock '{}' is suspended {}; not running the command{run} (cronlock --resume {} \
             ends the suspension)",
            config.key,
            describe::describe_suspension(record),
            config.key
        ),
        &[
            ("conflict_exit_code", config.conflict_exit_code.into()),
            ("suspension", describe::suspension_json(record)),
            ("instant", instant.into()),
        ],
    );
}

/// `--schedule`: the instant this host fired for is far ahead of Redis's clock.
fn not_due(config: &RunConfig, instant: i64, ahead: Duration, log: &Log) {
    let label = config
        .schedule
        .as_ref()
        .map_or_else(|| instant.to_string(), |s| s.label(instant));
    let ahead = Duration::from_millis(ahead.as_millis() as u64);
    log.warn(
        "not_due",
        &format!(
            "lock '{}': the {label} run is not due yet by redis's clock ({} ahead, more than {}: \
             this host's clock runs fast); not running the command",
            config.key,
            Span(ahead),
            Span(wait::EARLY_WAIT)
        ),
    );
}

/// `--schedule`: the run for this instant (or a later one) already started.
fn already_ran(config: &RunConfig, instant: i64, ran: i64, log: &Log) {
    let label = |at: i64| {
        config
            .schedule
            .as_ref()
            .map_or_else(|| at.to_string(), |s| s.label(at))
    };
    let what = if ran > instant {
        format!("a later run ({}) already started", label(ran))
    } else if config.catch_up.is_some() {
        format!(
            "nothing due (the {} run is done, was skipped while suspended, or is older than \
             --catch-up)",
            label(instant)
        )
    } else {
        format!("already ran for the {} run", label(instant))
    };
    log.info(
        "already_ran",
        &format!("lock '{}': {what}; not running the command", config.key),
        &[
            ("conflict_exit_code", config.conflict_exit_code.into()),
            ("instant", instant.into()),
            ("recorded_instant", ran.into()),
        ],
    );
}

/// "acquired [slot S of N of ]lock 'KEY' (fencing token F)[ for the ... run]".
pub(super) fn acquired_line(config: &RunConfig, held: &Held) -> String {
    let slot = if held.limit > 1 {
        format!("slot {} of {} of ", held.slot, held.limit)
    } else {
        String::new()
    };
    let run = match (held.instant, &config.schedule) {
        (Some(i), Some(s)) => format!(" for the {} run", s.label(i)),
        _ => String::new(),
    };
    format!(
        "acquired {slot}lock '{}' (fencing token {}){run}",
        config.key, held.fence
    )
}
