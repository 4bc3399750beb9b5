//! The masters a lock lives on: one, or several independent ones (Redlock).
//!
//! [`Masters`] is what the lock code talks to, whatever the URLs. One URL is a quorum of one: each
//! round runs inline on its [`Link`], exactly as a single server always did. With several URLs
//! (each of any form: plain, TLS, Sentinel, Cluster), each round asks every master at once, one
//! scoped thread each, every call bounded by a small fraction of the TTL so that a hung master holds
//! nobody up, and counts the answers against the majority (N/2 + 1):
//! - acquire: held when a majority granted it and validity is left (TTL minus the time spent minus
//!   a drift allowance); otherwise it is undone everywhere, and the outcome is "busy" when a
//!   majority answered "held elsewhere", an error naming the masters when too few answered;
//! - renew: confirmed when a majority confirmed, and then written back (`restore.lua`) on any
//!   master that answered but had lost it (restarted empty), so a rolling restart cannot hand a
//!   majority to someone else; "not ours" once a majority can no longer confirm;
//! - release: on every master that answers, done once a majority confirmed it (deleted, or
//!   found it not ours); force-release: on every master that answers.
//!
//! Fencing: each master keeps its own counter. The token is the maximum of the majority's answers,
//! and before the command starts it is written back (`raise.lua`, only where the lock is still
//! ours) to every master of that majority. Any two majorities share a master, so the next
//! acquisition's maximum is larger, whichever masters answer, also after one restarted empty.

use std::time::Duration;

use crate::clock::Instant;
use crate::store::acquire::AcquireOutcome;
use crate::store::acquire::{self, Acquire};
use crate::store::inspect::{self, Snapshot};
use crate::store::keys::Keys;
use crate::store::lock::{self, Held, Holder, ReleaseOptions, Released, Undo};
use crate::store::members;
use crate::store::round::{
    confirmed, failed, refused, split, unconfirmed, Lost, MasterAnswer, MastersNamed,
};
pub use crate::store::round::{Refused, RoundOutcome};
use crate::store::topology::{Failure, Link, Redis};
use crate::store::trigger;

/// How many rounds one acquisition takes at most when the votes split (see [`Masters::acquire`]).
const SPLIT_ROUNDS: u32 = 4;

/// The most one call to one of several masters may take (see [`Masters::budget`]): a frozen
/// master costs a round this much, whatever the TTL.
const MASTER_CALL: Duration = Duration::from_millis(100);

/// The masters, each with its own link.
pub struct Masters {
    links: Vec<Link>,
}

/// One acquisition round's times: when it was sent, what the whole acquire was given, and the
/// bound on each master's call in this round.
#[derive(Clone, Copy)]
struct Round {
    sent_at: Instant,
    within: Duration,
    budget: Duration,
}

/// How one acquisition round ended: its outcome, and whether it split (no grant and no refusal
/// has a majority, so another round may settle it).
struct RoundEnd {
    outcome: RoundOutcome,
    split: bool,
}

impl Masters {
    pub fn new(redis: &[Redis]) -> Masters {
        Masters {
            links: redis.iter().map(Link::new).collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.links.len()
    }

    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    pub fn majority(&self) -> usize {
        self.links.len() / 2 + 1
    }

    /// The first master (`--connect-timeout` and such are the same for all).
    pub fn redis(&self) -> &Redis {
        self.links[0].redis()
    }

    /// Each master's URL, redacted, for messages.
    pub fn shown(&self, i: usize) -> &str {
        &self.links[i].redis().shown_url
    }

    /// Run `f` on every link: inline for one, at once (a scoped thread each) for several.
    fn each<T: Send>(&mut self, f: impl Fn(usize, &mut Link) -> T + Sync) -> Vec<T> {
        if let [link] = self.links.as_mut_slice() {
            return vec![f(0, link)];
        }
        let f = &f;
        std::thread::scope(|s| {
            let running: Vec<_> = self
                .links
                .iter_mut()
                .enumerate()
                .map(|(i, link)| {
                    std::thread::Builder::new()
                        .name("master".into())
                        .stack_size(512 * 1024)
                        .spawn_scoped(s, move || f(i, link))
                })
                .collect();
            running
                .into_iter()
                .map(|r| match r {
                    Ok(handle) => handle
                        .join()
                        .unwrap_or_else(|p| std::panic::resume_unwind(p)),
                    Err(e) => panic!("cannot start a thread to ask a master: {e}"),
                })
                .collect()
        })
    }

    /// The bound on one call: `within` for one master; for several, a thirtieth of the TTL, at
    /// least 50 ms and at most [`MASTER_CALL`], so one hung master delays a round by little
    /// (Redlock's guidance: milliseconds against a TTL of seconds).
    fn budget(&self, within: Duration, ttl: Duration) -> Duration {
        if self.links.len() == 1 {
            within
        } else {
            within.min((ttl / 30).clamp(Duration::from_millis(50), MASTER_CALL))
        }
    }

    /// One acquisition (see the module comment): a round, and with several masters, when the
    /// contenders' votes split so that nobody got a majority (each round undone), up to
    /// [`SPLIT_ROUNDS`] in all, each after a random pause and under a fresh holder (the undone
    /// one's marker refuses it where it was undone), so that one of them wins the next: a split
    /// would otherwise leave the lock to nobody. Within `within` in all.
    pub fn acquire(&mut self, within: Duration, ask: Acquire<'_>) -> RoundOutcome {
        let started = Instant::now();
        let mut fresh: Option<Holder> = None;
        for round in 1.. {
            let holder = fresh.as_ref().unwrap_or(ask.holder);
            let RoundEnd { outcome, split } = self.round(within, ask.by(holder));
            if !split || round >= SPLIT_ROUNDS {
                return outcome;
            }
            // 5-40 ms: contenders that split pause differently, so that one goes first.
            let pause = Duration::from_millis(5 + (uuid::Uuid::new_v4().as_u128() % 36) as u64);
            if started.elapsed() + pause >= within {
                return outcome;
            }
            let command = holder.command.clone();
            std::thread::sleep(pause);
            fresh = Some(Holder::new(&command));
        }
        unreachable!("the rounds end by returning")
    }

    /// One acquisition round (see [`Masters::acquire`]).
    fn round(&mut self, within: Duration, ask: Acquire<'_>) -> RoundEnd {
        let budget = self.budget(within, ask.ttl);
        let sent_at = Instant::now();
        let answers = self.each(|_, link| -> MasterAnswer {
            let attempt = acquire::try_acquire(link, budget, ask);
            confirmed(
                link,
                attempt,
                &ask.keys.lock,
                budget.saturating_sub(sent_at.elapsed()),
            )
        });
        let round = Round {
            sent_at,
            within,
            budget,
        };
        let outcome = self.settle(&answers, round, ask);
        self.unpin();
        // Split: busy or already run with no holder on a majority, or failed (a master did not
        // answer) after a grant of ours that was undone: either way another round may win it.
        let ours = answers
            .iter()
            .any(|a| matches!(a, Ok(AcquireOutcome::Held(_))));
        let split = ask.limit == 1
            && self.len() > 1
            && (matches!(
                outcome,
                Ok(AcquireOutcome::Busy { .. } | AcquireOutcome::AlreadyRan { .. })
            ) || (outcome.is_err() && ours))
            && split(&answers, self.majority());
        RoundEnd { outcome, split }
    }

    /// Several acquisition rounds of plain locks (`--limit 1`): on one master, their attempts go
    /// as one pipeline, each then settled as [`Masters::acquire`] settles it; on several, one
    /// round after another.
    pub fn acquire_many(&mut self, within: Duration, claims: &[Acquire<'_>]) -> Vec<RoundOutcome> {
        if self.links.len() != 1 || claims.len() < 2 {
            return claims
                .iter()
                .map(|ask| self.acquire(within, *ask))
                .collect();
        }
        let sent_at = Instant::now();
        let attempts = acquire::try_acquire_many(&mut self.links[0], within, claims);
        let round = Round {
            sent_at,
            within,
            budget: within,
        };
        // One confirmation for the whole pipeline, on the connection that made its writes, before
        // anything else is sent: a confirmation on another connection (another primary, during a
        // failover) would vouch for writes it never carried. Falling short pins the connection
        // until every undo of the batch is done there.
        let held = attempts
            .iter()
            .position(|a| matches!(a, Ok(AcquireOutcome::Held(_))));
        let confirmation = held.map(|i| {
            let left = within.saturating_sub(sent_at.elapsed());
            self.links[0].confirm(&claims[i].keys.lock, left)
        });
        let outcomes = attempts
            .into_iter()
            .zip(claims)
            .map(|(attempt, ask)| {
                let answer = match (attempt, &confirmation) {
                    (Ok(AcquireOutcome::Held(held)), Some(Ok(()))) => {
                        Ok(AcquireOutcome::Held(held))
                    }
                    (Ok(AcquireOutcome::Held(_)), Some(Err(failure))) => Err(Lost {
                        failure: failure.duplicate(),
                        taken: true,
                    }),
                    (attempt, _) => unconfirmed(attempt),
                };
                self.settle(&[answer], round, *ask)
            })
            .collect();
        self.unpin();
        outcomes
    }

    /// A round's undos are done (see [`Link::unpin`]).
    fn unpin(&mut self) {
        for link in &mut self.links {
            link.unpin();
        }
    }

    /// The outcome of a round from the masters' answers: held when a majority granted it in
    /// time, else undone wherever it may be ours, and refused or failed as the answers say.
    fn settle(&mut self, answers: &[MasterAnswer], round: Round, ask: Acquire<'_>) -> RoundOutcome {
        let Round {
            sent_at,
            within,
            budget,
        } = round;
        let Acquire {
            keys,
            holder,
            ttl,
            limit,
            ..
        } = ask;
        if let Some(held) = self.granted(answers, sent_at, ttl, budget) {
            return Ok(AcquireOutcome::Held(Box::new(held)));
        }
        // The lock a master granted may be a slot (--limit above 1), or the instant's own
        // (--overlap allow, which abandon.lua finds by the attempt's ledger entry).
        let slots = if limit > 1 {
            keys.slots(limit)
        } else {
            Vec::new()
        };
        // Not ours: undo it wherever it may be ours.
        let undo: Vec<bool> = answers
            .iter()
            .map(|a| {
                matches!(
                    a,
                    Ok(AcquireOutcome::Held(_)) | Err(Lost { taken: true, .. })
                )
            })
            .collect();
        // Within the round's budget: a master that did not answer the acquire (frozen, hung) must
        // not hold the undo, and the next round, for all of --connect-timeout (its lock, if it
        // took one, lapses with the TTL; it is never a majority's).
        let undone = self.each(|i, link| {
            undo[i].then(|| lock::abandon(link, budget, keys, holder, ttl, Undo::RollBack, &slots))
        });
        if let Some(refusal) = refused(answers, self.majority()) {
            return refusal;
        }
        let shown: Vec<&str> = (0..self.len()).map(|i| self.shown(i)).collect();
        let masters = MastersNamed {
            shown: &shown,
            majority: self.majority(),
        };
        failed(answers, &undone, ask, within, masters)
    }

    /// The lock, when a majority granted it in time (and, with several masters, took the
    /// highest fencing token).
    fn granted(
        &mut self,
        answers: &[MasterAnswer],
        sent_at: Instant,
        ttl: Duration,
        budget: Duration,
    ) -> Option<Held> {
        let held: Vec<&Held> = answers
            .iter()
            .filter_map(|a| match a {
                Ok(AcquireOutcome::Held(h)) => Some(&**h),
                _ => None,
            })
            .collect();
        // Redlock's drift allowance: the masters' clocks may run a little fast.
        let drift = ttl / 100 + Duration::from_millis(2);
        // (One master: a late grant is the caller's to judge, as it always was: "too late", 122.)
        let valid = self.len() == 1 || sent_at.elapsed() + drift < ttl;
        if held.len() < self.majority() || !valid {
            return None;
        }
        let mut held = held[0].clone();
        held.fence = answers
            .iter()
            .filter_map(|a| match a {
                Ok(AcquireOutcome::Held(h)) => Some(h.fence),
                _ => None,
            })
            .max()
            .unwrap_or(held.fence);
        held.sent_at = sent_at;
        (self.len() == 1 || self.raise(answers, &held, budget)).then_some(held)
    }

    /// Write the token back to every master of the majority; true when a majority took it.
    fn raise(&mut self, answers: &[MasterAnswer], held: &Held, budget: Duration) -> bool {
        let ours: Vec<bool> = answers
            .iter()
            .map(|a| matches!(a, Ok(AcquireOutcome::Held(_))))
            .collect();
        let raised =
            self.each(|i, link| ours[i] && lock::raise(link, budget, held).is_ok_and(|ours| ours));
        raised.iter().filter(|r| **r).count() >= self.majority()
    }

    /// Renew on every master: `Ok(true)` when a majority confirmed (with `--min-replicas`, their
    /// replicas too), `Ok(false)` once a majority can no longer confirm it (not ours), an error
    /// when too few answered to tell.
    pub fn renew(&mut self, within: Duration, held: &Held) -> Result<bool, Failure> {
        let budget = self.budget(within, held.ttl);
        let start = Instant::now();
        let mut answers = self.each(|_, link| {
            let ours = lock::renew(link, budget, held)?;
            if ours {
                let confirmed =
                    link.confirm(&held.keys.lock, budget.saturating_sub(start.elapsed()));
                link.unpin();
                confirmed?;
            }
            Ok(ours)
        });
        if answers.len() == 1 {
            return answers.remove(0);
        }
        let ours = answers.iter().filter(|a| matches!(a, Ok(true))).count();
        let not_ours = answers.iter().filter(|a| matches!(a, Ok(false))).count();
        if ours >= self.majority() {
            // A master that answered "not ours" while a majority confirms it lost its data
            // (restarted empty): write the lock back there before a second one does the same.
            let lost: Vec<bool> = answers.iter().map(|a| matches!(a, Ok(false))).collect();
            if not_ours > 0 {
                let left = budget.saturating_sub(start.elapsed());
                self.each(|i, link| lost[i] && lock::restore(link, left, held).is_ok_and(|r| r));
            }
            return Ok(true);
        }
        if answers.len() - not_ours < self.majority() {
            return Ok(false);
        }
        let problems: Vec<String> = answers
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.as_ref().err().map(|e| format!("{}: {e}", self.shown(i))))
            .collect();
        Err(Failure::Connect(anyhow::anyhow!(
            "{ours} of {} masters confirmed it, {} needed ({})",
            answers.len(),
            self.majority(),
            problems.join("; ")
        )))
    }

    /// Several renewals at once (a replica renewing its runs' locks): on one master, as one
    /// pipeline confirmed once on its connection (as [`Masters::renew`] confirms one); on several,
    /// one [`Masters::renew`] after another. Each one's answer, in order.
    pub fn renew_many(&mut self, within: Duration, helds: &[&Held]) -> Vec<Result<bool, Failure>> {
        if self.links.len() != 1 || helds.len() < 2 {
            return helds.iter().map(|held| self.renew(within, held)).collect();
        }
        let start = Instant::now();
        let link = &mut self.links[0];
        let renewed = lock::renew_many(link, within, helds);
        let Some(i) = renewed.iter().position(|r| matches!(r, Ok(true))) else {
            return renewed;
        };
        let confirmed = link.confirm(&helds[i].keys.lock, within.saturating_sub(start.elapsed()));
        link.unpin();
        match confirmed {
            Ok(()) => renewed,
            Err(e) => renewed
                .into_iter()
                .map(|r| match r {
                    Ok(true) => Err(e.duplicate()),
                    other => other,
                })
                .collect(),
        }
    }

    /// Several releases at once: on one master, as one pipeline; on several, one after another.
    pub fn release_many(
        &mut self,
        within: Duration,
        items: &[(&Held, &ReleaseOptions)],
    ) -> Vec<Result<Released, Failure>> {
        if self.links.len() != 1 || items.len() < 2 {
            return items
                .iter()
                .map(|(held, opts)| self.release(within, held, opts))
                .collect();
        }
        let start = Instant::now();
        let link = &mut self.links[0];
        let released = lock::release_many(link, within, items);
        // One confirmation for the pipeline, on its connection, as for claims.
        let Some(i) = released.iter().position(Result::is_ok) else {
            return released;
        };
        let confirmed = link.confirm_kept(
            &items[i].0.keys.lock,
            within.saturating_sub(start.elapsed()),
        );
        link.unpin();
        match confirmed {
            Ok(()) => released,
            Err(e) => released
                .into_iter()
                .map(|r| r.and_then(|_| Err(dropped(&e))))
                .collect(),
        }
    }

    /// Release on every master: done once a majority confirmed it (deleted, kept for
    /// `--min-hold`, or not ours), and then deleted (or kept) if it was ours anywhere; with fewer,
    /// a (transient) failure, so the caller makes it again while it matters. A
    /// release's answer counts once it is confirmed as a grant is ([`Link::confirm_kept`]): on a
    /// primary being replaced, a release may be dropped and "not ours" may be the old primary's
    /// stale word, so either is a (transient) failure. Made again, on the new primary once it is
    /// named, the release frees the lock there instead of leaving it for its TTL
    /// (compare-and-delete: a release made twice deletes nothing of anyone else's).
    pub fn release(
        &mut self,
        within: Duration,
        held: &Held,
        opts: &ReleaseOptions,
    ) -> Result<Released, Failure> {
        let budget = self.budget(within, held.ttl);
        let start = Instant::now();
        let mut answers = self.each(|_, link| {
            let released = lock::release(link, budget, held, opts)?;
            let confirmed =
                link.confirm_kept(&held.keys.lock, budget.saturating_sub(start.elapsed()));
            link.unpin();
            confirmed.map_err(|e| dropped(&e))?;
            Ok(released)
        });
        if answers.len() == 1 {
            return answers.remove(0);
        }
        // Done only once a majority confirmed it (deleted, kept, or found it not ours): the lock
        // left on a majority would hold KEY for its TTL, and its instant read running.
        let confirmed = answers.iter().filter(|a| a.is_ok()).count();
        if confirmed < self.majority() {
            let problems: Vec<String> = answers
                .iter()
                .enumerate()
                .filter_map(|(i, a)| a.as_ref().err().map(|e| format!("{}: {e}", self.shown(i))))
                .collect();
            return Err(Failure::Connect(anyhow::anyhow!(
                "{confirmed} of {} masters confirmed the release, {} needed ({}); it is made \
                 again",
                answers.len(),
                self.majority(),
                problems.join("; ")
            )));
        }
        if answers.iter().any(|a| matches!(a, Ok(Released::Deleted))) {
            return Ok(Released::Deleted);
        }
        if answers.iter().any(|a| matches!(a, Ok(Released::Kept))) {
            return Ok(Released::Kept);
        }
        Ok(Released::NotOurs)
    }

    /// `--overlap replace`: whether the runs replaced are gone (a majority answered, none of
    /// them names one still stopping).
    pub fn replaced_gone(&mut self, within: Duration, keys: &Keys) -> bool {
        let answers = self.each(|_, link| lock::replaced_left(link, within, keys));
        let answered = answers.iter().filter(|a| a.is_ok()).count();
        answered >= self.majority() && answers.iter().all(|a| !matches!(a, Ok(n) if *n > 0))
    }

    /// Each master's snapshot of a lock.
    pub fn snapshots(
        &mut self,
        within: Duration,
        keys: &Keys,
        history: Option<u32>,
    ) -> Vec<Result<Snapshot, inspect::Unread>> {
        self.each(|_, link| inspect::snapshot(link, within, keys, history))
    }

    /// Each master's answer to a force-release: the holder values it deleted.
    pub fn force_release(
        &mut self,
        within: Duration,
        keys: &Keys,
        token: Option<&str>,
    ) -> Vec<anyhow::Result<Vec<String>>> {
        self.each(|_, link| inspect::force_release(link, within, keys, token))
    }

    /// Each master's answer to `--suspend`: the record before, and the one now.
    pub fn suspend(
        &mut self,
        within: Duration,
        keys: &Keys,
        record: &str,
        lasting: Duration,
    ) -> Vec<anyhow::Result<inspect::Suspended>> {
        self.each(|_, link| inspect::suspend(link, within, keys, record, lasting))
    }

    /// Each master's answer to `--trigger`'s request for `instant`: whether it was written.
    pub fn trigger(
        &mut self,
        within: Duration,
        keys: &Keys,
        instant: i64,
        record: &str,
    ) -> Vec<Result<bool, Failure>> {
        self.each(|_, link| trigger::ask(link, within, keys, instant, record))
    }

    /// Each master's answer to taking back the request for `instant`.
    pub fn untrigger(
        &mut self,
        within: Duration,
        keys: &Keys,
        instant: i64,
    ) -> Vec<Result<bool, Failure>> {
        self.each(|_, link| trigger::take_back(link, within, keys, instant))
    }

    /// Each master's view of where the manual instant `instant` stands.
    pub fn trigger_standing(
        &mut self,
        within: Duration,
        keys: &Keys,
        instant: i64,
    ) -> Vec<Result<trigger::Standing, Failure>> {
        self.each(|_, link| trigger::read(link, within, keys, instant))
    }

    /// Poke `fleet` (on the master the heartbeats go to) about a manual instant, for `span`.
    pub fn poke(
        &mut self,
        within: Duration,
        prefix: &str,
        fleet: &str,
        poke: &members::Poke,
        span: Duration,
    ) -> Result<usize, Failure> {
        members::poke(&mut self.links[0], within, prefix, fleet, poke, span)
    }

    /// The replicas of `fleet` (on the master the heartbeats go to).
    pub fn members(
        &mut self,
        within: Duration,
        prefix: &str,
        fleet: &str,
    ) -> Result<Vec<members::Member>, Failure> {
        members::members(&mut self.links[0], within, prefix, fleet)
    }

    /// Each master's answer to `--resume`: the record that was in force.
    pub fn resume(&mut self, within: Duration, keys: &Keys) -> Vec<anyhow::Result<Option<String>>> {
        self.each(|_, link| inspect::resume(link, within, keys))
    }

    /// Every lock key under the pattern, on every master (merged).
    pub fn scan(&mut self, pattern: &str, within: Duration) -> Result<Vec<String>, Failure> {
        let answers = self.each(|_, link| link.scan(pattern, within));
        let mut found = Vec::new();
        let mut failed = None;
        let mut answered = 0;
        for (i, a) in answers.into_iter().enumerate() {
            match a {
                Ok(keys) => {
                    answered += 1;
                    found.extend(keys);
                }
                Err(e) if self.len() == 1 => return Err(e),
                Err(e) => failed = Some(format!("{}: {e}", self.shown(i))),
            }
        }
        if answered < self.majority() {
            return Err(Failure::Connect(anyhow::anyhow!(
                "too few masters answered ({})",
                failed.unwrap_or_default()
            )));
        }
        Ok(found)
    }

    /// Record instant `at` of KEY as missed for `reason` on every master (see
    /// [`lock::record_missed`]): whether any wrote it.
    pub fn record_missed(
        &mut self,
        within: Duration,
        keys: &Keys,
        at: i64,
        reason: &str,
    ) -> Result<bool, Failure> {
        let mut answers = self.each(|_, link| lock::record_missed(link, within, keys, at, reason));
        if answers.iter().any(|a| matches!(a, Ok(true))) {
            return Ok(true);
        }
        answers.remove(0)
    }

    /// Undo a claim that did not become a run, on every master (see [`lock::abandon`]): whether
    /// any deleted our lock; an error only when no master answered.
    pub fn unclaim(&mut self, within: Duration, held: &Held, undo: Undo) -> Result<bool, Failure> {
        let budget = self.budget(within, held.ttl);
        let (keys, holder, ttl) = (&held.keys, &held.holder, held.ttl);
        let mut answers =
            self.each(|_, link| lock::abandon(link, budget, keys, holder, ttl, undo, &[]));
        if answers.iter().any(|a| matches!(a, Ok(true))) {
            return Ok(true);
        }
        match answers.iter().position(|a| a.is_ok()) {
            Some(_) => Ok(false),
            None => answers.remove(0),
        }
    }

    /// Which of `items` (a KEY's keys and an instant) are decided already (see
    /// [`lock::claimed_many`]): on several masters, those a majority says are. An instant no
    /// majority could tell about is not decided: the acquire that follows is the judge.
    pub fn claimed(&mut self, within: Duration, items: &[lock::KeyInstant<'_>]) -> Vec<bool> {
        let answers = self.each(|_, link| lock::claimed_many(link, within, items));
        let majority = self.majority();
        (0..items.len())
            .map(|i| {
                let yes = answers
                    .iter()
                    .filter(|a| a.get(i).is_some_and(|r| matches!(r, Ok(true))))
                    .count();
                yes >= majority
            })
            .collect()
    }

    /// A replica's heartbeat (see [`crate::store::members`]), on the first master: the ranking
    /// it serves needs one view, not a majority (a wrong view costs a duplicate claim, which the
    /// acquire refuses, or a delay).
    pub fn beat(
        &mut self,
        within: Duration,
        beat: members::Heartbeat<'_>,
    ) -> Result<members::FleetView, Failure> {
        members::beat(&mut self.links[0], within, beat)
    }

    /// With one master, block on the KEY's notify list for up to `block` (a release wakes us);
    /// None with several, where waiters poll.
    pub fn blpop(&mut self, keys: &Keys, block: Duration) -> Option<Result<(), Failure>> {
        let [link] = self.links.as_mut_slice() else {
            return None;
        };
        let io = link.redis().connect_timeout;
        let secs = blpop_timeout(block);
        let reply = link.call(
            block + io,
            &keys.notify,
            &[b"BLPOP", keys.notify.as_bytes(), secs.as_bytes()],
        );
        Some(reply.and_then(|v| {
            link.read(v, |v| match v {
                redis::Value::Nil | redis::Value::Array(_) => Ok(()),
                _ => Err(Failure::shape(
                    "a BLPOP reply that is neither nil nor an element",
                )),
            })
        }))
    }
}

/// BLPOP's timeout for `block`: seconds with millisecond precision (Redis >= 6). 0 would block
/// forever, and so does 0.001 on Redis 6.2, which reads it as 0.99999 ms and truncates that to
/// 0: never less than 10 ms, written as whole milliseconds.
fn blpop_timeout(block: Duration) -> String {
    let ms = block.as_millis().max(10);
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// A release's answer that was not confirmed: a failover may drop the release, or the answer is
/// an old primary's, so it is to be made again (a transient failure).
fn dropped(e: &Failure) -> Failure {
    match e {
        Failure::NotDurable(text) => {
            Failure::NotDurable(format!("{text}; the release is made again"))
        }
        other => other.duplicate(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blpop_timeouts_never_round_to_forever() {
        assert_eq!(blpop_timeout(Duration::ZERO), "0.010");
        assert_eq!(blpop_timeout(Duration::from_micros(900)), "0.010");
        assert_eq!(blpop_timeout(Duration::from_millis(478)), "0.478");
        assert_eq!(blpop_timeout(Duration::from_millis(2500)), "2.500");
    }
}
