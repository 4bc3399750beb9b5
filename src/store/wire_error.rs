//! Why an exchange with Redis failed, as a value ([`WireError`]), and the small conversions the
//! link and the dialer share: what is left of a deadline, an I/O or TLS error in words.

use std::io;
use std::time::Duration;

use crate::clock::Instant;
use crate::store::resp::{self, Bad};

/// Why an exchange failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The deadline passed before the whole reply was there.
    Timeout,
    /// The connection could not be made, or broke (refused, reset, closed): what happened.
    Io(String),
    /// The server sent something that is not a Redis reply, or one larger than cronlock reads.
    Bad(Bad),
    /// The server refused the command: `CODE detail`.
    Server(String),
    /// The TLS layer refused: what rustls said.
    Tls(String),
    /// The connection held a frame nobody asked for before a command was sent: the command was
    /// not sent, and the connection must not be used again.
    Unasked,
}

impl WireError {
    /// The server's error code (`WRONGPASS`, `NOSCRIPT`, ...), if it refused.
    pub fn code(&self) -> Option<&str> {
        match self {
            WireError::Server(text) => text.split_whitespace().next(),
            _ => None,
        }
    }

    /// The server may have run the command even though no reply was read.
    pub fn maybe_ran(&self) -> bool {
        matches!(
            self,
            WireError::Timeout | WireError::Io(_) | WireError::Bad(_)
        )
    }

    /// Asking again (on a new connection) may work: the network or a server in transition, not
    /// the request, the credentials or the configuration.
    pub fn transient(&self) -> bool {
        match self {
            WireError::Server(_) => matches!(
                self.code(),
                Some(
                    "LOADING"
                        | "BUSY"
                        | "READONLY"
                        | "MASTERDOWN"
                        | "TRYAGAIN"
                        | "CLUSTERDOWN"
                        | "MOVED"
                        | "ASK"
                        | "NOREPLICAS"
                )
            ),
            WireError::Tls(_) => false,
            _ => true,
        }
    }
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Timeout => f.write_str("Redis did not answer in time"),
            WireError::Io(e) => f.write_str(e),
            WireError::Bad(Bad::TooLarge) => write!(
                f,
                "the server sent a reply larger than {} KiB, which no lock reply is",
                resp::MAX_REPLY / 1024
            ),
            WireError::Bad(Bad::Protocol(what)) => {
                write!(f, "the server did not answer like a Redis server ({what})")
            }
            WireError::Server(text) => f.write_str(text),
            WireError::Tls(e) => f.write_str(e),
            WireError::Unasked => f.write_str(
                "the server sent a reply nobody asked for (the connection was dropped unread)",
            ),
        }
    }
}

impl std::error::Error for WireError {}

/// What is left until `deadline`, or a timeout.
pub(super) fn left(deadline: Instant) -> Result<Duration, WireError> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        Err(WireError::Timeout)
    } else {
        Ok(d)
    }
}

pub(super) fn io_error(e: io::Error) -> WireError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => WireError::Timeout,
        _ => {
            // rustls errors come wrapped in io::Error.
            if let Some(tls) = e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            {
                return WireError::Tls(crate::store::tls::explain(tls));
            }
            WireError::Io(crate::log::io_text(&e))
        }
    }
}
