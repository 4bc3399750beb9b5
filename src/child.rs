//! Running the command: spawn it (behind the [guard](crate::guard)) in its own process group,
//! forward signals to the group, and stop it — SIGTERM, grace, SIGKILL — when the lock is lost or
//! `--max-runtime` passes. Also reaps orphans, which matters when cronlock is PID 1.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use crate::clock::Instant;

use crate::exit::Exit;
use crate::guard::{self, Prepared};
use crate::log::{Level, Log};
use crate::signals;
use crate::watchdog::{LockState, Watch};

/// Why the command could not be started.
#[derive(Debug)]
pub struct SpawnError {
    pub program: String,
    pub error: io::Error,
}

impl SpawnError {
    pub fn exit(&self) -> Exit {
        match self.error.kind() {
            io::ErrorKind::NotFound => Exit::NotFound,
            _ => Exit::CannotExecute,
        }
    }
}

/// A running command: the pid of its guard, which is also its process group id.
#[derive(Debug)]
pub struct Child {
    pub group: libc::pid_t,
}

/// Why cronlock stopped the command itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    LockLost(String),
    MaxRuntime,
}

/// How the command ended.
#[derive(Debug)]
pub struct Ended {
    /// The command's own status (exit code or signal).
    pub status: Exit,
    /// Set when cronlock terminated it.
    pub stopped: Option<Stop>,
}

impl Ended {
    /// The status cronlock exits with.
    pub fn exit(&self) -> Exit {
        match self.stopped {
            Some(Stop::LockLost(_)) => Exit::LockLost,
            Some(Stop::MaxRuntime) => Exit::MaxRuntime,
            None => self.status,
        }
    }
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "argument contains a NUL byte"))
}

/// The `execve` paths to try for `program`, like `execvp`.
fn candidates(program: &OsStr) -> io::Result<Vec<CString>> {
    if program.as_bytes().contains(&b'/') {
        return Ok(vec![cstring(program)?]);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| {
            let dir = if dir.as_os_str().is_empty() {
                ".".into()
            } else {
                dir
            };
            cstring(dir.join(program).as_os_str())
        })
        .collect()
}

/// Start `argv` with `extra_env` added, behind a guard, in a new process group.
pub fn spawn(argv: &[OsString], extra_env: &[(&str, String)]) -> Result<Child, SpawnError> {
    let program = argv[0].to_string_lossy().into_owned();
    let fail = |error| SpawnError {
        program: program.clone(),
        error,
    };
    let args = argv
        .iter()
        .map(|a| cstring(a))
        .collect::<io::Result<Vec<_>>>()
        .map_err(fail)?;
    let mut env: Vec<CString> = Vec::new();
    for (k, v) in std::env::vars_os() {
        if extra_env.iter().any(|(name, _)| OsStr::new(name) == k) {
            continue;
        }
        let mut kv = k.clone();
        kv.push("=");
        kv.push(v);
        if let Ok(c) = cstring(&kv) {
            env.push(c);
        }
    }
    for (k, v) in extra_env {
        env.push(cstring(OsStr::new(&format!("{k}={v}"))).map_err(fail)?);
    }
    let prepared = Prepared::new(
        candidates(&argv[0]).map_err(fail)?,
        args,
        env,
        signals::SigSet::of(&[]),
    );

    let mut fds = [0; 2];
    // SAFETY: fds is a valid 2-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(fail(io::Error::last_os_error()));
    }
    let [read_fd, write_fd] = fds;
    // SAFETY: the forked process runs only guard::run, which is async-signal-safe.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: we are the freshly forked child and `prepared` was built before the fork.
        unsafe { guard::run(&prepared, write_fd) };
    }
    // SAFETY: closing our copy of the write end; the pipe is ours.
    unsafe { libc::close(write_fd) };
    if pid < 0 {
        let e = io::Error::last_os_error();
        // SAFETY: closing our read end.
        unsafe { libc::close(read_fd) };
        return Err(fail(e));
    }
    // Also from the parent, so the group exists before we could signal it.
    // SAFETY: plain system call on our child.
    unsafe { libc::setpgid(pid, pid) };

    // The pipe closes on a successful exec; an exec failure sends its errno first.
    let mut buf = [0u8; 4];
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reading into the remaining part of a stack buffer.
        let n = unsafe { libc::read(read_fd, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        if n > 0 {
            got += n as usize;
        } else if n == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            break;
        }
    }
    // SAFETY: closing our read end.
    unsafe { libc::close(read_fd) };
    if got == buf.len() {
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        return Err(fail(io::Error::from_raw_os_error(i32::from_ne_bytes(buf))));
    }
    Ok(Child { group: pid })
}

impl Child {
    /// Send `sig` to the command's whole process group. A group that is gone is not an error.
    pub fn signal_group(&self, sig: libc::c_int) {
        // SAFETY: kill on our own process group.
        unsafe { libc::kill(-self.group, sig) };
    }

    /// Reap whatever has exited. Returns the guard's wait status once it has ended, after killing
    /// anything the command left running in its group (the lock is about to be released).
    /// Other children are orphans reparented to us (when PID 1) and are simply reaped.
    fn try_finish(&self) -> Option<libc::c_int> {
        loop {
            // SAFETY: zeroed siginfo_t is a valid out-parameter for waitid.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: valid pointer; WNOWAIT leaves the child waitable, so its pid stays reserved.
            let rc = unsafe {
                libc::waitid(
                    libc::P_ALL,
                    0,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                )
            };
            // SAFETY: si_pid is valid for SIGCHLD-style siginfo filled by waitid.
            let pid = unsafe { info.si_pid() };
            if rc != 0 || pid == 0 {
                return None;
            }
            let mut status = 0;
            if pid == self.group {
                // The guard is a zombie: the group id cannot be reused yet.
                self.signal_group(libc::SIGKILL);
                // SAFETY: reaping our own child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                return Some(status);
            }
            // SAFETY: reaping an orphan that is ready.
            unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        }
    }
}

/// When and how to stop the command.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
    pub max_runtime: Option<Duration>,
}

/// Wait for the command, forwarding signals and enforcing the lock's validity and `--max-runtime`.
pub fn supervise(child: &Child, watch: &Watch, limits: Limits, log: &Log) -> Ended {
    let set = signals::watched();
    let started = Instant::now();
    let mut stopped: Option<Stop> = None;
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    let mut forwarded_once = false;
    loop {
        if let Some(status) = child.try_finish() {
            return Ended {
                status: Exit::from_wait_status(status),
                stopped,
            };
        }
        let now = Instant::now();
        let lock = watch.state();
        let (term_at, hard_kill_at) = match &lock {
            LockState::Valid { until } => (
                until.checked_sub(limits.grace + watch.margin),
                until.checked_sub(watch.margin),
            ),
            // Redis said the lock is not ours: there is no validity left to protect, only the grace.
            LockState::Lost(_) => (Some(now), None),
        };
        if stopped.is_none() {
            let why = match &lock {
                LockState::Lost(reason) => Some(Stop::LockLost(reason.clone())),
                LockState::Valid { .. } if term_at.is_some_and(|t| now >= t) => {
                    Some(Stop::LockLost(format!(
                        "no renewal was confirmed in time ({}), so it may expire soon",
                        watch.last_error().unwrap_or_else(|| "no reply".into())
                    )))
                }
                _ => limits
                    .max_runtime
                    .filter(|m| now >= started + *m)
                    .map(|_| Stop::MaxRuntime),
            };
            if let Some(why) = why {
                let msg = match &why {
                    Stop::LockLost(reason) => {
                        format!("lock lost: {reason}; terminating the command")
                    }
                    Stop::MaxRuntime => format!(
                        "the command ran past --max-runtime ({}); terminating it",
                        crate::duration::Span(limits.max_runtime.unwrap_or_default())
                    ),
                };
                let event = match why {
                    Stop::LockLost(_) => "lost",
                    Stop::MaxRuntime => "max_runtime",
                };
                log.event(Level::Error, event, &msg, &[]);
                child.signal_group(libc::SIGTERM);
                kill_at = Some(now + limits.grace);
                stopped = Some(why);
            }
        }
        let must_kill = kill_at.is_some_and(|k| now >= k) || hard_kill_at.is_some_and(|k| now >= k);
        if must_kill && !killed {
            if stopped.is_some() {
                log.event(
                    Level::Warn,
                    "killed",
                    "the command did not stop in time; sent SIGKILL",
                    &[],
                );
            }
            child.signal_group(libc::SIGKILL);
            killed = true;
        }
        // Sleep until the next moment something may have to happen, or a signal.
        let mut next = now + Duration::from_secs(1);
        for t in [
            kill_at.filter(|_| !killed),
            hard_kill_at.filter(|_| !killed),
            term_at.filter(|_| stopped.is_none()),
            limits
                .max_runtime
                .map(|m| started + m)
                .filter(|_| stopped.is_none()),
        ]
        .into_iter()
        .flatten()
        {
            next = next.min(t);
        }
        let timeout = next.saturating_duration_since(now);
        if let Some(sig) = signals::wait(&set, timeout) {
            if signals::forwarded().contains(&sig) {
                log.event(
                    if forwarded_once {
                        Level::Debug
                    } else {
                        Level::Info
                    },
                    "signal",
                    &format!(
                        "received {}; forwarding it to the command",
                        signals::name(sig)
                    ),
                    &[("signal", sig.into())],
                );
                forwarded_once = true;
                child.signal_group(sig);
            }
        }
    }
}
