//! One connection to one Redis server, where every exchange has a deadline for the whole of it.
//!
//! It exists because a socket timeout bounds each read, not a command: a server that drips one
//! byte every 0.3 s never lets a read time out, and a general client would wait for as long as the
//! server likes. Here the connect, the TLS handshake, `AUTH`, `SELECT` and every command finish by
//! the deadline given or fail as a timeout: before each read or write the socket's timeout is set
//! to what is left. Replies are read with [`crate::store::resp`]'s bound on their size.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;

use redis::Value;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use crate::clock::Instant;
use crate::store::dial::{handshake, tcp_connect, unix_connect, Bounded};
use crate::store::resp::{self, Bad, Reply};
use crate::store::tls;
pub use crate::store::wire_error::WireError;
use crate::store::wire_error::{io_error, left};

/// Where a server listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Addr {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl Addr {
    /// A TCP server's address.
    pub fn tcp(host: impl Into<String>, port: u16) -> Addr {
        Addr::Tcp {
            host: host.into(),
            port,
        }
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Addr::Tcp { host, port } => write!(f, "{host}:{port}"),
            Addr::Unix(p) => write!(f, "{}", p.display()),
        }
    }
}

/// How to open a session on a server: TLS, credentials, database.
#[derive(Clone, Default)]
pub struct Session {
    pub tls: Option<Arc<ClientConfig>>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub db: i64,
}

enum Socket {
    Tcp(Bounded<TcpStream>),
    Unix(Bounded<UnixStream>),
    Tls(Box<StreamOwned<ClientConnection, Bounded<TcpStream>>>),
}

impl Socket {
    /// Every socket call from now on ends by `deadline`.
    fn bound(&mut self, deadline: Instant) {
        match self {
            Socket::Tcp(s) => s.deadline = deadline,
            Socket::Unix(s) => s.deadline = deadline,
            Socket::Tls(s) => s.sock.deadline = deadline,
        }
    }

    fn io(&mut self) -> &mut dyn ReadWrite {
        match self {
            Socket::Tcp(s) => s,
            Socket::Unix(s) => s,
            Socket::Tls(s) => &mut **s,
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Socket::Tcp(s) => s.sock.as_fd(),
            Socket::Unix(s) => s.sock.as_fd(),
            Socket::Tls(s) => s.sock.sock.as_fd(),
        }
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// An open connection; the caller drops it after any failure (see [`crate::store::topology`]).
pub struct Wire {
    stream: Socket,
    /// Bytes read past the last reply.
    buf: Vec<u8>,
    /// A command was sent on this connection.
    asked: bool,
}

impl Wire {
    /// Connect to `addr` and open a session, all by `deadline`.
    pub fn connect(addr: &Addr, session: &Session, deadline: Instant) -> Result<Wire, WireError> {
        let stream = match addr {
            Addr::Unix(path) => Socket::Unix(Bounded::new(unix_connect(path, deadline)?, deadline)),
            Addr::Tcp { host, port } => {
                let tcp = Bounded::new(tcp_connect(host, *port, deadline)?, deadline);
                match &session.tls {
                    None => Socket::Tcp(tcp),
                    Some(config) => Socket::Tls(Box::new(handshake(host, tcp, config)?)),
                }
            }
        };
        let mut wire = Wire {
            stream,
            buf: Vec::new(),
            asked: false,
        };
        if let Some(pw) = &session.password {
            let mut args: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(u) = &session.user {
                args.push(u.as_bytes());
            }
            args.push(pw.as_bytes());
            wire.call(&args, deadline)?.ok()?;
        }
        if session.db != 0 {
            let db = session.db.to_string();
            wire.call(&[b"SELECT", db.as_bytes()], deadline)?.ok()?;
        }
        Ok(wire)
    }

    /// Send one command and read its reply, all by `deadline`. A server's refusal is a reply
    /// (`Reply::Error`): the connection is still good.
    ///
    /// Every reply must answer its own request: a connection with anything waiting to be read
    /// before the command is sent (a frame nobody asked for) is not used
    /// ([`WireError::Unasked`], nothing sent), and a reply followed by more bytes is a broken
    /// server ([`Bad`]), since which frame answers which request can no longer be told. Either
    /// way the caller drops the connection and never reads it again.
    pub fn call(&mut self, args: &[&[u8]], deadline: Instant) -> Result<Reply, WireError> {
        let mut replies = self.call_many(&[args], deadline)?;
        Ok(replies.remove(0))
    }

    /// [`Wire::call`] for several commands at once (a pipeline: one write, and the server reads
    /// them in one go): their replies in order, all by `deadline`. A failure fails them all (any
    /// of them may have run: [`WireError::maybe_ran`]).
    pub fn call_many(
        &mut self,
        calls: &[&[&[u8]]],
        deadline: Instant,
    ) -> Result<Vec<Reply>, WireError> {
        if self.unasked(deadline)? {
            // A Redis server never speaks first (an HTTP or SSH server does).
            return Err(if self.asked {
                WireError::Unasked
            } else {
                WireError::Bad(Bad::Protocol("it spoke before it was asked anything"))
            });
        }
        self.asked = true;
        let frames: Vec<u8> = calls.iter().flat_map(|args| resp::encode(args)).collect();
        self.send(&frames, deadline)?;
        let replies = calls
            .iter()
            .map(|_| self.read(deadline))
            .collect::<Result<Vec<Reply>, WireError>>()?;
        if !self.buf.is_empty() {
            return Err(WireError::Bad(Bad::Protocol(
                "more than one reply to one command",
            )));
        }
        Ok(replies)
    }

    /// Whether the server sent something (or closed) that no request of ours asked for. Under
    /// TLS, a readable socket may hold only the protocol's own records (a session ticket): those
    /// are taken in without waiting for more, and only application bytes count; a TLS alert there
    /// (a client certificate refused after the handshake) is the error it is.
    fn unasked(&mut self, deadline: Instant) -> Result<bool, WireError> {
        if !self.readable() {
            return Ok(false);
        }
        let Socket::Tls(s) = &mut self.stream else {
            return Ok(true);
        };
        s.sock.deadline = deadline;
        // A few rounds at most: each takes what the socket holds now, never waits for more.
        for _ in 0..8 {
            match s.conn.read_tls(&mut s.sock) {
                Ok(0) => return Ok(true),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_error(e)),
            }
            let state = s
                .conn
                .process_new_packets()
                .map_err(|e| WireError::Tls(tls::explain(&e)))?;
            if state.plaintext_bytes_to_read() > 0 || state.peer_has_closed() {
                return Ok(true);
            }
            if !poll_in(s.sock.sock.as_fd()) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn send(&mut self, bytes: &[u8], deadline: Instant) -> Result<(), WireError> {
        self.stream.bound(deadline);
        let mut sent = 0;
        while sent < bytes.len() {
            match self.stream.io().write(&bytes[sent..]) {
                Ok(0) => return Err(WireError::Io("the connection was closed".into())),
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(e)),
            }
        }
        self.stream.io().flush().map_err(io_error)
    }

    /// Whether the server has sent something or closed the connection, without waiting. On a
    /// connection that only answers our calls, either means the connection is no longer good.
    pub fn readable(&self) -> bool {
        !self.buf.is_empty() || poll_in(self.stream.fd())
    }

    /// Read the next reply by `deadline` (a pushed message, on a subscribed connection). A
    /// timeout keeps what arrived of a reply: the next read goes on from there.
    pub fn read(&mut self, deadline: Instant) -> Result<Reply, WireError> {
        let mut chunk = [0u8; 16 * 1024];
        self.stream.bound(deadline);
        loop {
            if let Some(resp::Parsed { reply, used }) =
                resp::parse(&self.buf).map_err(WireError::Bad)?
            {
                self.buf.drain(..used);
                return Ok(reply);
            }
            left(deadline)?;
            match self.stream.io().read(&mut chunk) {
                Ok(0) => return Err(WireError::Io("the server closed the connection".into())),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(e)),
            }
        }
    }
}

/// Whether `fd` has something to read (or was closed), without waiting. An error of poll itself
/// (EINTR) is "nothing seen": the caller looks again.
fn poll_in(fd: BorrowedFd<'_>) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

impl Reply {
    /// The value, or the server's refusal as an error.
    pub fn ok(self) -> Result<Value, WireError> {
        match self {
            Reply::Value(v) => Ok(v),
            Reply::Error(e) => Err(WireError::Server(e)),
        }
    }
}
