//! The process tree below the caller: walk its children, kill every descendant, relay a signal
//! to children that left the command's process group. Raw system calls only ([`crate::command::sys`]):
//! the guard uses all of it, and cronlock's main thread uses [`kill_descendants`] for orphans.

use std::os::fd::RawFd;

use crate::command::sys;

/// Call `f` with the pid of each child of the calling thread, from `/proc/thread-self/children`.
/// Returns how many there were, or `None` when `/proc` cannot tell (not mounted: an empty root).
fn for_each_child(mut f: impl FnMut(libc::pid_t)) -> Option<usize> {
    let fd = sys::openat(
        libc::AT_FDCWD,
        c"/proc/thread-self/children",
        libc::O_RDONLY,
    );
    if fd < 0 {
        return None;
    }
    let fd = fd as libc::c_int;
    let mut buf = [0u8; 512];
    let mut n = 0usize;
    let mut pid: libc::pid_t = 0;
    loop {
        let got = sys::read(fd, &mut buf);
        if got <= 0 {
            break;
        }
        for &b in buf.iter().take(got as usize) {
            if b.is_ascii_digit() {
                pid = pid
                    .saturating_mul(10)
                    .saturating_add((b - b'0') as libc::pid_t);
            } else if pid > 0 {
                f(pid);
                n += 1;
                pid = 0;
            }
        }
    }
    if pid > 0 {
        f(pid);
        n += 1;
    }
    sys::close(fd);
    Some(n)
}

/// Kill every descendant of the calling thread: the job's cgroup at once when there is one (its
/// `cgroup.kill`), then
/// children one by one; as a subreaper, their orphaned children come back to us and are killed in
/// the next round. Bounded: a process stuck in the kernel cannot keep us here.
///
/// Raw system calls only, so the guard may call it; cronlock's main thread uses it too, for
/// orphans that reached it after the guard died. It reaps any child of the caller
/// (`wait4(-1)`): call it only when no child's status matters any more.
pub fn kill_descendants(cgroup_kill: Option<RawFd>) {
    let mut cgroup_killed = false;
    for _ in 0..2000 {
        // Reap what has ended. No child at all (ECHILD) means no descendant either: orphans are
        // reparented to us before their parent's end is reported.
        loop {
            match sys::wait4(-1, None, libc::WNOHANG) {
                r if r > 0 => continue,
                r if r == -(libc::ECHILD as isize) => return,
                _ => break,
            }
        }
        if let Some(kill) = cgroup_kill.filter(|_| !cgroup_killed) {
            sys::write(kill, b"1");
            cgroup_killed = true;
        }
        match for_each_child(|pid| {
            sys::kill(pid, libc::SIGKILL);
        }) {
            Some(0) | None => return,
            Some(_) => {}
        }
        sys::nanosleep(1_000_000);
    }
}

/// Send `sig` to our children outside our process group (it reached the group already).
pub(super) fn relay_to_escaped_children(sig: libc::c_int) {
    let ours = sys::getpgid(0);
    for_each_child(|pid| {
        let group = sys::getpgid(pid);
        if group > 0 && group != ours {
            sys::kill(pid, sig);
            if !crate::signals::is_stop(sig) && sig != libc::SIGCONT {
                sys::kill(pid, libc::SIGCONT);
            }
        }
    });
}
