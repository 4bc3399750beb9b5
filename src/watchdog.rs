//! The watchdog: renews the lock while the command runs and tracks, on the monotonic clock
//! ([`crate::clock`], which counts system suspend),
//! until when the lock is known to be valid. The main thread reads that deadline to stop the
//! command before the lock can expire in Redis.
//!
//! Validity: after a renewal Redis confirmed, the lock is valid until the time the renewal was
//! *sent* plus the TTL, since Redis starts the new expiry only when it runs the script. No Redis
//! call may carry the watchdog past that deadline; errors are retried quickly until it.
//!
//! What happens when Redis hangs (or dies, or the network drops), in order:
//! 1. A renewal call gets no answer within its budget (the time left, capped at one interval): it
//!    is retried every `interval / 4` at most, on a new connection: the [link](crate::store::topology)
//!    looks the server up again, so a retry after a failover reaches the new primary (Sentinel)
//!    or the KEY's new slot owner (Cluster). If the lock was replicated there, the renewal finds
//!    it still ours and the job goes on. With `--min-replicas`, a renewal counts only once that
//!    many replicas acknowledged it (`WAIT`); otherwise it is retried like any failed call.
//! 2. At `deadline - grace - margin` the main thread fears the loss and sends SIGTERM; at
//!    `deadline - margin` it sends SIGKILL ([`crate::command::supervise`]).
//! 3. Independently, every confirmed renewal moves the kill-by time (`deadline - margin`) in the
//!    [shared page](crate::command::shared); the [guard](crate::command::guard) kills the job by itself when it
//!    passes, so a frozen cronlock changes nothing.
//! 4. At the deadline the watchdog gives up and marks the lock lost; the release that follows is
//!    bounded by `--connect-timeout` and not retried ([`Watchdog::stop`] waits for no hung call).
//!
//! If Redis answers "not ours" instead, the loss is confirmed: SIGTERM at once, SIGKILL after
//! `--grace` or at `deadline - margin`, whichever comes first.
//!
//! A replica's run (`--crontab`) asks its replica to renew (`renew` on its channel, when a
//! renewal is due): the replica renews the locks of the runs that asked together as one
//! pipeline and says `renewed`, which moves the validity on exactly as a renewal of the run's
//! own would (from when the replica sent it). Only a run that asks is renewed, so a frozen or
//! dead run's lock lapses as its guard stops its command. The run starts its own renewals when
//! no answer came half an interval after it asked: a replica slow, frozen or gone leaves the
//! lock to them with more than an interval before a feared loss.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;
use crate::command::supervise::Keeper;
use crate::duration::Span;
use crate::handover::AskReplica;
use crate::lease::{Timing, Validity};
use crate::log::{Level, Log};
use crate::store::lock::Held;
use crate::store::quorum::Masters;

/// What the lock's watch tells the validity: a change asks for a renewal now; a renewal the
/// run's replica made and Redis confirmed moves it on, to `ttl` after it was sent.
struct ValidityListener {
    validity: Validity,
    ttl: Duration,
}

impl crate::store::tracking::Listener for ValidityListener {
    fn changed(&self) {
        self.validity.renew_now();
    }

    fn lost(&self) -> bool {
        self.validity.is_lost()
    }

    fn renewed(&self, sent: Instant) {
        self.validity.confirm(sent + self.ttl);
    }
}

/// The renewal thread, started only when the first renewal is due: a command that ends before
/// then (most cron jobs' `true`-sized runs) never pays for a thread. Renewals keep their schedule,
/// counted from the time the acquire was sent, whenever the thread starts.
pub struct Watchdog {
    pub validity: Validity,
    state: RenewalState,
    /// How to ask the run's replica to renew the lock (its `renewed` heard on the channel), and
    /// when it was last asked: the renewal thread starts only when no answer came in time
    /// ([`Watchdog::renewed_by_replica`]).
    replica: Option<AskReplica>,
    asked_replica: Option<Instant>,
    ttl: Duration,
    /// The watch for changes to the lock key ([`crate::store::tracking`]): planned, then running.
    tracking: TrackingStage,
}

/// What a replica's run does next for its lock while no renewal thread runs.
enum LockStep {
    /// Ask the replica to renew, at this time.
    Ask(Instant),
    /// Start the renewal thread, at this time.
    Thread(Instant),
}

enum TrackingStage {
    /// To start at `at`.
    Planned {
        at: Instant,
        plan: Box<dyn crate::store::tracking::Watch>,
    },
    /// Looked at on each wake-up; its `Drop` ends the watch.
    Running {
        watch: Box<dyn crate::store::tracking::Watching>,
    },
    Off,
}

enum RenewalState {
    /// Nothing to do before `due`; the main loop calls [`Keeper::start_if_due`].
    Pending { due: Instant, renewal: Box<Renewal> },
    Running {
        stop: mpsc::Sender<Msg>,
        done: mpsc::Receiver<Option<Masters>>,
    },
    /// The thread could not be started; the lock is marked lost.
    Failed,
}

/// What the main thread tells the renewal thread.
enum Msg {
    /// Renew now (see [`Validity::renew_now`]).
    Renew,
    Stop,
}

/// What the renewal thread needs.
struct Renewal {
    masters: Masters,
    held: Held,
    timing: Timing,
    log: Log,
}

impl Watchdog {
    /// Prepare to renew `held` over `link` (the one that took the lock). No thread runs yet: see
    /// [`Keeper::start_if_due`].
    pub fn new(
        masters: Masters,
        held: Held,
        timing: Timing,
        validity: Validity,
        log: Log,
    ) -> Watchdog {
        let due = held.sent_at + timing.interval;
        let renewal = Box::new(Renewal {
            masters,
            held,
            timing,
            log,
        });
        Watchdog {
            validity,
            state: RenewalState::Pending { due, renewal },
            replica: None,
            asked_replica: None,
            ttl: timing.ttl,
            tracking: TrackingStage::Off,
        }
    }

    /// The run's replica renews the lock when asked (`ask`), and says so on the channel, heard
    /// by the watch this run starts ([`Watchdog::track`]).
    pub fn renewed_by_replica(&mut self, ask: AskReplica) {
        self.replica = Some(ask);
    }

    /// What the lock needs next while no renewal thread runs: at `due` (the first renewal), or,
    /// while the replica renews it, an interval after the last confirmed renewal was sent (the
    /// lock is valid a TTL after it), ask the replica; half an interval after an ask it did not
    /// answer, start the thread.
    fn next_step(&self, due: Instant, renewal: &Renewal) -> LockStep {
        if self.replica.is_none() {
            return LockStep::Thread(due);
        }
        let valid_until = self.validity.valid_until();
        replica_step(due, valid_until, &renewal.timing, self.asked_replica)
    }

    /// Watch the lock key for changes once the command started at `started` has run a little:
    /// the run's own watch, or its replica's.
    pub fn track(&mut self, plan: Box<dyn crate::store::tracking::Watch>, started: Instant) {
        self.tracking = TrackingStage::Planned {
            at: crate::store::tracking::WatchPlan::due(started),
            plan,
        };
    }

    /// Stop renewing; returns the links if they are still good, for the release. Waits at most
    /// `within` for a renewal in flight: a hung Redis must not hold up the end of the run (a
    /// renewal that lands later is harmless, since it only extends a lock that is still ours).
    pub fn stop(self, within: Duration) -> Option<Masters> {
        drop(self.tracking);
        match self.state {
            RenewalState::Pending { renewal, .. } => Some(renewal.masters),
            RenewalState::Running { stop, done } => {
                let _ = stop.send(Msg::Stop);
                done.recv_timeout(within).ok().flatten()
            }
            RenewalState::Failed => None,
        }
    }
}

impl Keeper for Watchdog {
    fn validity(&self) -> &Validity {
        &self.validity
    }

    /// When the main loop must call [`Keeper::start_if_due`] next, if at all.
    fn due(&self) -> Option<Instant> {
        let renewal = match &self.state {
            RenewalState::Pending { due, renewal } => match self.next_step(*due, renewal) {
                LockStep::Ask(at) | LockStep::Thread(at) => Some(at),
            },
            _ => None,
        };
        let tracking = match &self.tracking {
            TrackingStage::Planned { at, .. } => Some(*at),
            _ => None,
        };
        renewal.into_iter().chain(tracking).min()
    }

    /// Start the renewal thread once its first renewal is due, or at once when a renewal was
    /// asked for ([`Validity::renew_now`]); a running thread is told to renew now. If it cannot
    /// start, nothing will renew the lock: it is marked lost, so the command is stopped before the
    /// lock can expire.
    fn start_if_due(&mut self, now: Instant) {
        if matches!(&self.tracking, TrackingStage::Planned { at, .. } if now >= *at) {
            if let TrackingStage::Planned { plan, .. } =
                std::mem::replace(&mut self.tracking, TrackingStage::Off)
            {
                let heard = ValidityListener {
                    validity: self.validity.clone(),
                    ttl: self.ttl,
                };
                self.tracking = TrackingStage::Running {
                    watch: plan.start(Arc::new(heard)),
                };
            }
        }
        // (A watch heard on the run's channel reads what came: a change asks a renewal now.)
        if let TrackingStage::Running { watch } = &mut self.tracking {
            watch.look();
        }
        let asked = self.validity.take_renew_now();
        match &self.state {
            RenewalState::Pending { .. } if asked => {}
            RenewalState::Pending { due, renewal } => match self.next_step(*due, renewal) {
                LockStep::Thread(at) if now >= at => {}
                LockStep::Ask(at) if now >= at => {
                    if let Some(ask) = &self.replica {
                        ask();
                    }
                    self.asked_replica = Some(now);
                    return;
                }
                _ => return,
            },
            RenewalState::Running { stop, .. } if asked => {
                let _ = stop.send(Msg::Renew);
                return;
            }
            _ => return,
        }
        let RenewalState::Pending { renewal, .. } =
            std::mem::replace(&mut self.state, RenewalState::Failed)
        else {
            return;
        };
        match spawn(*renewal, self.validity.clone()) {
            Ok(running) => {
                if let (true, RenewalState::Running { stop, .. }) = (asked, &running) {
                    let _ = stop.send(Msg::Renew);
                }
                self.state = running;
            }
            Err(e) => self.validity.lose(format!(
                "cannot start the watchdog thread that renews it ({e})"
            )),
        }
    }
}

/// [`Watchdog::next_step`] for a replica's run whose lock is valid until `valid_until` and whose
/// replica was last asked at `asked`: an ask is answered by a renewal sent after it.
fn replica_step(
    due: Instant,
    valid_until: Instant,
    timing: &Timing,
    asked: Option<Instant>,
) -> LockStep {
    let last_sent = valid_until.checked_sub(timing.ttl);
    match asked {
        Some(asked) if last_sent.is_none_or(|sent| sent < asked) => {
            LockStep::Thread(asked + timing.interval / 2)
        }
        _ => LockStep::Ask(last_sent.map_or(due, |sent| due.max(sent + timing.interval))),
    }
}

fn spawn(r: Renewal, watch: Validity) -> std::io::Result<RenewalState> {
    if crate::hooks::fault_at("watchdog-start") {
        return Err(std::io::Error::other(
            "injected by a test hook (hooks::PANIC)",
        ));
    }
    let (stop, stop_rx) = mpsc::channel();
    let (done_tx, done) = mpsc::channel();
    std::thread::Builder::new()
        .name("watchdog".into())
        // Renewals need little stack: a Redis call and a few log lines.
        .stack_size(256 * 1024)
        .spawn(move || {
            let name = r.held.keys.name.clone();
            let w = watch.clone();
            let run = std::panic::AssertUnwindSafe(|| {
                renew_loop(r.masters, r.held, r.timing, w, stop_rx, r.log)
            });
            let con = std::panic::catch_unwind(run).unwrap_or_else(|payload| {
                // Nobody renews the lock any more: that is a lost lock, not a silent end.
                watch.lose(format!(
                    "the watchdog renewing '{name}' failed ({})",
                    crate::log::panic_message(&*payload)
                ));
                None
            });
            let _ = done_tx.send(con);
        })?;
    Ok(RenewalState::Running { stop, done })
}

fn renew_loop(
    mut masters: Masters,
    held: Held,
    timing: Timing,
    watch: Validity,
    stop: mpsc::Receiver<Msg>,
    log: Log,
) -> Option<Masters> {
    let retry = (timing.interval / 4).clamp(Duration::from_millis(10), Duration::from_millis(100));
    // A hung Redis must not hold one attempt for long when a retry could still succeed.
    let call_cap = timing.interval.max(Duration::from_millis(200));
    let mut next = held.sent_at + timing.interval;
    let mut failing_since: Option<Instant> = None;
    loop {
        match stop.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Err(RecvTimeoutError::Timeout) | Ok(Msg::Renew) => {}
            _ => return Some(masters),
        }
        if crate::hooks::fault_at("watchdog") {
            panic!("injected by a test hook (hooks::PANIC)");
        }
        let now = Instant::now();
        let valid_until = watch.valid_until();
        if now >= valid_until {
            let err = watch.last_error().unwrap_or_else(|| "no reply".into());
            watch.lose(format!(
                "no renewal of '{}' was confirmed before it could expire ({err})",
                held.keys.name
            ));
            return None;
        }
        let budget = (valid_until - now).min(call_cap);
        let sent = Instant::now();
        // With --min-replicas, a renewal counts once the replicas have it too.
        let result = masters.renew(budget, &held);
        match result {
            Ok(true) => {
                watch.confirm(sent + timing.ttl);
                if let Some(since) = failing_since.take() {
                    log.event(
                        Level::Info,
                        "renew_recovered",
                        &format!(
                            "renewing lock '{}' works again after failing for {}",
                            held.keys.name,
                            Span(Duration::from_millis(since.elapsed().as_millis() as u64))
                        ),
                        &[],
                    );
                }
                log.event(Level::Debug, "renewed", "lock renewed", &[]);
                next = sent + timing.interval;
            }
            Ok(false) => {
                watch.lose(format!(
                    "lock '{}' is no longer ours (deleted, expired or taken over)",
                    held.keys.name
                ));
                return None;
            }
            Err(e) => {
                let msg = e.to_string();
                if failing_since.is_none() {
                    failing_since = Some(now);
                    log.event(
                        Level::Info,
                        "renew_failed",
                        &format!("cannot renew lock '{}': {msg}; retrying", held.keys.name),
                        &[],
                    );
                }
                watch.set_last_error(msg);
                next = Instant::now() + retry;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_duration(Duration::from_secs(1000) + Duration::from_millis(ms))
    }

    /// A replica's run asks an interval after the last renewal was sent, starts its own thread
    /// half an interval after an ask nobody answered, and asks again an interval after the
    /// renewal that answered it; its own first renewal then comes with more than an interval
    /// left before a feared loss (SIGTERM at the end of TTL - grace - margin), whatever the TTL
    /// and grace.
    #[test]
    fn a_run_asks_its_replica_then_renews_by_itself_in_time() {
        let timing = Timing::new(Duration::from_secs(30), None).unwrap();
        let interval = timing.interval;
        let sent = at(0);
        let due = sent + timing.interval;
        let valid = sent + timing.ttl;
        assert!(matches!(replica_step(due, valid, &timing, None), LockStep::Ask(t) if t == due));
        let asked = sent + interval;
        let fallback = asked + interval / 2;
        assert!(matches!(
            replica_step(due, valid, &timing, Some(asked)),
            LockStep::Thread(t) if t == fallback
        ));
        // Answered by a renewal sent 5 ms after the ask.
        let answer = asked + Duration::from_millis(5);
        assert!(matches!(
            replica_step(due, answer + timing.ttl, &timing, Some(asked)),
            LockStep::Ask(t) if t == answer + interval
        ));
        for ttl_ms in [250, 400, 1000, 3000, 6000, 30_000, 120_000] {
            for grace in [None, Some(Duration::from_millis(ttl_ms / 2))] {
                let timing = Timing::new(Duration::from_millis(ttl_ms), grace).unwrap();
                let due = sent + timing.interval;
                let valid = sent + timing.ttl;
                let LockStep::Ask(asked) = replica_step(due, valid, &timing, None) else {
                    panic!("{ttl_ms}: no ask first");
                };
                let LockStep::Thread(own) = replica_step(due, valid, &timing, Some(asked)) else {
                    panic!("{ttl_ms}: no thread after an unanswered ask");
                };
                let sigterm = sent + (timing.ttl - timing.grace - timing.margin);
                assert!(own + timing.interval <= sigterm, "{ttl_ms} {grace:?}");
            }
        }
    }
}
