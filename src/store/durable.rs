//! Writes a Sentinel failover keeps: a claim on the primary the sentinels name counts only once
//! the replicas that could replace that primary hold it.
//!
//! Replication is asynchronous and a Sentinel failover is not coordinated: the sentinels promote a
//! replica (`REPLICAOF NO ONE`), and the old primary goes on taking writes until they reconfigure
//! it, about a second later, as a replica of the new one, which drops them. A claim written there
//! in that second is lost, and the instant would run again on the new primary. So a grant on a
//! Sentinel's primary is confirmed (see [`crate::store::topology::Link::confirm`]):
//!
//! - [`Replicas`] remembers the replicas each primary reported attached (`ROLE`, asked with
//!   every confirmation, in the pipeline of its first `WAIT`: a replica attached a moment ago is
//!   waited for too) and those the sentinels list for it: a replica that was promoted has left
//!   the old primary's own list, so its list alone would say "no replica, nothing to wait for".
//!   It is kept per primary, since while a failover is under way the sentinels may name the old
//!   primary and the new one in turn;
//! - the write counts once `WAIT` says every replica remembered has it (one round trip to them,
//!   well under a millisecond on a LAN);
//! - when fewer acknowledge it, each one remembered is asked where it stands (`INFO replication`) at once. One that says it
//!   is a primary was promoted, and one that follows another primary was moved there by a
//!   failover: this primary's writes may be dropped, so the write does not count
//!   ([`Shortfall::FailingOver`]) and is tried again, on the new primary once the sentinels name
//!   it. One that gives the same answer for [`MISSING_FOR`] no longer holds writes back: a
//!   failover would have named another primary by then. One whose link to this primary is down,
//!   the old primary this one took over from (its `master_replid` is this one's
//!   `master_replid2`), which says it is a primary until Sentinel reconfigures it seconds later,
//!   and one that does not answer in a quarter second (nothing listens, frozen, a host that is
//!   down) cannot be promoted with this primary's writes: the write counts on those left, and
//!   it is not waited for a moment ([`EXCUSED_FOR`], longer while it stays silent). One
//!   attached but behind is waited for, within the bound; one that the deadline leaves no time
//!   to ask holds the write back.
//! - a replica is never forgotten (only excused a while), so a connection that made no write
//!   while it was attached again still waits for it, and still sees it promoted.
//!
//! Without replicas (none ever reported), nothing is waited for: no failover can lose the write.

use std::sync::Mutex;
use std::time::Duration;

use redis::Value;

use crate::clock::Instant;
use crate::store::resp::Reply;
use crate::store::wire::{Addr, Session, Wire, WireError};

/// How long one `WAIT` may take before the replicas that did not acknowledge are asked why.
const STEP: Duration = Duration::from_millis(50);

/// How long a replica may be promoted or follow another primary before it no longer holds the
/// primary's writes back (meanwhile they do not count).
pub const MISSING_FOR: Duration = Duration::from_secs(10);

/// The longest gap between two findings of a replica missing that still counts as one stretch:
/// a replica found promoted now and long ago may have followed this primary in between.
const MISSING_GAP: Duration = Duration::from_secs(2);

/// How long a replica that cannot be promoted with this primary's writes (see [`Role::Gone`]) is
/// not waited for. Then it is waited for, and asked, again: a replica is never forgotten, since
/// a connection that makes no write for a while would otherwise not know it when it is attached
/// again and promoted.
const EXCUSED_FOR: Duration = Duration::from_secs(1);

/// The longest a replica that does not answer is not waited for (its excuse doubles from
/// [`EXCUSED_FOR`] while it stays silent): a host that is down costs a confirmation a quarter
/// second that often.
const SILENT_FOR: Duration = Duration::from_secs(4);

/// How long a replica is given to say where it stands.
const ASK_FOR: Duration = Duration::from_millis(250);

/// The most replicas remembered of one primary (a bound on what a hostile `ROLE` reply can add).
const MAX_REPLICAS: usize = 64;

/// The most primaries whose replicas are remembered (the oldest is forgotten first).
const MAX_PRIMARIES: usize = 16;

/// The replicas each primary reported attached.
#[derive(Default)]
pub struct Replicas {
    /// Each primary (the newest last) and its replicas.
    known: Mutex<Vec<(Addr, Vec<Standby>)>>,
}

/// A replica of a primary (one that could replace it), as this process last found it.
struct Standby {
    addr: Addr,
    /// Since when it has not followed the primary (promoted, or following another one), and
    /// when it was last found so.
    missing: Option<(Instant, Instant)>,
    /// Not waited for until then (it cannot be promoted with the primary's writes).
    excused_until: Option<Instant>,
    /// How long its last excuse for not answering was.
    silent: Duration,
}

/// Why a write on the primary does not count yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shortfall {
    /// A replica of this primary is a primary itself or follows another one: a failover may be
    /// under way, and what this primary takes now may be dropped.
    FailingOver { replica: Addr, says: &'static str },
    /// `acked` of the `wanted` replicas attached acknowledged it in time.
    Behind { acked: u32, wanted: u32 },
    /// The `WAIT` itself failed.
    Call(WireError),
}

impl std::fmt::Display for Shortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Shortfall::FailingOver { replica, says } => write!(
                f,
                "its replica {replica} {says} (a failover under way?): a write there may be \
                 dropped"
            ),
            Shortfall::Behind { acked, wanted } => write!(
                f,
                "only {acked} of its {wanted} replicas confirmed the write in time"
            ),
            Shortfall::Call(e) => write!(f, "WAIT failed: {e}"),
        }
    }
}

impl Replicas {
    /// `primary` answered `ROLE` with this reply: remember the replicas it lists, beside those
    /// it listed before; those it lists are attached, so waited for again.
    pub fn reported(&self, primary: &Addr, role: &Value) {
        self.remember(primary, attached(role), true);
    }

    /// The sentinels that name `primary` know these replicas for it: remember them too.
    pub fn known_to_sentinels(&self, primary: &Addr, replicas: &[Addr]) {
        self.remember(primary, replicas.to_vec(), false);
    }

    /// Remember `listed` as replicas of `primary`, beside those remembered before; `attached`:
    /// the primary itself lists them, and their excuses end.
    fn remember(&self, primary: &Addr, listed: Vec<Addr>, attached: bool) {
        self.with(primary, |replicas| {
            for r in listed {
                if let Some(known) = replicas.iter_mut().find(|k| k.addr == r) {
                    if attached {
                        known.missing = None;
                        known.excused_until = None;
                        known.silent = Duration::ZERO;
                    }
                } else if replicas.len() < MAX_REPLICAS && r != *primary {
                    replicas.push(Standby {
                        addr: r,
                        missing: None,
                        excused_until: None,
                        silent: Duration::ZERO,
                    });
                }
            }
        });
    }

    /// Run `f` on the replicas remembered of `primary` (a new, empty entry if none).
    fn with<T>(&self, primary: &Addr, f: impl FnOnce(&mut Vec<Standby>) -> T) -> T {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let at = match known.iter().position(|(p, _)| p == primary) {
            Some(at) => at,
            None => {
                if known.len() >= MAX_PRIMARIES {
                    known.remove(0);
                }
                known.push((primary.clone(), Vec::new()));
                known.len() - 1
            }
        };
        f(&mut known[at].1)
    }

    /// The replicas of `primary` to wait for now: those remembered and not excused.
    fn of(&self, primary: &Addr) -> Vec<Addr> {
        let now = Instant::now();
        self.with(primary, |replicas| {
            replicas
                .iter()
                .filter(|r| r.excused_until.is_none_or(|until| until <= now))
                .map(|r| r.addr.clone())
                .collect()
        })
    }

    /// `replica` cannot be promoted with `primary`'s writes now (`silent`: it did not answer):
    /// not waited for a while.
    fn excuse(&self, primary: &Addr, replica: &Addr, silent: bool) {
        self.with(primary, |replicas| {
            if let Some(r) = replicas.iter_mut().find(|r| r.addr == *replica) {
                let excused = if silent {
                    r.silent = (r.silent * 2).clamp(EXCUSED_FOR, SILENT_FOR);
                    r.silent
                } else {
                    r.silent = Duration::ZERO;
                    EXCUSED_FOR
                };
                r.excused_until = Some(Instant::now() + excused);
            }
        })
    }

    /// `replica` did (`false`) or did not (`true`) follow `primary` when asked: how long it has
    /// not, as found without a break (asked again within [`MISSING_GAP`] each time).
    fn missing(&self, primary: &Addr, replica: &Addr, now_missing: bool) -> Duration {
        let now = Instant::now();
        self.with(primary, |replicas| {
            let Some(r) = replicas.iter_mut().find(|r| r.addr == *replica) else {
                return Duration::ZERO;
            };
            let since = match r.missing {
                Some((since, seen))
                    if now_missing && now.saturating_duration_since(seen) <= MISSING_GAP =>
                {
                    since
                }
                _ => now,
            };
            r.missing = now_missing.then_some((since, now));
            now.saturating_duration_since(since)
        })
    }

    /// Wait (by `deadline`) until every write made on `wire`, a connection to `primary`, is held
    /// by the replicas that could replace it (see the module comment), and by `at_least` of
    /// them (`--min-replicas`). Fewer replicas attached than `at_least` fail at once: the caller
    /// tries again soon, rather than holding its thread. `session` opens a connection to a replica.
    pub fn confirm(
        &self,
        wire: &mut Wire,
        primary: &Addr,
        session: &Session,
        at_least: u32,
        deadline: Instant,
    ) -> Result<(), Shortfall> {
        // The primary's own list, read with the first WAIT (one round trip): a replica attached
        // a moment ago is waited for too, and one promoted since is still remembered.
        let mut first = true;
        loop {
            let remembered = self.of(primary);
            let step = deadline
                .saturating_duration_since(Instant::now())
                .min(STEP)
                .max(Duration::from_millis(1));
            let wanted = (remembered.len() as u32).max(at_least);
            let mut acked = if first {
                first = false;
                let RoleAndAcks { role, acked } = role_and_wait(wire, wanted, step, deadline)?;
                self.reported(primary, &role);
                acked
            } else {
                wait(wire, wanted, step, deadline)?
            };
            let replicas = self.of(primary);
            if (replicas.len() as u32) < at_least {
                return Err(Shortfall::Behind {
                    acked: replicas.len() as u32,
                    wanted: at_least,
                });
            }
            if replicas.is_empty() {
                return Ok(());
            }
            let wanted = (replicas.len() as u32).max(at_least);
            if replicas.len() > remembered.len() && acked < wanted {
                // One attached since: wait for it too.
                acked = wait(wire, wanted, step, deadline)?;
            }
            if acked >= wanted {
                return Ok(());
            }
            // Fewer than all: ask each one why, at once.
            let ours = replication(wire, deadline);
            let mut excused = 0;
            for r in &replicas {
                let says = match role_of(r, primary, ours.as_ref(), session, deadline) {
                    Role::Following => {
                        self.missing(primary, r, false);
                        continue;
                    }
                    Role::Gone => {
                        self.excuse(primary, r, false);
                        excused += 1;
                        continue;
                    }
                    Role::Silent => {
                        self.excuse(primary, r, true);
                        excused += 1;
                        continue;
                    }
                    // Out of time: nothing can excuse it.
                    Role::Unasked => return Err(Shortfall::Behind { acked, wanted }),
                    Role::Promoted => "was promoted",
                    Role::Elsewhere => "follows another primary",
                };
                if self.missing(primary, r, true) < MISSING_FOR {
                    return Err(Shortfall::FailingOver {
                        replica: r.clone(),
                        says,
                    });
                }
                self.excuse(primary, r, false);
                excused += 1;
            }
            let left = (replicas.len() - excused) as u32;
            if acked >= left && acked >= at_least {
                return Ok(());
            }
            if Instant::now() >= deadline || left < at_least {
                return Err(Shortfall::Behind {
                    acked,
                    wanted: left.max(at_least),
                });
            }
        }
    }
}

/// What [`role_and_wait`] read: the primary's reply to `ROLE`, and how many replicas acknowledged
/// every write made on the connection.
struct RoleAndAcks {
    role: Value,
    acked: u32,
}

/// `ROLE` and `WAIT wanted` for up to `step`, as one pipeline.
fn role_and_wait(
    wire: &mut Wire,
    wanted: u32,
    step: Duration,
    deadline: Instant,
) -> Result<RoleAndAcks, Shortfall> {
    let ms = step.as_millis().max(1).to_string();
    let wanted = wanted.to_string();
    let call_by = deadline.max(Instant::now() + step + Duration::from_millis(250));
    let replies = wire
        .call_many(
            &[&[b"ROLE"], &[b"WAIT", wanted.as_bytes(), ms.as_bytes()]],
            call_by,
        )
        .map_err(Shortfall::Call)?;
    let mut replies = replies.into_iter();
    let (Some(role), Some(acked)) = (replies.next(), replies.next()) else {
        return Err(Shortfall::Call(WireError::Bad(
            crate::store::resp::Bad::Protocol("a pipeline without its replies"),
        )));
    };
    let role = role.ok().map_err(Shortfall::Call)?;
    Ok(RoleAndAcks {
        role,
        acked: count(acked.ok().map_err(Shortfall::Call)?)?,
    })
}

/// `WAIT`'s reply: a count.
fn count(reply: Value) -> Result<u32, Shortfall> {
    match reply {
        Value::Int(n) => Ok(n.clamp(0, i64::from(u32::MAX)) as u32),
        _ => Err(Shortfall::Call(WireError::Bad(
            crate::store::resp::Bad::Protocol("a WAIT reply that is not a count"),
        ))),
    }
}

/// `WAIT wanted` for up to `step` (its own timeout, in ms, ends before `deadline`): how many
/// replicas acknowledged every write made on `wire`.
fn wait(wire: &mut Wire, wanted: u32, step: Duration, deadline: Instant) -> Result<u32, Shortfall> {
    let ms = step.as_millis().max(1).to_string();
    let wanted = wanted.to_string();
    // The reply comes after WAIT's own timeout: the call's deadline leaves room for it.
    let call_by = deadline.max(Instant::now() + step + Duration::from_millis(250));
    let reply = wire
        .call(&[b"WAIT", wanted.as_bytes(), ms.as_bytes()], call_by)
        .and_then(Reply::ok)
        .map_err(Shortfall::Call)?;
    count(reply)
}

/// What a replica said of itself.
enum Role {
    /// It is a primary now (and not one this primary took over from).
    Promoted,
    /// It replicates this primary over a link that is up (and is only behind).
    Following,
    /// It replicates another primary.
    Elsewhere,
    /// Nothing listens there, its link to this primary is down, or it is the old primary this
    /// one took over from, not yet reconfigured.
    Gone,
    /// It did not answer in time (frozen, too slow, a host that is down), or nothing listens.
    Silent,
    /// Not asked: the confirmation's deadline leaves it less than [`ASK_FOR`] to answer.
    Unasked,
}

/// A server's replication history (`INFO replication`): its role, the primary it follows, and the
/// ids of its history (a promoted replica keeps its old primary's id as its second one).
struct Replication {
    master: bool,
    master_port: Option<u16>,
    link_up: bool,
    replid: String,
    replid2: String,
}

/// No second id (`master_replid2` of a server that was never promoted).
const NO_ID: &str = "0000000000000000000000000000000000000000";

impl Replication {
    fn read(reply: &Value) -> Option<Replication> {
        let text = match reply {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::VerbatimString { text, .. } => text.clone(),
            _ => return None,
        };
        let field = |k: &str| {
            text.lines()
                .find_map(|l| l.trim_end().strip_prefix(k)?.strip_prefix(':'))
                .map(str::to_string)
        };
        Some(Replication {
            master: field("role")? == "master",
            master_port: field("master_port").and_then(|p| p.parse().ok()),
            link_up: field("master_link_status").as_deref() == Some("up"),
            replid: field("master_replid").unwrap_or_default(),
            replid2: field("master_replid2").unwrap_or_default(),
        })
    }

    /// Whether `other`, a primary too, is one this server took over from (its history goes on
    /// from `other`'s): an old primary not yet reconfigured, whose writes a failover drops, not
    /// this one's.
    fn succeeded(&self, other: &Replication) -> bool {
        self.replid2 != NO_ID && !self.replid2.is_empty() && self.replid2 == other.replid
    }
}

/// `INFO replication` on `wire`, by `deadline`.
fn replication(wire: &mut Wire, deadline: Instant) -> Option<Replication> {
    let reply = wire
        .call(&[b"INFO", b"replication"], deadline)
        .and_then(Reply::ok)
        .ok()?;
    Replication::read(&reply)
}

/// Ask `replica` where it stands, by `deadline` (at most a quarter second). `ours`: the history
/// of `primary`, when it could be read.
fn role_of(
    replica: &Addr,
    primary: &Addr,
    ours: Option<&Replication>,
    session: &Session,
    deadline: Instant,
) -> Role {
    let by = Instant::now() + ASK_FOR;
    if deadline < by {
        return Role::Unasked;
    }
    // Silent (refused, frozen, too slow): the sentinels cannot promote it either while it says
    // nothing, and it is asked again soon.
    let Some(theirs) = Wire::connect(replica, session, by)
        .ok()
        .and_then(|mut wire| replication(&mut wire, by))
    else {
        return Role::Silent;
    };
    if theirs.master {
        // The old primary this one replaced, not yet told: nothing of ours is there to lose.
        return match ours {
            Some(ours) if ours.succeeded(&theirs) => Role::Gone,
            _ => Role::Promoted,
        };
    }
    let same = matches!(primary, Addr::Tcp { port, .. } if Some(*port) == theirs.master_port);
    match (same, theirs.link_up) {
        (true, true) => Role::Following,
        (true, false) => Role::Gone,
        (false, _) => Role::Elsewhere,
    }
}

/// The replicas a primary's `ROLE` reply lists: `["master", offset, [[ip, port, offset], ...]]`.
fn attached(role: &Value) -> Vec<Addr> {
    let Value::Array(parts) = role else {
        return Vec::new();
    };
    let Some(Value::Array(list)) = parts.get(2) else {
        return Vec::new();
    };
    list.iter()
        .take(MAX_REPLICAS)
        .filter_map(|r| match r {
            Value::Array(f) => match (f.first(), f.get(1)) {
                (Some(Value::BulkString(ip)), Some(Value::BulkString(port))) => {
                    let port = std::str::from_utf8(port).ok()?.parse().ok()?;
                    Some(Addr::Tcp {
                        host: String::from_utf8_lossy(ip).into_owned(),
                        port,
                    })
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_primarys_role_lists_its_replicas() {
        let role = Value::Array(vec![
            bulk("master"),
            Value::Int(42),
            Value::Array(vec![
                Value::Array(vec![bulk("127.0.0.1"), bulk("6380"), bulk("42")]),
                Value::Array(vec![bulk("10.0.0.2"), bulk("6381"), bulk("40")]),
            ]),
        ]);
        assert_eq!(
            attached(&role),
            vec![
                Addr::Tcp {
                    host: "127.0.0.1".into(),
                    port: 6380
                },
                Addr::Tcp {
                    host: "10.0.0.2".into(),
                    port: 6381
                }
            ]
        );
        assert!(attached(&Value::Nil).is_empty());
    }

    #[test]
    fn replicas_are_remembered_per_primary() {
        let one = Addr::Tcp {
            host: "127.0.0.1".into(),
            port: 1,
        };
        let two = Addr::Tcp {
            host: "127.0.0.1".into(),
            port: 2,
        };
        let role = |port: &str| {
            Value::Array(vec![
                bulk("master"),
                Value::Int(0),
                Value::Array(vec![Value::Array(vec![
                    bulk("127.0.0.1"),
                    bulk(port),
                    bulk("0"),
                ])]),
            ])
        };
        let r = Replicas::default();
        r.reported(&one, &role("7"));
        // The promoted replica left the list: still remembered for this primary.
        r.reported(
            &one,
            &Value::Array(vec![bulk("master"), Value::Int(0), Value::Array(vec![])]),
        );
        assert_eq!(r.of(&one), vec![Addr::tcp("127.0.0.1", 7)]);
        r.reported(&two, &role("1"));
        // The old primary, named again while the sentinels disagree, keeps its promoted replica.
        assert_eq!(r.of(&one), vec![Addr::tcp("127.0.0.1", 7)]);
        assert_eq!(
            r.of(&two),
            vec![Addr::Tcp {
                host: "127.0.0.1".into(),
                port: 1,
            }]
        );
        // Excused a while (it cannot be promoted with this primary's writes), never forgotten:
        // listed attached again, it is waited for at once.
        r.excuse(
            &two,
            &Addr::Tcp {
                host: "127.0.0.1".into(),
                port: 1,
            },
            false,
        );
        assert!(r.of(&two).is_empty());
        r.reported(&two, &role("1"));
        assert_eq!(
            r.of(&two),
            vec![Addr::Tcp {
                host: "127.0.0.1".into(),
                port: 1,
            }]
        );
    }
}
