//! Opening a connection by a deadline: the host name looked up, the TCP or Unix socket
//! connected, the TLS handshake made, each step bounded by what is left ([`crate::store::wire`]
//! then holds the connection). Beneath every socket sits [`Bounded`], which sets the socket's
//! timeout to what is left before each read and write.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};

use crate::clock::Instant;
use crate::store::tls;
use crate::store::wire_error::{io_error, left, WireError};

/// A socket whose every read and write is bounded by the exchange's deadline: the socket's
/// timeout is set to what is left before each call, and a call with nothing left fails as a
/// timeout. It sits beneath the TLS layer too, where one `read` of a record (or the handshake's
/// `complete_io`) makes as many socket reads as the server chooses to split its bytes into.
pub(super) struct Bounded<S> {
    pub(super) sock: S,
    pub(super) deadline: Instant,
}

/// A socket with timeouts: TCP or Unix.
pub(super) trait Timed: Read + Write + AsFd {
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
    pub(super) fn new(sock: S, deadline: Instant) -> Bounded<S> {
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
pub(super) fn unix_connect(path: &Path, deadline: Instant) -> Result<UnixStream, WireError> {
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

pub(super) fn tcp_connect(
    host: &str,
    port: u16,
    deadline: Instant,
) -> Result<TcpStream, WireError> {
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
pub(super) fn handshake(
    host: &str,
    mut tcp: Bounded<TcpStream>,
    config: &Arc<ClientConfig>,
) -> Result<StreamOwned<ClientConnection, Bounded<TcpStream>>, WireError> {
    let name = ServerName::try_from(host.to_string())
        .map_err(|_| WireError::Tls(format!("'{host}' is not a valid TLS server name")))?;
    let mut tls = ClientConnection::new(Arc::clone(config), name)
        .map_err(|e| WireError::Tls(tls::explain(&e)))?;
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
