//! The server: one thread, one `poll` over the listener and every open connection, so no client
//! can hold it. A request head must arrive whole within [`READ_WITHIN`] of the connection, in at
//! most [`HEAD_MAX`] bytes and [`HEADERS_MAX`] header lines; at most [`MAX_CONNS`] connections are
//! open (one more is accepted and closed at once); every answer is written within
//! [`WRITE_WITHIN`] and closes the connection. `httparse` (the parser hyper is built on) reads the
//! head; the rest is these few lines, because the small server crates (tiny_http) read heads
//! without a bound and give every connection a thread.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::Duration;

use crate::clock::Instant;

use crate::log::{Level, Log};

use super::answer::Response;
use super::board::Board;
use super::fleet::Reader;
use super::{exposition, page, probes};

/// The most connections open at once.
pub const MAX_CONNS: usize = 256;
/// The largest request head.
pub const HEAD_MAX: usize = 8192;
/// The most header lines in a request.
pub const HEADERS_MAX: usize = 32;
/// A request head arrives whole within this, or the connection is dropped.
pub const READ_WITHIN: Duration = Duration::from_secs(2);
/// An answer is written within this, or the connection is dropped.
pub const WRITE_WITHIN: Duration = Duration::from_secs(2);

/// An open connection and what it sent so far.
struct Conn {
    stream: TcpStream,
    head: Vec<u8>,
    until: Instant,
}

/// Serve until the process ends.
pub fn serve(listener: TcpListener, board: &Board, log: &Log, show_output: bool) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let mut fleet = Reader::new(show_output);
    let mut conns: Vec<Conn> = Vec::new();
    loop {
        let readable = wait(&listener, &conns);
        if readable.first() == Some(&true) {
            accept(&listener, &mut conns);
        }
        let now = Instant::now();
        let mut keep = Vec::with_capacity(conns.len());
        for (i, mut conn) in conns.drain(..).enumerate() {
            let ready = readable.get(i + 1).copied().unwrap_or(false);
            let step = if ready { read(&mut conn) } else { Step::More };
            match step {
                Step::More if now < conn.until => keep.push(conn),
                Step::More | Step::Drop => {}
                Step::Head(request) => {
                    let (answer, head) = match request {
                        Ok(Head { method, path }) => {
                            let answer = route(&method, &path, board, &mut fleet);
                            (answer, method == "HEAD")
                        }
                        Err(why) => (Response::text(400, format!("{why}\n")), false),
                    };
                    if answer.status >= 400 && answer.status < 500 {
                        let peer = conn.stream.peer_addr().map(|a| a.to_string());
                        let text = format!(
                            "--listen: answered {} to {}: {}",
                            answer.status,
                            peer.unwrap_or_default(),
                            answer.body.trim_end()
                        );
                        log.event(Level::Debug, "bad_request", &text, &[]);
                    }
                    write(conn.stream, &answer, head);
                }
            }
        }
        conns = keep;
    }
}

/// Wait until the listener or a connection is readable, or the soonest deadline: which are.
fn wait(listener: &TcpListener, conns: &[Conn]) -> Vec<bool> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = Vec::with_capacity(conns.len() + 1);
    fds.push(PollFd::new(listener.as_fd(), PollFlags::POLLIN));
    fds.extend(
        conns
            .iter()
            .map(|c| PollFd::new(c.stream.as_fd(), PollFlags::POLLIN)),
    );
    let soonest = conns.iter().map(|c| c.until).min();
    let left = soonest.map_or(Duration::from_secs(1), |u| {
        u.saturating_duration_since(Instant::now())
            .min(Duration::from_secs(1))
    });
    let timeout = PollTimeout::try_from(left.as_millis() as u64 + 1).unwrap_or(PollTimeout::MAX);
    if poll(&mut fds, timeout).is_err() {
        return Vec::new();
    }
    fds.iter()
        .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
        .collect()
}

/// Take the waiting connections; those above [`MAX_CONNS`] are closed at once.
fn accept(listener: &TcpListener, conns: &mut Vec<Conn>) {
    for _ in 0..64 {
        let Ok((stream, _)) = listener.accept() else {
            return;
        };
        if conns.len() >= MAX_CONNS || stream.set_nonblocking(true).is_err() {
            continue;
        }
        conns.push(Conn {
            stream,
            head: Vec::new(),
            until: Instant::now() + READ_WITHIN,
        });
    }
}

/// A request's head, as far as it matters here.
struct Head {
    method: String,
    path: String,
}

/// What a read made of a connection.
enum Step {
    /// The head is not whole yet.
    More,
    /// Closed, failed, or sent a body we never asked for: dropped without an answer.
    Drop,
    /// A whole head, or why it is a bad request.
    Head(Result<Head, String>),
}

fn read(conn: &mut Conn) -> Step {
    let mut chunk = [0u8; 2048];
    match conn.stream.read(&mut chunk) {
        Ok(0) => return Step::Drop,
        Ok(n) => conn.head.extend_from_slice(&chunk[..n]),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Step::More,
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Step::More,
        Err(_) => return Step::Drop,
    }
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(&conn.head) {
        Ok(httparse::Status::Complete(_)) => Step::Head(Ok(Head {
            method: request.method.unwrap_or_default().to_string(),
            path: request.path.unwrap_or_default().to_string(),
        })),
        Ok(httparse::Status::Partial) if conn.head.len() < HEAD_MAX => Step::More,
        Ok(httparse::Status::Partial) => {
            Step::Head(Err(format!("a request head over {HEAD_MAX} bytes")))
        }
        Err(httparse::Error::TooManyHeaders) => {
            Step::Head(Err(format!("more than {HEADERS_MAX} header lines")))
        }
        Err(e) => Step::Head(Err(format!("not an HTTP/1 request: {e}"))),
    }
}

/// The answer to `method path`.
fn route(method: &str, path: &str, board: &Board, fleet: &mut Reader) -> Response {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let known = ["/", "/metrics", "/healthz", "/readyz"];
    if !known.contains(&path) {
        return Response::text(
            404,
            "not found: this replica serves /, /metrics, /healthz and /readyz\n",
        );
    }
    if method != "GET" && method != "HEAD" {
        return Response::text(
            405,
            format!("{method} is not allowed here: only GET and HEAD\n"),
        );
    }
    match path {
        "/healthz" => probes::healthz(board),
        "/readyz" => probes::readyz(board),
        "/metrics" => exposition::answer(board, fleet),
        _ => page::answer(board, fleet),
    }
}

/// Write `answer` (only its head for a HEAD request) and close; a client that has not read it
/// within [`WRITE_WITHIN`] is dropped.
fn write(mut stream: TcpStream, answer: &Response, head_only: bool) {
    let reason = match answer.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {} {reason}\r\ncontent-type: {}\r\ncontent-length: {}\r\ncache-control: no-store\r\n\
         x-content-type-options: nosniff\r\nconnection: close\r\n\r\n",
        answer.status,
        answer.kind,
        answer.body.len()
    );
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let mut all = head.into_bytes();
    if !head_only {
        all.extend_from_slice(answer.body.as_bytes());
    }
    let until = Instant::now() + WRITE_WITHIN;
    let mut sent = 0;
    while sent < all.len() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_write_timeout(Some(left)).is_err() {
            return;
        }
        match stream.write(&all[sent..]) {
            Ok(0) => return,
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Write);
}
