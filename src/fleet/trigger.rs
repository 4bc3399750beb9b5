//! `cronlock --trigger KEY [--reason TEXT] [--wait DURATION]`: ask a `--crontab` fleet to run KEY
//! once now, as a manual instant, under the job's own lock, suspension, `--limit` and `--retries`,
//! recorded in its ledger like any instant (with `manual`).
//!
//! The request goes in KEY's slot (`store::trigger`), and a poke to every fleet serving from this
//! Redis (`store::members`: the fleets are found with SCAN, again every half second while the
//! request waits, so a fleet that just started is told too); each replica reads its fleet's pokes
//! with its heartbeat, and one serving KEY claims the instant. So a KEY no replica serves is
//! known within [`ACCEPT_WITHIN`]: the request and the pokes are taken back, and nothing is left.
//! Once one took it, the pokes stay while the replicas look after it, so the others retry it
//! (`--retries`) when the one that took it dies.

use std::thread::sleep;
use std::time::Duration;

use anyhow::{anyhow, Result};

use crate::clock::{rfc3339, unix_millis, Instant};
use crate::exit::Exit;
use crate::fleet::describe::round_ms;
use crate::fleet::suspend::majority;
use crate::host;
use crate::record::ledger::LedgerEntry;
use crate::record::trigger::TriggerRequest;
use crate::record::Stored;
use crate::store::keys::Keys;
use crate::store::members::{fleet_of, fleets_pattern, Poke};
use crate::store::quorum::Masters;
use crate::store::trigger::Standing;

/// How long a replica has at least to accept the manual instant (and how long the fleets are
/// looked for): a few heartbeats of a fleet of up to 20 replicas; more for larger fleets, whose
/// heartbeats are rarer (`replica::beat::period`): see [`accept_within`].
pub const ACCEPT_WITHIN: Duration = Duration::from_secs(10);
/// How long the replicas look after a manual instant once one took it (`replica::manual`).
const FOLLOWED: Duration = Duration::from_secs(600);
/// How often the fleets are looked for while there is none.
const RESCAN: Duration = Duration::from_millis(500);
/// How often the request is looked at while waiting.
const POLL: Duration = Duration::from_millis(100);
/// How many instants are tried when the first is taken (two triggers in one millisecond).
const TRIES: i64 = 8;

/// What `--trigger` asks for.
pub struct TriggerAsked<'a> {
    pub reason: Option<&'a str>,
    /// `--wait`: wait this long for the run's end, and exit with its status.
    pub wait: Option<Duration>,
    /// `-E`: the status when the instant is skipped (suspended, or busy).
    pub conflict: u8,
}

/// What became of the trigger: the line for stdout (if any) and the exit status; a line for
/// stderr when the trigger was not carried out.
pub struct Triggered {
    pub out: String,
    pub said: Option<String>,
    pub exit: Exit,
}

/// `--trigger KEY`.
pub fn trigger(
    masters: &mut Masters,
    within: Duration,
    prefix: &str,
    keys: &Keys,
    asked: &TriggerAsked,
) -> Result<Triggered> {
    let began = Instant::now();
    let name = &keys.name;
    let fleets = live_fleets(masters, within, prefix, name)?;
    if fleets.is_empty() {
        return Ok(unserved(name, "no --crontab replica is live on this Redis"));
    }
    let instant = ask(masters, within, keys, asked.reason)?;
    let mut pokes = Pokes {
        within,
        prefix,
        poke: Poke {
            key: name.clone(),
            instant,
        },
        fleets: Vec::new(),
        largest: 0,
    };
    pokes.reach(masters, fleets);
    // `--wait` bounds the whole of it, the wait for a replica to take it too.
    let limit = asked.wait.map(|w| began + w);
    let accepted = wait_for_answer(masters, keys, &mut pokes, limit);
    let accept = accept_within(pokes.largest).min(asked.wait.unwrap_or(Duration::MAX));
    let Some(request) = accepted else {
        let answers = masters
            .untrigger(within, keys, instant)
            .into_iter()
            .map(|r| r.map_err(|e| anyhow!("{e}")))
            .collect();
        let back = majority(
            masters,
            answers,
            &format!("take back the trigger of '{name}'"),
        )?;
        if back {
            pokes.take_back(masters);
            let why = format!(
                "none of the {} live fleet(s) on this Redis took it within {}{}: none serves \
                 KEY, or all are at --max-jobs",
                pokes.fleets.len(),
                round_ms(accept.as_millis() as u64),
                if asked.wait.is_some_and(|w| w <= accept) {
                    " (--wait)"
                } else {
                    ""
                }
            );
            return Ok(unserved(name, &why));
        }
        // Accepted as it was taken back: carried on below.
        return follow(masters, within, keys, instant, asked, began);
    };
    if request.state.as_deref() == Some("skipped") {
        pokes.take_back(masters);
        return follow(masters, within, keys, instant, asked, began);
    }
    // Taken: the pokes stay, so every replica of the fleets learns of it (one that lost the
    // claim looks again when the winner's lock would lapse, with --retries).
    if asked.wait.is_none() && request.state.as_deref() == Some("queued") {
        return Ok(Triggered {
            out: format!(
                "lock '{name}': the manual instant {} waits for the run before it to end\n",
                rfc3339(instant.max(0) as u64)
            ),
            said: None,
            exit: Exit::Success,
        });
    }
    if asked.wait.is_none() {
        let by = request.by.as_deref().unwrap_or("a replica");
        return Ok(Triggered {
            out: format!(
                "lock '{name}': the manual instant {} was taken by {by}\n",
                rfc3339(instant.max(0) as u64)
            ),
            said: None,
            exit: Exit::Success,
        });
    }
    follow(masters, within, keys, instant, asked, began)
}

/// The fleets serving from this Redis (their members hashes, found with SCAN); looked for again
/// every [`RESCAN`] for up to [`ACCEPT_WITHIN`] while there is none (replicas that just started
/// have not sent their first heartbeat).
fn live_fleets(
    masters: &mut Masters,
    within: Duration,
    prefix: &str,
    name: &str,
) -> Result<Vec<String>> {
    let until = Instant::now() + ACCEPT_WITHIN;
    loop {
        let fleets: Vec<String> = masters
            .scan(&fleets_pattern(prefix), within)
            .map_err(|e| anyhow!("cannot look for the fleets serving '{name}': {e}"))?
            .iter()
            .filter_map(|k| fleet_of(prefix, k))
            .collect();
        if !fleets.is_empty() || Instant::now() >= until {
            return Ok(fleets);
        }
        sleep(RESCAN);
    }
}

/// Nobody serves KEY: one line, and the status that says so.
fn unserved(name: &str, why: &str) -> Triggered {
    Triggered {
        out: String::new(),
        said: Some(format!(
            "lock '{name}': no replica serving it took the trigger ({why}); nothing was left in \
             Redis"
        )),
        exit: Exit::Unserved,
    }
}

/// Write the request on a majority: its instant (the host's clock, as a label; the next
/// millisecond when taken).
fn ask(masters: &mut Masters, within: Duration, keys: &Keys, reason: Option<&str>) -> Result<i64> {
    let record = crate::record::to_text(&TriggerRequest {
        host: Some(host::hostname()),
        user: Some(host::user()),
        reason: Some(reason.unwrap_or("").to_string()),
        ..Default::default()
    });
    let first = unix_millis() as i64;
    for instant in first..first + TRIES {
        let answers = masters
            .trigger(within, keys, instant, &record)
            .into_iter()
            .map(|r| r.map_err(|e| anyhow!("{e}")))
            .collect();
        let name = &keys.name;
        if majority(masters, answers, &format!("trigger '{name}'"))? {
            return Ok(instant);
        }
        // Taken (somewhere): give back what was written, try the next millisecond.
        let _ = masters.untrigger(within, keys, instant);
    }
    Err(anyhow!(
        "cannot trigger '{}': every instant tried was taken",
        keys.name
    ))
}

/// Where the manual instant stands, by a majority.
fn standing(
    masters: &mut Masters,
    within: Duration,
    keys: &Keys,
    instant: i64,
) -> Option<Standing> {
    let answers = masters
        .trigger_standing(within, keys, instant)
        .into_iter()
        .map(|r| r.map_err(|e| anyhow!("{e}")))
        .collect();
    majority(masters, answers, "read the trigger").ok()
}

/// The fleets told of a manual instant, and the largest's size.
struct Pokes<'a> {
    within: Duration,
    prefix: &'a str,
    poke: Poke,
    fleets: Vec<String>,
    largest: usize,
}

impl Pokes<'_> {
    /// Poke those of `fleets` not poked yet (for as long as replicas look after a manual
    /// instant). A fleet that cannot be poked is one less that may take it; the wait says the
    /// rest.
    fn reach(&mut self, masters: &mut Masters, fleets: Vec<String>) {
        for fleet in fleets {
            if self.fleets.contains(&fleet) {
                continue;
            }
            if let Ok(n) = masters.poke(self.within, self.prefix, &fleet, &self.poke, FOLLOWED) {
                self.largest = self.largest.max(n);
            }
            self.fleets.push(fleet);
        }
    }

    /// Look for fleets that came since (a replica that just started), and poke them.
    fn reach_new(&mut self, masters: &mut Masters) {
        let found = masters.scan(&fleets_pattern(self.prefix), self.within);
        let fleets = found
            .map(|keys| {
                keys.iter()
                    .filter_map(|k| fleet_of(self.prefix, k))
                    .collect()
            })
            .unwrap_or_default();
        self.reach(masters, fleets);
    }

    /// Take every poke back.
    fn take_back(&self, masters: &mut Masters) {
        for fleet in &self.fleets {
            let _ = masters.poke(self.within, self.prefix, fleet, &self.poke, Duration::ZERO);
        }
    }
}

/// How long a fleet of `replicas` has to take a manual instant: two of its heartbeats' periods
/// and a claim (a fleet beats at most 3 times a second: each replica every second up to 3
/// replicas, every N/3 s above, `replica::beat::period`, whose tests hold this to it), at least
/// [`ACCEPT_WITHIN`].
pub fn accept_within(replicas: usize) -> Duration {
    let period = Duration::from_secs(replicas.max(1).div_ceil(3) as u64);
    ACCEPT_WITHIN.max(period * 2 + Duration::from_secs(2))
}

/// Wait for a replica to take the instant (accepted or skipped), as long as the largest fleet
/// poked needs ([`accept_within`]) and not past `limit` (`--wait`); fleets that come meanwhile
/// are poked too (every [`RESCAN`]).
fn wait_for_answer(
    masters: &mut Masters,
    keys: &Keys,
    pokes: &mut Pokes,
    limit: Option<Instant>,
) -> Option<TriggerRequest> {
    let (within, instant) = (pokes.within, pokes.poke.instant);
    let began = Instant::now();
    let mut rescan = began + RESCAN;
    loop {
        let request = standing(masters, within, keys, instant)
            .and_then(|s| s.request)
            .and_then(|r| Stored::<TriggerRequest>::read(&r).ours().cloned());
        if let Some(r) = request.filter(|r| r.state.as_deref() != Some("asked")) {
            return Some(r);
        }
        let now = Instant::now();
        if now >= began + accept_within(pokes.largest) || limit.is_some_and(|l| now >= l) {
            return None;
        }
        if now >= rescan {
            rescan = now + RESCAN;
            pokes.reach_new(masters);
        }
        sleep(POLL);
    }
}

/// After a replica took it: with `--wait`, wait for the run's end (its status, 124 when the wait
/// runs out); a skipped instant says why.
fn follow(
    masters: &mut Masters,
    within: Duration,
    keys: &Keys,
    instant: i64,
    asked: &TriggerAsked,
    began: Instant,
) -> Result<Triggered> {
    let name = &keys.name;
    let at = rfc3339(instant.max(0) as u64);
    let deadline = asked.wait.map(|w| began + w);
    loop {
        let now = standing(masters, within, keys, instant).unwrap_or_default();
        let request = now
            .request
            .as_deref()
            .and_then(|r| Stored::<TriggerRequest>::read(r).ours().cloned())
            .unwrap_or_default();
        let entry = now
            .entry
            .as_deref()
            .and_then(|e| Stored::<LedgerEntry>::read(e).ours().cloned());
        if let Some(done) = entry.as_ref().and_then(|e| ended(e, &request, asked)) {
            let ManualEnd { line, exit } = done;
            return Ok(Triggered {
                out: format!("lock '{name}': the manual instant {at} {line}\n"),
                said: None,
                exit,
            });
        }
        match deadline {
            Some(d) if Instant::now() >= d => {
                return Ok(Triggered {
                    out: String::new(),
                    said: Some(format!(
                        "lock '{name}': the manual instant {at} did not end within --wait {} (it \
                         goes on; cronlock --status {name} shows it)",
                        round_ms(asked.wait.unwrap_or_default().as_millis() as u64)
                    )),
                    exit: Exit::TimedOut,
                });
            }
            // Without --wait only a skip is followed here: it is written with the answer.
            None if entry.is_some() => {
                return Ok(Triggered {
                    out: format!("lock '{name}': the manual instant {at} was taken\n"),
                    said: None,
                    exit: Exit::Success,
                });
            }
            _ => sleep(POLL),
        }
    }
}

/// How a manual instant ended: the line that says so, and the exit status.
struct ManualEnd {
    line: String,
    exit: Exit,
}

impl ManualEnd {
    fn new(line: impl Into<String>, exit: Exit) -> ManualEnd {
        ManualEnd {
            line: line.into(),
            exit,
        }
    }
}

/// Whether the manual instant's entry is final, and how it ended: a failed, abandoned or interrupted attempt is final once the job's `--retries` are
/// spent.
fn ended(entry: &LedgerEntry, request: &TriggerRequest, asked: &TriggerAsked) -> Option<ManualEnd> {
    let state = entry.state.as_deref()?;
    let last = entry.attempts.last();
    let spent = entry.attempts.len() > request.retries.unwrap_or(0) as usize;
    let exit_of = |code: Option<i64>| Exit::Child(code.unwrap_or(1).clamp(0, 255) as u8);
    match state {
        "succeeded" => Some(ManualEnd::new("succeeded", Exit::Child(0))),
        "skipped" | "missed" => {
            let why = entry.reason_word().unwrap_or("suspended");
            Some(ManualEnd::new(
                format!("was {state} ({why})"),
                Exit::Conflict(asked.conflict),
            ))
        }
        "failed" if spent => {
            let code = last.and_then(|a| a.exit);
            Some(ManualEnd::new(
                format!("failed (exit {})", code.unwrap_or(1)),
                exit_of(code),
            ))
        }
        "abandoned" if spent => Some(ManualEnd::new(
            "was abandoned: its host died",
            Exit::LockLost,
        )),
        // --overlap replace: a later instant took its lock and stopped it.
        "replaced" => Some(ManualEnd::new(
            "was replaced by a later instant (--overlap replace)",
            Exit::LockLost,
        )),
        "interrupted" if spent => Some(ManualEnd::new(
            "was interrupted (its replica was stopped)",
            Exit::Signal(libc::SIGTERM),
        )),
        _ => None,
    }
}
