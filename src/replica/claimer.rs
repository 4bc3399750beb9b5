//! The claims thread: it carries out the loop's asks ([`super::claim`]) on long-lived links, and
//! tells the loop what came of them. The asks that wait together are carried out together, so
//! Redis wakes once for many: the claims of one instant go as one pipeline per server list, and
//! so do the releases of runs that end together (a run's release waits up to [`LINGER`] for
//! others); every other ask goes alone, in order, right after (a heartbeat sent with claims
//! finds Redis awake). A batch is carried out exactly as its asks would be one
//! by one ([`crate::store::quorum::Masters::acquire_many`] settles each claim as `acquire` does).

use std::collections::HashMap;

use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Instant;
use crate::config::RunConfig;
use crate::handover::ReplicaSide;
use crate::http::Board;
use crate::signals;
use crate::store::acquire::Acquire;
use crate::store::holder::Holder;
use crate::store::keys::Keys;
use crate::store::lock::{Held, InstantKind, ReleaseOptions};

use super::claim::{self, masters, settle_release, verdict, Answer, Ask, ClaimVerdict, Desk};
use super::owed::OwedRelease;
use super::skew::CallWindow;

/// The claims thread's inbox, its answers, and how many claims it has not answered yet.
pub struct Claims {
    /// `None` once [`Claims::finish`] closed it.
    asks: Option<Sender<Ask>>,
    answers: Receiver<Answer>,
    /// Claims sent and not yet answered.
    in_flight: usize,
    /// Closed when the thread ends (every ask carried out).
    done: Receiver<()>,
}

impl Claims {
    /// Start the thread; each answer wakes the main thread. With a `board` (`--listen`), the time
    /// each batch took goes there.
    pub fn start(board: Option<Arc<Board>>) -> std::io::Result<Claims> {
        let (asks, inbox) = std::sync::mpsc::channel();
        let (answered, answers) = std::sync::mpsc::channel();
        let (ended, done) = std::sync::mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("claims".into())
            .spawn(move || {
                serve(inbox, answered, board);
                drop(ended);
            })?;
        Ok(Claims {
            asks: Some(asks),
            answers,
            in_flight: 0,
            done,
        })
    }

    pub fn send(&mut self, ask: Ask) {
        if let Some(asks) = &self.asks {
            if matches!(ask, Ask::Claim { .. }) {
                self.in_flight += 1;
            }
            let _ = asks.send(ask);
        }
    }

    /// The next answer the thread gave, if any.
    pub fn answer(&mut self) -> Option<Answer> {
        let answer = self.answers.try_recv().ok()?;
        if matches!(answer, Answer::Claim { .. }) {
            self.in_flight = self.in_flight.saturating_sub(1);
        }
        Some(answer)
    }

    /// How many claims were sent and not answered yet.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Take no more asks, and wait up to `within` for the thread to carry out those it has:
    /// whether it did.
    pub fn finish(&mut self, within: Duration) -> bool {
        self.asks = None;
        !matches!(
            self.done.recv_timeout(within),
            Err(RecvTimeoutError::Timeout)
        )
    }
}

/// Answer asks until the loop is gone: those that wait together are carried out together
/// (see the module comment); the releases owed are carried out again every
/// [`super::owed::AGAIN`] meanwhile, and once more when the loop is gone (those still owed
/// then are said lost).
fn serve(inbox: Receiver<Ask>, answers: Sender<Answer>, board: Option<Arc<Board>>) {
    let mut desk = Desk::default();
    let tell = &mut |answer| tell(&answers, answer);
    loop {
        let first = match desk.owed.next_try() {
            None => inbox.recv().ok(),
            Some(at) => match inbox.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(ask) => Some(ask),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            },
        };
        let began = Instant::now();
        let carried = match first {
            Some(first) => carry_out(&mut desk, gather(first, &inbox), tell),
            None if desk.owed.next_try().is_none() => break,
            None => Ok(()),
        };
        if carried.is_err() {
            return;
        }
        let due = desk.owed.due(Instant::now());
        if !due.is_empty() && release_owed(&mut desk, due, tell).is_err() {
            return;
        }
        if let Some(board) = &board {
            board.called(began.elapsed());
        }
    }
    let last = desk.owed.take_all();
    let _ = release_owed(&mut desk, last, tell);
    for release in desk.owed.take_all() {
        let _ = tell(Answer::Owed {
            key: release.config.key.clone(),
            instant: release.held.instant,
            end: claim::OwedEnd::Dropped("the replica stopped before redis took it".into()),
        });
    }
}

/// The loop that asked is gone (its end of the channel dropped): nothing more to carry out.
#[derive(Debug)]
pub struct LoopGone;

/// Send an answer and wake the loop.
fn tell(answers: &Sender<Answer>, answer: Answer) -> Result<(), LoopGone> {
    let won = matches!(
        answer,
        Answer::Claim {
            verdict: ClaimVerdict::Won(_),
            ..
        }
    );
    if let Some(hold) = crate::hooks::millis(crate::hooks::HOLD_CLAIM_ANSWER_MS).filter(|_| won) {
        std::thread::sleep(hold);
    }
    answers.send(answer).map_err(|_| LoopGone)?;
    signals::wake_main();
    Ok(())
}

/// How long a run's release waits for others to go with it: runs of one instant end within a
/// few milliseconds of each other, and a lock kept that much longer costs nothing.
pub const LINGER: Duration = Duration::from_millis(10);
/// The most asks in one batch (a bound on one pipeline).
pub const MOST: usize = 256;
/// The most one carrying out of the releases owed on one server list may take.
const OWED_WITHIN: Duration = Duration::from_millis(500);

/// `first` and the asks waiting behind it; with a run's release among them (and no claim, no
/// release an instant waits for), also those that come within [`LINGER`].
pub fn gather(first: Ask, inbox: &Receiver<Ask>) -> Vec<Ask> {
    let mut asks = vec![first];
    let mut linger_until: Option<Instant> = None;
    while asks.len() < MOST {
        if let Ok(ask) = inbox.try_recv() {
            asks.push(ask);
            continue;
        }
        // Lingering is for runs' renewals and releases only (the runs that started together ask
        // together): a claim is never held back, nor a release an instant waits for (a replica
        // at --max-jobs starts the next run when one is over).
        let releasing = asks
            .iter()
            .any(|a| matches!(a, Ask::ReleaseRun { .. } | Ask::RenewRun { .. }));
        let pressed = asks
            .iter()
            .any(|a| matches!(a, Ask::Claim { .. } | Ask::ReleaseRun { urgent: true, .. }));
        if !releasing || pressed {
            break;
        }
        let until = *linger_until.get_or_insert_with(|| Instant::now() + LINGER);
        match inbox.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(ask) => asks.push(ask),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
        }
    }
    asks
}

/// A claim of the batch.
struct ClaimAsk {
    key: String,
    config: Arc<RunConfig>,
    instant: i64,
    kind: InstantKind,
}

/// A run's renewal of the batch.
struct RunRenewal {
    config: Arc<RunConfig>,
    pid: u32,
    held: Box<Held>,
}

/// A run's release of the batch.
struct RunRelease {
    config: Arc<RunConfig>,
    held: Box<Held>,
    opts: Box<ReleaseOptions>,
    reply: ReplicaSide,
}

/// Carry out a batch: its undos, then its claims (they are the ones a start waits for: their
/// answers go to the loop at once, through `tell`), then its runs' renewals (but those of runs
/// that asked for their release, now or before: refused), then their releases, then the rest
/// in order. [`LoopGone`]: the loop is gone.
pub fn carry_out(
    desk: &mut Desk,
    asks: Vec<Ask>,
    tell: &mut dyn FnMut(Answer) -> Result<(), LoopGone>,
) -> Result<(), LoopGone> {
    let mut undos = Vec::new();
    let mut claims = Vec::new();
    let mut renewals = Vec::new();
    let mut releases = Vec::new();
    let mut rest = Vec::new();
    for ask in asks {
        match ask {
            undo @ Ask::Unclaim { .. } => undos.push(undo),
            Ask::Claim {
                key,
                config,
                instant,
                kind,
            } if config.limit == 1 => claims.push(ClaimAsk {
                key,
                config,
                instant,
                kind,
            }),
            Ask::RenewRun { config, pid, held } => {
                renewals.push(RunRenewal { config, pid, held });
            }
            Ask::ReleaseRun {
                config,
                held,
                opts,
                reply,
                ..
            } => releases.push(RunRelease {
                config,
                held,
                opts,
                reply,
            }),
            other => rest.push(other),
        }
    }
    // Undos first: a claim of an instant whose earlier claim is undone in the same batch (its
    // run could not start; the replica claims it again) must find it undone.
    for ask in undos {
        for answer in claim::carry_out(desk, ask) {
            tell(answer)?;
        }
    }
    for group in by_servers(claims, |c| &c.config) {
        for answer in claim_together(&mut desk.links, group) {
            tell(answer)?;
        }
    }
    // A renewal of a run whose release was asked already (in this batch or an earlier one) is
    // refused: it would keep a lock released with --min-hold, or by the run itself, for a TTL.
    for release in &releases {
        desk.released.asked(&release.held);
    }
    let (refused, renewals): (Vec<_>, Vec<_>) = renewals
        .into_iter()
        .partition(|r| desk.released.has(&r.held));
    for r in refused {
        tell(claim::refused_renewal(r.pid, Instant::now()))?;
    }
    for group in by_servers(renewals, |r| &r.config) {
        for answer in renew_together(&mut desk.links, group) {
            tell(answer)?;
        }
    }
    for group in by_servers(releases, |r| &r.config) {
        for answer in release_together(desk, group) {
            tell(answer)?;
        }
    }
    for ask in rest {
        for answer in claim::carry_out(desk, ask) {
            tell(answer)?;
        }
    }
    Ok(())
}

/// `items` split by the server list their job's configuration names, each in its order.
fn by_servers<T>(items: Vec<T>, config: impl Fn(&T) -> &Arc<RunConfig>) -> Vec<Vec<T>> {
    let mut groups: Vec<Vec<T>> = Vec::new();
    let mut index: HashMap<Vec<u64>, usize> = HashMap::new();
    for item in items {
        let servers = claim::group(config(&item)).servers;
        let i = *index.entry(servers).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[i].push(item);
    }
    groups
}

/// How a group on one server list is reached.
struct Reach {
    /// A job's configuration (they share the servers).
    config: Arc<RunConfig>,
    /// The shortest `--connect-timeout` among them.
    within: Duration,
}

/// How a group is reached; `None` for no group.
fn reach<'a>(mut configs: impl Iterator<Item = &'a Arc<RunConfig>>) -> Option<Reach> {
    let first = configs.next()?;
    let within = configs
        .map(|c| c.connect_timeout)
        .fold(first.connect_timeout, Duration::min);
    Some(Reach {
        config: first.clone(),
        within,
    })
}

/// Claims on one server list, as one pipeline: each one's answer.
fn claim_together(links: &mut claim::Links, group: Vec<ClaimAsk>) -> Vec<Answer> {
    let Some(Reach { config, within }) = reach(group.iter().map(|c| &c.config)) else {
        return Vec::new();
    };
    let keys: Vec<Keys> = group
        .iter()
        .map(|c| Keys::new(&c.config.prefix, &c.config.key))
        .collect();
    let holders: Vec<Holder> = group
        .iter()
        .map(|c| Holder::new(&c.config.command_line()))
        .collect();
    let instants: Vec<_> = group
        .iter()
        .map(|c| c.config.instants_of(c.kind, c.instant))
        .collect();
    let claims: Vec<_> = group
        .iter()
        .enumerate()
        .map(|(i, c)| Acquire {
            keys: &keys[i],
            holder: &holders[i],
            ttl: c.config.timing.ttl,
            instants: instants[i].as_ref(),
            limit: 1,
        })
        .collect();
    let window = CallWindow::start();
    let outcomes = masters(links, &config).acquire_many(within, &claims);
    let window = window.ended();
    outcomes
        .into_iter()
        .zip(group)
        .map(|(outcome, c)| Answer::Claim {
            verdict: verdict(outcome, &c.config, window),
            key: c.key,
            instant: c.instant,
            kind: c.kind,
            config: c.config,
        })
        .collect()
}

/// Runs' renewals on one server list, as one pipeline: each one's answer, with when it was sent.
fn renew_together(links: &mut claim::Links, group: Vec<RunRenewal>) -> Vec<Answer> {
    let Some(Reach { config, within }) = reach(group.iter().map(|r| &r.config)) else {
        return Vec::new();
    };
    let helds: Vec<&Held> = group.iter().map(|r| &*r.held).collect();
    let sent = Instant::now();
    let renewed = masters(links, &config).renew_many(within, &helds);
    renewed
        .into_iter()
        .zip(group)
        .map(|(result, r)| Answer::Renewed {
            pid: r.pid,
            sent,
            result: result.map_err(|e| e.to_string()),
        })
        .collect()
}

/// Runs' releases on one server list, as one pipeline; each run is told how its release went
/// (one Redis did not take is owed: kept, and carried out again).
fn release_together(desk: &mut Desk, group: Vec<RunRelease>) -> Vec<Answer> {
    let Some(Reach { config, within }) = reach(group.iter().map(|r| &r.config)) else {
        return Vec::new();
    };
    let items: Vec<(&Held, &ReleaseOptions)> = group.iter().map(|r| (&*r.held, &*r.opts)).collect();
    let released = masters(&mut desk.links, &config).release_many(within, &items);
    let since = Instant::now();
    let mut answers = Vec::new();
    for (result, run) in released.into_iter().zip(group) {
        let RunRelease {
            config,
            held,
            opts,
            mut reply,
        } = run;
        let release = OwedRelease {
            config,
            held,
            opts,
            since,
        };
        answers.extend(settle_release(
            &mut desk.owed,
            release,
            Some(&mut reply),
            result,
        ));
    }
    answers
}

/// The releases owed, carried out again (as one pipeline per server list): what came of each
/// is told to the loop once Redis took it or it was given up; the others stay owed.
fn release_owed(
    desk: &mut Desk,
    due: Vec<OwedRelease>,
    tell: &mut dyn FnMut(Answer) -> Result<(), LoopGone>,
) -> Result<(), LoopGone> {
    for group in by_servers(due, |r| &r.config) {
        let Some(Reach { config, within }) = reach(group.iter().map(|r| &r.config)) else {
            continue;
        };
        // Bounded short: a server that hangs must not hold up the claims of the others every
        // AGAIN (a release sent to a stalled Redis is carried out as it wakes all the same).
        let within = within.min(OWED_WITHIN);
        let items: Vec<(&Held, &ReleaseOptions)> =
            group.iter().map(|r| (&*r.held, &*r.opts)).collect();
        let released = masters(&mut desk.links, &config).release_many(within, &items);
        for (result, release) in released.into_iter().zip(group) {
            for answer in settle_release(&mut desk.owed, release, None, result) {
                tell(answer)?;
            }
        }
    }
    Ok(())
}
