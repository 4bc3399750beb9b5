//! Hostile peers: a proxy in front of a real Redis that turns its replies hostile on demand,
//! and a relay of raw bytes that passes them on one every 200 ms.

use super::*;

/// What a [`Hostile`] proxy does to the replies it relays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mischief {
    /// Relay replies as they are.
    Pass,
    /// Relay each reply one byte every 300 ms: no single read ever times out.
    Drip,
    /// Answer every command with a bulk string declared 1 GB long, and stream it.
    Huge,
    /// Answer every command with `+OK` without asking Redis.
    Ok,
    /// Answer every command with RESP3's `#t` without asking Redis.
    True,
    /// Send this frame, then Redis's real reply, in one write.
    Before(&'static [u8]),
    /// Send Redis's real reply and this frame, in one write.
    After(&'static [u8]),
    /// Send Redis's real reply, then this frame 20 ms later (after the client read its reply).
    Late(&'static [u8]),
    /// [`Mischief::Before`] for the next reply only, then [`Mischief::Pass`].
    BeforeOnce(&'static [u8]),
}

/// A loopback proxy in front of a real Redis that turns hostile on demand ([`Hostile::set`]):
/// each connection relays commands to the server and replies back through the current mischief.
pub struct Hostile {
    pub port: u16,
    mode: std::sync::Arc<std::sync::Mutex<Mischief>>,
    /// Replies sent so far, on all connections.
    replies: std::sync::Arc<AtomicU32>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Hostile {
    /// A proxy in front of `upstream`'s TCP port.
    pub fn start(upstream: u16) -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = std::sync::Arc::new(std::sync::Mutex::new(Mischief::Pass));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let replies = std::sync::Arc::new(AtomicU32::new(0));
        let (m, st, sent) = (mode.clone(), stop.clone(), replies.clone());
        std::thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let (m, st, sent) = (m.clone(), st.clone(), sent.clone());
                std::thread::spawn(move || proxy_one(client, upstream, (m, st, sent)));
            }
        });
        Hostile {
            port,
            mode,
            replies,
            stop,
        }
    }

    /// How many replies the proxy has sent so far.
    pub fn replies(&self) -> u32 {
        self.replies.load(Ordering::SeqCst)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn set(&self, mischief: Mischief) {
        *self.mode.lock().unwrap() = mischief;
    }
}

/// Shared with every connection of a [`Hostile`]: the mischief, the stop flag, the replies sent.
type Proxied = (
    std::sync::Arc<std::sync::Mutex<Mischief>>,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::sync::Arc<AtomicU32>,
);

/// One client of the proxy, relayed through the mischief until it, the server or the proxy ends.
fn proxy_one(mut client: std::net::TcpStream, upstream: u16, (m, st, sent): Proxied) {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    client.set_nonblocking(false).unwrap();
    let _ = client.set_read_timeout(Some(Duration::from_millis(100)));
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)) else {
        return;
    };
    let _ = server.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = vec![0u8; 64 * 1024];
    while !st.load(Ordering::SeqCst) {
        let n = match client.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(_) => return,
        };
        let mode = {
            let mut m = m.lock().unwrap();
            let mode = *m;
            if let Mischief::BeforeOnce(_) = mode {
                *m = Mischief::Pass;
            }
            mode
        };
        let Some(reply) = reply_for(mode, &mut client, &mut server, &mut buf, n) else {
            return;
        };
        sent.fetch_add(1, Ordering::SeqCst);
        if mode == Mischief::Drip {
            for b in reply {
                if st.load(Ordering::SeqCst) || client.write_all(&[b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        } else if client.write_all(&reply).is_err() {
            return;
        }
    }
}

/// What the client gets for the command in `buf[..n]` under `mode` (None: the connection is
/// over); the server is asked, unless the mischief answers for it.
fn reply_for(
    mode: Mischief,
    client: &mut std::net::TcpStream,
    server: &mut std::net::TcpStream,
    buf: &mut [u8],
    n: usize,
) -> Option<Vec<u8>> {
    use std::io::{Read, Write};
    Some(match mode {
        Mischief::Ok => b"+OK\r\n".to_vec(),
        Mischief::True => b"#t\r\n".to_vec(),
        Mischief::Huge => {
            if client.write_all(b"$1000000000\r\n").is_err() {
                return None;
            }
            let chunk = vec![b'x'; 64 * 1024];
            // At most the declared gigabyte, for at most 60 s.
            let end = Instant::now() + Duration::from_secs(60);
            for _ in 0..(1_000_000_000 / chunk.len()) {
                if Instant::now() > end || client.write_all(&chunk).is_err() {
                    return None;
                }
            }
            return None;
        }
        _ => {
            if server.write_all(&buf[..n]).is_err() {
                return None;
            }
            let Ok(got) = server.read(buf) else {
                return None;
            };
            let real = buf[..got].to_vec();
            match mode {
                Mischief::Before(f) | Mischief::BeforeOnce(f) => [f, &real[..]].concat(),
                Mischief::After(f) => [&real[..], f].concat(),
                Mischief::Late(f) => {
                    if client.write_all(&real).is_err() {
                        return None;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    f.to_vec()
                }
                _ => real,
            }
        }
    })
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// A loopback relay of raw bytes in front of a server's TCP port, for what a proxy that cannot
/// read the conversation (TLS) can do: pass the bytes, or pass the server's bytes one every
/// 200 ms, each of them on time, so that no single socket read ever times out.
pub struct Relay {
    pub port: u16,
    /// Every connection drips from now on.
    dripping: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Relay {
    /// A relay in front of `upstream`. With `drip_after: Some(n)`, each connection drips the
    /// server's bytes once its client has sent `n` TLS application-data records (0: from the
    /// first byte, the handshake; 2: after the client's Finished and its first command).
    pub fn start(upstream: u16, drip_after: Option<usize>) -> Relay {
        use std::net::TcpStream;
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        use std::sync::Arc;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let dripping = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (all, st) = (dripping.clone(), stop.clone());
        std::thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let records = Arc::new(AtomicUsize::new(0));
                // Client to server, counting the client's application-data records (TLS record
                // type 23: in TLS 1.3 the client's Finished is one too).
                let (mut from, mut to) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let counted = records.clone();
                let st2 = st.clone();
                std::thread::spawn(move || count_records(&mut from, &mut to, &counted, &st2));
                // Server to client, dripping when told.
                let (mut from, mut to) = (server, client);
                let (all, st2) = (all.clone(), st.clone());
                let drip = move || {
                    all.load(Ordering::SeqCst)
                        || drip_after.is_some_and(|k| records.load(Ordering::SeqCst) >= k)
                };
                std::thread::spawn(move || drip_back(&mut from, &mut to, drip, &st2));
            }
        });
        Relay {
            port,
            dripping,
            stop,
        }
    }

    /// Drip the server's bytes on every connection from now on.
    pub fn drip_now(&self) {
        self.dripping.store(true, Ordering::SeqCst);
    }
}

/// Relay the client's bytes to the server, counting its TLS application-data records (type 23:
/// in TLS 1.3 the client's Finished is one too) in `counted`.
fn count_records(
    from: &mut std::net::TcpStream,
    to: &mut std::net::TcpStream,
    counted: &std::sync::atomic::AtomicUsize,
    st2: &std::sync::atomic::AtomicBool,
) {
    use std::io::{Read, Write};
    let mut buf = [0u8; 16 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    while !st2.load(Ordering::SeqCst) {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        while pending.len() >= 5 {
            let len = u16::from_be_bytes([pending[3], pending[4]]) as usize;
            if pending.len() < 5 + len {
                break;
            }
            if pending[0] == 23 {
                counted.fetch_add(1, Ordering::SeqCst);
            }
            pending.drain(..5 + len);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// Relay the server's bytes to the client: at once, or one every 200 ms while `drip` says so.
fn drip_back(
    from: &mut std::net::TcpStream,
    to: &mut std::net::TcpStream,
    drip: impl Fn() -> bool,
    st2: &std::sync::atomic::AtomicBool,
) {
    use std::io::{Read, Write};
    use std::net::Shutdown;
    let mut buf = [0u8; 16 * 1024];
    while !st2.load(Ordering::SeqCst) {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !drip() {
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
            continue;
        }
        for b in &buf[..n] {
            if st2.load(Ordering::SeqCst) || to.write_all(&[*b]).is_err() {
                let _ = to.shutdown(Shutdown::Both);
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let _ = to.shutdown(Shutdown::Both);
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
