//! Why a call on a [link](crate::store::topology::Link) failed, with its kind as a type: no
//! connection (that may come), a refusal asking again cannot mend (credentials, ACL, a server
//! that is not what the URL says), a failed call ([`WireError`]), or too few replicas.
//!
//! It exists so that every caller decides "retry or give up" the same way, by
//! [`Failure::transient`], from the server's look-ups (Sentinel, Cluster) up to the release.

use std::fmt;

use anyhow::anyhow;

use crate::store::resp::Bad;
use crate::store::url::explain;
use crate::store::wire::WireError;

/// Why a call failed.
#[derive(Debug)]
pub enum Failure {
    /// No connection could be made: nothing was sent.
    Connect(anyhow::Error),
    /// The server refused the connection for good (credentials, ACL, database): asking again
    /// cannot help.
    Refused(anyhow::Error),
    /// The call was sent and failed: Redis's error, no whole reply in time, or a reply of the
    /// wrong shape.
    Call(WireError),
    /// `--min-replicas`: fewer replicas than asked acknowledged the write in time.
    Replicas { acked: u32, wanted: u32 },
    /// A write on a Sentinel's primary that a failover may drop (its replica was promoted, or
    /// the replicas did not confirm it in time): see [`crate::store::durable`].
    NotDurable(String),
}

impl Failure {
    /// Redis may have run the call even though we got no reply we could use.
    pub fn maybe_ran(&self) -> bool {
        matches!(self, Failure::Call(e) if e.maybe_ran())
    }

    /// Worth another try on a new connection: the server or the network, not the request.
    pub fn transient(&self) -> bool {
        match self {
            Failure::Connect(_) | Failure::Replicas { .. } | Failure::NotDurable(_) => true,
            Failure::Refused(_) => false,
            Failure::Call(e) => e.transient(),
        }
    }

    /// The same failure again, for each of the calls one failure ended (a pipeline's).
    pub fn duplicate(&self) -> Failure {
        match self {
            Failure::Connect(e) => Failure::Connect(anyhow!("{e:#}")),
            Failure::Refused(e) => Failure::Refused(anyhow!("{e:#}")),
            Failure::Call(e) => Failure::Call(e.clone()),
            Failure::Replicas { acked, wanted } => Failure::Replicas {
                acked: *acked,
                wanted: *wanted,
            },
            Failure::NotDurable(text) => Failure::NotDurable(text.clone()),
        }
    }

    /// A reply of the wrong type or shape for `what`.
    pub fn shape(what: &'static str) -> Failure {
        Failure::Call(WireError::Bad(Bad::Protocol(what)))
    }

    /// No connection: `message` about `e`, refused for good when asking again cannot help
    /// ([`WireError::transient`]).
    pub fn connect(e: &WireError, message: String) -> Failure {
        if e.transient() {
            Failure::Connect(anyhow!(message))
        } else {
            Failure::Refused(anyhow!(message))
        }
    }

    /// No connection, for a reason that may pass (a look-up that found no primary yet, a
    /// failover under way).
    pub fn unreachable(message: String) -> Failure {
        Failure::Connect(anyhow!(message))
    }

    /// The server's error code (`WRONGTYPE`, `NOPERM`, ...), when it refused the call.
    pub fn code(&self) -> Option<&str> {
        match self {
            Failure::Call(e) => e.code(),
            _ => None,
        }
    }

    /// The same failure, of the same kind, said with `before` in front (`cannot connect to
    /// Redis at URL: `).
    pub fn context(self, before: &str) -> Failure {
        match self {
            Failure::Connect(e) => Failure::Connect(anyhow!("{before}{e:#}")),
            Failure::Refused(e) => Failure::Refused(anyhow!("{before}{e:#}")),
            other => other,
        }
    }
}

/// A look-up step that reports through `anyhow` (asking the sentinels) failed: a connection that
/// may be made later.
impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Failure {
        Failure::Connect(e)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Connect(e) | Failure::Refused(e) => write!(f, "{e:#}"),
            Failure::Call(e) => f.write_str(&explain(e)),
            Failure::Replicas { acked, wanted } => write!(
                f,
                "only {acked} of the {wanted} replicas asked for (--min-replicas) confirmed it in time"
            ),
            Failure::NotDurable(text) => f.write_str(text),
        }
    }
}

impl std::error::Error for Failure {}
