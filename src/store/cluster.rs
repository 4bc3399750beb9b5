//! Redis Cluster: `redis+cluster://` and `rediss+cluster://`.
//!
//! The slot map comes from `CLUSTER SLOTS`, asked of the first seed node that answers. Each call
//! goes to the primary that serves its KEY's slot (CRC16 of the hash tag, as Redis computes it);
//! a `MOVED` reply reads the map again from the node that sent it and tries there, an `ASK` reply
//! is followed once with `ASKING`. All of a KEY's Redis keys share one hash tag (see `keys::Keys`),
//! so every script stays on one node. Every exchange is bounded by the caller's deadline
//! ([`crate::store::wire`]); a call that fails drops the whole connection, so the next one starts from a
//! fresh slot map (that is how a renewal finds the replica promoted after its primary died).

use std::collections::HashMap;

use anyhow::{anyhow, Result};
use redis::Value;

use crate::clock::Instant;
use crate::store::failure::Failure;
use crate::store::resp::{Bad, Reply};
use crate::store::tls::TlsOptions;
use crate::store::url::{explain, HostsUrl, Node};
use crate::store::wire::{Addr, Session, Wire, WireError};

/// A cluster, known by its seed nodes.
pub struct Cluster {
    seeds: Vec<Addr>,
    session: Session,
}

/// An open connection to a cluster: its slot map and a connection per node used so far.
pub struct ClusterCon {
    /// (first slot, last slot, primary).
    slots: Vec<SlotRange>,
    nodes: HashMap<Addr, Wire>,
    session: Session,
}

/// How many redirections one call follows.
const REDIRECTS: usize = 3;

impl Cluster {
    /// Parse `redis+cluster://[user][:password@]host:port[,host:port...]`.
    pub fn parse(url: &str, source: &str, shown: &str, tls: &TlsOptions) -> Result<Cluster> {
        let invalid = |problem: &str| {
            anyhow!(
                "invalid {source}{}: {problem}",
                crate::store::url::scheme_shown(url)
            )
        };
        let u = HostsUrl::parse(url, Some(6379)).map_err(|p| invalid(&p))?;
        if !u.path.is_empty() {
            return Err(invalid(
                "a Redis Cluster has only database 0: expected \
                 redis+cluster://[user][:password@]host:port[,host:port...]",
            ));
        }
        if let Some((k, _)) = u.query.first() {
            return Err(invalid(&format!("unknown parameter '{k}'")));
        }
        let session = Session {
            tls: if u.tls {
                Some(tls.client_config()?)
            } else if tls.any() {
                anyhow::bail!(
                    "--tls-ca-cert, --tls-cert and --tls-key are for rediss+cluster:// URLs, and \
                     {source} is '{shown}'"
                );
            } else {
                None
            },
            user: u.user,
            password: u.password,
            db: 0,
        };
        let seeds = u.hosts;
        Ok(Cluster { seeds, session })
    }

    /// Connect to a seed node and read the slot map, by `deadline`.
    pub fn connect(&self, deadline: Instant) -> Result<ClusterCon, Failure> {
        let mut last = None;
        for seed in &self.seeds {
            let mut con = ClusterCon {
                slots: Vec::new(),
                nodes: HashMap::new(),
                session: self.session.clone(),
            };
            match con.refresh(seed, deadline) {
                Ok(()) => return Ok(con),
                Err(e @ WireError::Timeout) => {
                    return Err(Failure::connect(&e, format!("{seed}: {}", explain(&e))))
                }
                Err(e) => last = Some((seed, e)),
            }
        }
        let (seed, e) = last.expect("a cluster URL has a host");
        if matches!(&e, WireError::Server(t) if t.contains("cluster support disabled")) {
            return Err(Failure::Refused(anyhow!(
                "a seed node is not a Redis Cluster node (cluster support is off): use redis:// \
                 for a single server"
            )));
        }
        Err(Failure::connect(&e, format!("{seed}: {}", explain(&e))))
    }
}

impl Cluster {
    /// The primary that serves `key` now, and how to open a session on it.
    pub fn side(&self, key: &str, deadline: Instant) -> Result<Node> {
        let con = self.connect(deadline)?;
        let addr = con
            .owner(key_slot(key.as_bytes()))
            .cloned()
            .ok_or_else(|| anyhow!("no node of the cluster serves this KEY's slot"))?;
        Ok(Node {
            addr,
            session: self.session.clone(),
        })
    }
}

impl ClusterCon {
    /// The connection to `addr`, made if there is none.
    fn node(&mut self, addr: &Addr, deadline: Instant) -> Result<&mut Wire, WireError> {
        if !self.nodes.contains_key(addr) {
            let wire = Wire::connect(addr, &self.session, deadline)?;
            self.nodes.insert(addr.clone(), wire);
        }
        Ok(self.nodes.get_mut(addr).expect("just made"))
    }

    /// Read the slot map from `addr`.
    fn refresh(&mut self, addr: &Addr, deadline: Instant) -> Result<(), WireError> {
        let map = self
            .node(addr, deadline)?
            .call(&[b"CLUSTER", b"SLOTS"], deadline)?
            .ok()?;
        self.slots = slot_map(&map)?;
        Ok(())
    }

    fn owner(&self, slot: u16) -> Option<&Addr> {
        self.slots
            .iter()
            .find(|r| (r.first..=r.last).contains(&slot))
            .map(|r| &r.primary)
    }

    /// Run `args` on the primary that serves `key`'s slot, following redirections.
    pub fn call(
        &mut self,
        key: &str,
        args: &[&[u8]],
        deadline: Instant,
    ) -> Result<Reply, WireError> {
        let slot = key_slot(key.as_bytes());
        let mut asking: Option<Addr> = None;
        for _ in 0..REDIRECTS {
            let (addr, ask) =
                match asking.take() {
                    Some(a) => (a, true),
                    None => match self.owner(slot) {
                        Some(a) => (a.clone(), false),
                        None => return Err(WireError::Io(
                            "no node of the cluster serves this KEY's slot (is the cluster down?)"
                                .into(),
                        )),
                    },
                };
            let wire = self.node(&addr, deadline)?;
            if ask {
                wire.call(&[b"ASKING"], deadline)?.ok()?;
            }
            let reply = match wire.call(args, deadline) {
                Ok(r) => r,
                Err(e) => {
                    self.nodes.remove(&addr);
                    return Err(e);
                }
            };
            let Reply::Error(text) = &reply else {
                return Ok(reply);
            };
            let mut words = text.split_whitespace();
            match (words.next(), words.nth(1)) {
                (Some("MOVED"), Some(to)) => {
                    let to = parse_addr(to).ok_or(WireError::Bad(Bad::Protocol("a bad MOVED")))?;
                    self.refresh(&to, deadline)?;
                }
                (Some("ASK"), Some(to)) => {
                    asking =
                        Some(parse_addr(to).ok_or(WireError::Bad(Bad::Protocol("a bad ASK")))?);
                }
                _ => return Ok(reply),
            }
        }
        Err(WireError::Io(
            "the cluster kept redirecting the call (resharding?)".into(),
        ))
    }

    /// Every primary in the slot map, once each.
    pub fn primaries(&self) -> Vec<Addr> {
        let mut out: Vec<Addr> = Vec::new();
        for SlotRange { primary: addr, .. } in &self.slots {
            if !out.contains(addr) {
                out.push(addr.clone());
            }
        }
        out
    }

    /// Run `args` on the primary `addr`.
    pub fn call_at(
        &mut self,
        addr: &Addr,
        args: &[&[u8]],
        deadline: Instant,
    ) -> Result<Reply, WireError> {
        self.node(addr, deadline)?.call(args, deadline)
    }
}

/// `host:port` as Redis writes it in a redirection.
fn parse_addr(text: &str) -> Option<Addr> {
    let (host, port) = text.rsplit_once(':')?;
    Some(Addr::Tcp {
        host: host.trim_matches(['[', ']']).to_string(),
        port: port.parse().ok()?,
    })
}

/// One range of slots of a `CLUSTER SLOTS` reply, and the primary that serves it.
struct SlotRange {
    first: u16,
    last: u16,
    primary: Addr,
}

/// The ranges of a `CLUSTER SLOTS` reply.
fn slot_map(map: &Value) -> Result<Vec<SlotRange>, WireError> {
    let bad = || WireError::Bad(Bad::Protocol("a CLUSTER SLOTS reply of the wrong shape"));
    let Value::Array(ranges) = map else {
        return Err(bad());
    };
    let mut out = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err(bad());
        };
        let (Some(Value::Int(a)), Some(Value::Int(b)), Some(Value::Array(node))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            return Err(bad());
        };
        let host = match node.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            _ => return Err(bad()),
        };
        let Some(Value::Int(port)) = node.get(1) else {
            return Err(bad());
        };
        let (Ok(a), Ok(b), Ok(port)) = (u16::try_from(*a), u16::try_from(*b), u16::try_from(*port))
        else {
            return Err(bad());
        };
        if !host.is_empty() {
            out.push(SlotRange {
                first: a,
                last: b,
                primary: Addr::tcp(host, port),
            });
        }
    }
    if out.is_empty() {
        return Err(WireError::Io(
            "no node of the cluster serves any slot (is the cluster down?)".into(),
        ));
    }
    Ok(out)
}

/// The slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the first `{` and the
/// next `}`, when not empty), modulo 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) % 16384
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_slots() {
        // From the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(key_slot(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
    }
}
