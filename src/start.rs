//! What cronlock needs of a process start-up, without the rest of Rust's.
//!
//! cronlock runs on every tick of every host, so its fixed cost is paid millions of times. The
//! binary is `#![no_main]` (see `main.rs`): Rust's own start-up looks up the main thread's stack
//! in `/proc/self/maps`, maps an alternate signal stack and installs stack-overflow handlers, about
//! 0.1 ms per run here, for a message on a stack overflow (which still kills cronlock, and the
//! guard then ends the job). What it does that matters is done here: standard descriptors that
//! are open, SIGPIPE ignored, stdout flushed at the end.

use std::io::Write;

/// Before anything else, while cronlock is single-threaded.
pub fn prepare() {
    open_standard_fds();
    // A reader of our stdout or stderr that went away must not kill cronlock while it holds a
    // lock: writes fail with EPIPE instead. (The command gets the default back before `execve`.)
    // SAFETY: setting a disposition to SIG_IGN installs no handler.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// Before returning the exit status.
pub fn finish() {
    let _ = std::io::stdout().flush();
}

/// A closed fd 0, 1 or 2 is opened on `/dev/null`, as Rust's start-up does: otherwise the first
/// socket cronlock opens would become "stdout", and its messages would go to Redis. Where there is
/// no `/dev/null` to open (an empty root with closed descriptors), nothing safe can be done.
fn open_standard_fds() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // SAFETY: three valid pollfd entries; a zero timeout only reports their state.
    if unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) } < 0 {
        return;
    }
    for p in fds.iter().filter(|p| p.revents & libc::POLLNVAL != 0) {
        // SAFETY: a valid path; the lowest free descriptor is the closed one, as fds close in order.
        let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
        if fd != p.fd {
            // SAFETY: leaving at once, before anything could be written to the wrong place.
            unsafe { libc::_exit(crate::exit::FAILURE as libc::c_int) };
        }
    }
}
