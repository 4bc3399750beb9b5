//! Supervising the running command: forward signals, stop it before the lock's validity ends
//! (or past `--max-runtime`), and say how it ended. The one loop cronlock's main thread runs
//! while the command lives.

use std::time::Duration;

use crate::clock::Instant;
use crate::command::capture::Capture;
use crate::command::child::{guard_died_message, Child, Ended, Finished, Stop};
use crate::exit::Exit;
use crate::lease::{LockState, Validity};
use crate::log::{Level, Log};
use crate::signals;

/// What keeps the lock while the command runs (the watchdog, which sits above the job): the loop
/// reads the lease from it and starts its renewals when they fall due, so that a command that ends
/// first never pays for a thread.
pub trait Keeper {
    /// The lease the loop acts on.
    fn validity(&self) -> &Validity;
    /// When the keeper next needs the loop ([`Keeper::start_if_due`]), if ever.
    fn due(&self) -> Option<Instant>;
    /// Start what is due by `now`. If it cannot start, the lease is marked lost.
    fn start_if_due(&mut self, now: Instant);
}

/// The reason given when the guard ended the job by itself.
const GUARD_REASON: &str = "no renewal was confirmed in time because cronlock itself was \
                              stopped or starved, so the guard ended the command at the lock's \
                              deadline";

/// When and how to stop the command.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
    pub max_runtime: Option<Duration>,
    /// The longest the loop sleeps (a renewal interval; a second at most): how soon it notices a
    /// command that ended while its guard could not say so.
    pub look_every: Duration,
}

/// Wait for the command, forwarding signals and enforcing the lock's validity and `--max-runtime`.
///
/// On the safety path the signal always goes out before anything is logged: a log line may wait
/// for a stalled stderr reader (it is queued, see [`crate::log`]), a kill must not.
/// `output`, the command's captured output, is looked at on every turn (its copying starts once
/// the command wrote).
pub fn supervise(
    mut child: Child,
    keeper: &mut dyn Keeper,
    mut output: Option<&mut Capture>,
    limits: Limits,
    log: &Log,
) -> Ended {
    let watch = keeper.validity().clone();
    let set = signals::watched();
    let mut s = Supervision {
        limits,
        started: Instant::now(),
        stopped: None,
        kill_at: None,
        killed: false,
        forwarded_once: false,
    };
    loop {
        if let Some(finished) = child.try_finish() {
            return s.ended(&child, finished, log);
        }
        if let Some(o) = output.as_deref_mut() {
            o.look();
        }
        let now = Instant::now();
        // The renewal thread starts when the first renewal is due; if it cannot, the lock is
        // marked lost and this very round stops the command.
        keeper.start_if_due(now);
        let lock = watch.state();
        let (term_at, hard_kill_at) = match &lock {
            LockState::Valid { until } => (
                until.checked_sub(limits.grace + watch.margin),
                until.checked_sub(watch.margin),
            ),
            // No validity left to protect but what was confirmed before: the grace, cut short by
            // the last known deadline.
            LockState::Lost { until, .. } => (Some(now), until.checked_sub(watch.margin)),
        };
        if s.stopped.is_none() && child.guard_enforced() {
            // The guard ended the job while we could not (frozen): what is left goes too (the
            // guard may still be on its way out), then one line says why, as at the end.
            child.kill_all();
            s.killed = true;
            log.event(
                Level::Error,
                "lost",
                &format!("lock lost: {GUARD_REASON}"),
                &[],
            );
            s.stopped = Some(Stop::LockLost(GUARD_REASON.into()));
        }
        if s.stopped.is_none() {
            if let Some(why) = s.why_stop(&watch, &lock, term_at, now) {
                s.stop(
                    &child,
                    why,
                    hard_kill_at.is_some_and(|k| now >= k),
                    now,
                    log,
                );
            }
        }
        let must_kill =
            s.kill_at.is_some_and(|k| now >= k) || hard_kill_at.is_some_and(|k| now >= k);
        if must_kill && !s.killed {
            child.kill_all();
            s.killed = true;
            if s.stopped.is_some() {
                log.event(
                    Level::Warn,
                    "killed",
                    "the command did not stop in time; sent SIGKILL",
                    &[],
                );
            }
        }
        // Sleep until the next moment something may have to happen, or a signal.
        let next = s.next_moment(keeper.due(), term_at, hard_kill_at, now);
        match signals::wait(&set, next.saturating_duration_since(now)) {
            Some(sig) if signals::forwarded().contains(&sig) => s.forward(&child, sig, log),
            Some(_) => {}
            // A wake-up on time (a renewal due, at the latest): has the command ended without its
            // guard saying so? A stopped guard reaps nothing, and the lock would be kept for a
            // job that is over for as long as the guard stays stopped.
            None => {
                if let Some(status) = child.unreaped() {
                    child.take_over(status);
                    log.event(
                        Level::Warn,
                        "guard_stuck",
                        &format!(
                            "the command ended but its guard process ({}) did not report it \
                             (stopped?); ended the guard",
                            child.group
                        ),
                        &[],
                    );
                }
            }
        }
    }
}

/// What [`supervise`] has done so far.
struct Supervision {
    limits: Limits,
    started: Instant,
    /// Why the command is being stopped, once it is.
    stopped: Option<Stop>,
    /// When the grace period after SIGTERM ends.
    kill_at: Option<Instant>,
    killed: bool,
    forwarded_once: bool,
}

impl Supervision {
    /// The command is gone: say what the guard did, if anything, and how it ended.
    fn ended(&mut self, child: &Child, finished: Finished, log: &Log) -> Ended {
        let Finished { status, guard_died } = finished;
        if let Some(guard) = guard_died {
            log.event(
                Level::Error,
                "guard_died",
                &guard_died_message(child.group, guard),
                &[],
            );
        }
        if self.stopped.is_some() && !self.killed && child.guard_enforced() {
            log.event(
                Level::Warn,
                "killed",
                "the command did not stop in time; the guard sent SIGKILL",
                &[],
            );
        }
        if self.stopped.is_none() && child.guard_enforced() {
            log.event(
                Level::Error,
                "lost",
                &format!("lock lost: {GUARD_REASON}"),
                &[],
            );
            self.stopped = Some(Stop::LockLost(GUARD_REASON.into()));
        }
        Ended {
            status: Exit::from_wait_status(status),
            stopped: self.stopped.take(),
        }
    }

    /// Whether the command must be stopped now, and why: the lock is lost (or no renewal came
    /// before the grace period must begin), or `--max-runtime` is past. (The guard acting is
    /// seen before this, in [`supervise`].)
    fn why_stop(
        &self,
        watch: &Validity,
        lock: &LockState,
        term_at: Option<Instant>,
        now: Instant,
    ) -> Option<Stop> {
        match lock {
            LockState::Lost { reason, .. } => Some(Stop::LockLost(reason.clone())),
            LockState::Valid { .. } if term_at.is_some_and(|t| now >= t) => {
                Some(Stop::LockLost(format!(
                    "no renewal was confirmed in time ({}), so it may expire soon",
                    watch.last_error().unwrap_or_else(|| "no reply".into())
                )))
            }
            _ => self
                .limits
                .max_runtime
                .filter(|m| now >= self.started + *m)
                .map(|_| Stop::MaxRuntime),
        }
    }

    /// Stop the command: SIGTERM and a grace period, or SIGKILL at once when no time is left
    /// (`no_grace`). The signal goes out first; then the line.
    fn stop(&mut self, child: &Child, why: Stop, no_grace: bool, now: Instant, log: &Log) {
        if no_grace {
            // No time left for a grace period: the kill below is part of this stop.
            child.kill_all();
            self.killed = true;
        } else {
            child.terminate(libc::SIGTERM);
        }
        self.kill_at = Some(now + self.limits.grace);
        let (event, msg) = match &why {
            Stop::LockLost(reason) => (
                "lost",
                format!("lock lost: {reason}; terminating the command"),
            ),
            Stop::MaxRuntime => (
                "max_runtime",
                format!(
                    "the command ran past --max-runtime ({}); terminating it",
                    crate::duration::Span(self.limits.max_runtime.unwrap_or_default())
                ),
            ),
        };
        self.stopped = Some(why);
        log.event(Level::Error, event, &msg, &[]);
    }

    /// The next moment something may have to happen (at most a second, and a renewal interval,
    /// away).
    fn next_moment(
        &self,
        renewal_due: Option<Instant>,
        term_at: Option<Instant>,
        hard_kill_at: Option<Instant>,
        now: Instant,
    ) -> Instant {
        let running = self.stopped.is_none();
        [
            renewal_due,
            self.kill_at.filter(|_| !self.killed),
            hard_kill_at.filter(|_| !self.killed),
            term_at.filter(|_| running),
            self.limits
                .max_runtime
                .map(|m| self.started + m)
                .filter(|_| running),
        ]
        .into_iter()
        .flatten()
        .fold(
            now + self.limits.look_every.min(Duration::from_secs(1)),
            Instant::min,
        )
    }

    /// Pass a signal we received on to the command (the ones that ask it to end, as cronlock's
    /// own termination does).
    fn forward(&mut self, child: &Child, sig: libc::c_int, log: &Log) {
        if matches!(
            sig,
            libc::SIGTERM | libc::SIGINT | libc::SIGHUP | libc::SIGQUIT
        ) {
            signals::note_asked_to_end();
            child.terminate(sig);
        } else {
            child.signal_group(sig);
        }
        log.event(
            if self.forwarded_once || sig == libc::SIGWINCH {
                Level::Debug
            } else {
                Level::Info
            },
            "signal",
            &format!(
                "received {}; forwarding it to the command",
                signals::name(sig)
            ),
            &[("signal", sig.into())],
        );
        self.forwarded_once = true;
    }
}
