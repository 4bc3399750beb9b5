//! One connection to one Redis server, where every exchange has a deadline for the whole of it.
//!
//! It exists because a socket timeout bounds each read, not a command: a server that drips one
//! byte every 0.3 s never lets a read time out, and a general client would wait for as long as the
//! server likes. Here the connect, the TLS handshake, `AUTH`, `SELECT` and every command finish by
//! the deadline given or fail as a timeout: before each read or write the socket's timeout is set
//! to what is left. Replies are read with [`crate::store::resp`]'s bound on their size.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use crate::clock::Instant;
use crate::store::resp::{self, Bad, Reply};

/// Where a server listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Addr {
    Tcp(String, u16),
    Unix(PathBuf),
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Tcp(h, p) if h.contains(':') => write!(f, "[{h}]:{p}"),
            Addr::Tcp(h, p) => write!(f, "{h}:{p}"),
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

/// A failure that asking again cannot mend (a wrong password, an ACL, a database that does not
/// exist, a server that is not what the URL says), as a message: look-ups that report through
/// `anyhow` (Sentinel, Cluster) mark it so, and the link does not retry it.
#[derive(Debug)]
pub struct Refusal(pub String);

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refusal {}

/// `message` about `e`, marked as a [`Refusal`] when retrying cannot help.
pub fn failed(e: &WireError, message: String) -> anyhow::Error {
    if e.transient() {
        anyhow::anyhow!(message)
    } else {
        anyhow::Error::new(Refusal(message))
    }
}

/// A socket whose every read and write is bounded by the exchange's deadline: the socket's
/// timeout is set to what is left before each call, and a call with nothing left fails as a
/// timeout. It sits beneath the TLS layer too, where one `read` of a record (or the handshake's
/// `complete_io`) makes as many socket reads as the server chooses to split its bytes into.
struct Bounded<S> {
    sock: S,
    deadline: Instant,
}

/// A socket with timeouts: TCP or Unix.
trait Timed: Read + Write + AsFd {
    fn set_timeouts(&self, d: Option<Duration>) -> io::Result<()>;
}

impl Timed for TcpStream {
    fn set_timeouts(&self, d: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(d).and(self.set_write_timeout(d))
    }
}

impl Timed for UnixStream {
    fn set_timeouts(&self, d: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(d).and(self.set_write_timeout(d))
    }
}

impl<S: Timed> Bounded<S> {
    fn new(sock: S, deadline: Instant) -> Bounded<S> {
        Bounded { sock, deadline }
    }

    /// Set the socket's timeout to what is left, or fail as a timeout.
    fn arm(&self) -> io::Result<()> {
        let d = self.deadline.saturating_duration_since(Instant::now());
        if d.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.sock
            .set_timeouts(Some(d.max(Duration::from_micros(100))))
    }
}

impl<S: Timed> Read for Bounded<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm()?;
        self.sock.read(buf)
    }
}

impl<S: Timed> Write for Bounded<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm()?;
        self.sock.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.sock.flush()
    }
}

enum Stream {
    Tcp(Bounded<TcpStream>),
    Unix(Bounded<UnixStream>),
    Tls(Box<StreamOwned<ClientConnection, Bounded<TcpStream>>>),
}

impl Stream {
    /// Every socket call from now on ends by `deadline`.
    fn bound(&mut self, deadline: Instant) {
        match self {
            Stream::Tcp(s) => s.deadline = deadline,
            Stream::Unix(s) => s.deadline = deadline,
            Stream::Tls(s) => s.sock.deadline = deadline,
        }
    }

    fn io(&mut self) -> &mut dyn ReadWrite {
        match self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => s,
            Stream::Tls(s) => &mut **s,
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Tcp(s) => s.sock.as_fd(),
            Stream::Unix(s) => s.sock.as_fd(),
            Stream::Tls(s) => s.sock.sock.as_fd(),
        }
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// An open connection; the caller drops it after any failure (see [`crate::store::topology`]).
pub struct Wire {
    stream: Stream,
    /// Bytes read past the last reply.
    buf: Vec<u8>,
}

/// What is left until `deadline`, or a timeout.
fn left(deadline: Instant) -> Result<Duration, WireError> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        Err(WireError::Timeout)
    } else {
        Ok(d)
    }
}

fn io_error(e: io::Error) -> WireError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => WireError::Timeout,
        _ => {
            // rustls errors come wrapped in io::Error.
            if let Some(tls) = e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            {
                return WireError::Tls(tls_text(tls));
            }
            WireError::Io(crate::log::io_text(&e))
        }
    }
}

fn tls_text(e: &rustls::Error) -> String {
    let raw = format!("{e:?} {e}");
    crate::store::tls::explain(&raw).unwrap_or_else(|| format!("TLS: {e}"))
}

impl Wire {
    /// Connect to `addr` and open a session, all by `deadline`.
    pub fn connect(addr: &Addr, session: &Session, deadline: Instant) -> Result<Wire, WireError> {
        let stream = match addr {
            Addr::Unix(path) => Stream::Unix(Bounded::new(unix_connect(path, deadline)?, deadline)),
            Addr::Tcp(host, port) => {
                let tcp = Bounded::new(tcp_connect(host, *port, deadline)?, deadline);
                match &session.tls {
                    None => Stream::Tcp(tcp),
                    Some(config) => Stream::Tls(Box::new(handshake(host, tcp, config)?)),
                }
            }
        };
        let mut wire = Wire {
            stream,
            buf: Vec::new(),
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
        if self.unasked(deadline)? {
            return Err(WireError::Unasked);
        }
        self.send(&resp::encode(args), deadline)?;
        let reply = self.read(deadline)?;
        if !self.buf.is_empty() {
            return Err(WireError::Bad(Bad::Protocol(
                "more than one reply to one command",
            )));
        }
        Ok(reply)
    }

    /// Whether the server sent something (or closed) that no request of ours asked for. Under
    /// TLS, a readable socket may hold only the protocol's own records (a session ticket): those
    /// are taken in without waiting for more, and only application bytes count; a TLS alert there
    /// (a client certificate refused after the handshake) is the error it is.
    fn unasked(&mut self, deadline: Instant) -> Result<bool, WireError> {
        if !self.readable() {
            return Ok(false);
        }
        let Stream::Tls(s) = &mut self.stream else {
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
                .map_err(|e| WireError::Tls(tls_text(&e)))?;
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
            if let Some((reply, used)) = resp::parse(&self.buf).map_err(WireError::Bad)? {
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

/// The addresses of `host`, by `deadline`. An address needs no look-up; a name is looked up on a
/// thread of its own, so that a resolver that never answers (the C library waits 5 s per try and
/// server) costs the caller no more than what is left. A look-up that outlives its caller ends
/// on its own, with the resolver's timeouts.
fn resolve(host: &str, port: u16, deadline: Instant) -> Result<Vec<SocketAddr>, WireError> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let cannot = |e: &io::Error| {
        WireError::Io(format!(
            "cannot resolve '{host}': {}",
            crate::log::io_text(e)
        ))
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let name = host.to_string();
    std::thread::Builder::new()
        .name("resolve".into())
        .spawn(move || {
            let found = (name.as_str(), port)
                .to_socket_addrs()
                .map(|a| a.collect::<Vec<_>>());
            let _ = tx.send(found);
        })
        .map_err(|e| cannot(&e))?;
    match rx.recv_timeout(left(deadline)?) {
        Ok(Ok(addrs)) => Ok(addrs),
        Ok(Err(e)) => Err(cannot(&e)),
        Err(_) => Err(WireError::Io(format!(
            "cannot resolve '{host}': the resolver did not answer in time"
        ))),
    }
}

/// Connect a Unix socket by `deadline`. A listener that does not accept (its queue full) would
/// hold a plain `connect` for ever: the send timeout bounds it (Linux waits for room in the
/// queue for at most that long, then says EAGAIN).
fn unix_connect(path: &Path, deadline: Instant) -> Result<UnixStream, WireError> {
    use nix::errno::Errno;
    use nix::sys::socket::{connect, setsockopt, socket, sockopt, AddressFamily, SockFlag};
    use nix::sys::socket::{SockType, UnixAddr};
    use nix::sys::time::TimeVal;
    let failed = |e: Errno| io_error(io::Error::from(e));
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(failed)?;
    let addr = UnixAddr::new(path).map_err(failed)?;
    loop {
        let d = left(deadline)?.max(Duration::from_micros(100));
        let tv = TimeVal::new(
            d.as_secs().try_into().unwrap_or(i64::MAX),
            d.subsec_micros().into(),
        );
        setsockopt(&fd, sockopt::SendTimeout, &tv).map_err(failed)?;
        match connect(fd.as_raw_fd(), &addr) {
            Ok(()) => return Ok(UnixStream::from(fd)),
            Err(Errno::EINTR) => continue,
            Err(Errno::EAGAIN | Errno::ETIMEDOUT) => return Err(WireError::Timeout),
            Err(e) => return Err(failed(e)),
        }
    }
}

fn tcp_connect(host: &str, port: u16, deadline: Instant) -> Result<TcpStream, WireError> {
    let addrs = resolve(host, port, deadline)?;
    let mut last = WireError::Io(format!("'{host}' resolves to no address"));
    for a in addrs {
        match TcpStream::connect_timeout(&a, left(deadline)?) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => last = io_error(e),
        }
    }
    Err(last)
}

/// The TLS handshake, on a socket whose every read and write is bounded by the deadline.
fn handshake(
    host: &str,
    mut tcp: Bounded<TcpStream>,
    config: &Arc<ClientConfig>,
) -> Result<StreamOwned<ClientConnection, Bounded<TcpStream>>, WireError> {
    let name = ServerName::try_from(host.to_string())
        .map_err(|_| WireError::Tls(format!("'{host}' is not a valid TLS server name")))?;
    let mut tls = ClientConnection::new(Arc::clone(config), name)
        .map_err(|e| WireError::Tls(tls_text(&e)))?;
    // A plain Redis reads a ClientHello as the start of a command and waits.
    let no_answer = || {
        WireError::Io(
            "no TLS answer in time (a plain port? use redis:// for it; or a server too slow)"
                .into(),
        )
    };
    while tls.is_handshaking() {
        match tls.complete_io(&mut tcp) {
            Ok((0, 0)) if tls.is_handshaking() => {
                return Err(WireError::Io(
                    "the server closed the connection during the TLS handshake".into(),
                ))
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(no_answer())
            }
            Err(e) => return Err(io_error(e)),
        }
    }
    Ok(StreamOwned::new(tls, tcp))
}
