//! Running the command: spawn it (behind the [guard](crate::command::guard)) in its own process group and,
//! where possible, its own [cgroup](crate::command::cgroup); forward signals to the group, and stop it —
//! SIGTERM, grace, SIGKILL — when the lock is lost or `--max-runtime` passes. cronlock is a child
//! subreaper and reaps orphans, which matters when it is PID 1 and when the guard dies (every
//! wait through [`crate::command::process`]).

use std::cell::Cell;
use std::ffi::{CString, OsStr, OsString};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use nix::fcntl::OFlag;
use nix::unistd::pipe2;

use crate::command::cgroup::Cgroup;
use crate::command::guard::{self, Prepared};
use crate::command::oversight::RunCgroup;
use crate::command::process;
use crate::command::shared::{self, Shared};
use crate::exit::Exit;
use crate::signals;

/// Why the command could not be started.
#[derive(Debug)]
pub struct SpawnError {
    pub program: String,
    pub error: io::Error,
    /// The lock's kill-by time had passed when the command was about to start: it did not.
    pub too_late: bool,
    /// No process could be made for the guard or the command (`fork`/`clone` failed): cronlock's
    /// own failure, as timeout(1)'s failed fork is, not the command's.
    pub no_process: bool,
}

impl SpawnError {
    pub fn exit(&self) -> Exit {
        match self.error.kind() {
            _ if self.too_late => Exit::LockLost,
            _ if self.no_process => Exit::Failure,
            io::ErrorKind::NotFound => Exit::NotFound,
            _ => Exit::CannotExecute,
        }
    }
}

/// A running command: the pid of its guard, which is also its process group id (or, with no
/// guard, the command's own pid).
pub struct Child {
    pub group: libc::pid_t,
    /// A guard leads the group (else the command's process does, and the starter that made
    /// its cgroup guards it: `command::oversight`).
    guarded: bool,
    shared: Shared,
    cgroup: Option<Cgroup>,
    /// cronlock SIGKILLed the group, the guard (its leader) included.
    killed: Cell<bool>,
    /// The command's wait status, read by cronlock itself when the guard could not hand it over.
    taken_over: Cell<Option<i32>>,
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

/// Variables that hold cronlock's secrets (a Redis password, a ping URL): the command does not
/// inherit them. Everything else of the environment passes on, `REDIS_URL` included (the job may
/// use it for its own work), and so do the `_FILE` forms, which name a file, not a secret.
pub const HIDDEN_FROM_COMMAND: &[&str] = &["CRONLOCK_REDIS_URL", "CRONLOCK_PING_URL"];

/// A variable cronlock gives the command (`CRONLOCK_KEY`, `CRONLOCK_FENCING_TOKEN`, ...).
pub struct CommandVariable {
    pub name: &'static str,
    pub value: String,
}

/// The command's environment: ours without [`HIDDEN_FROM_COMMAND`], with `extra_env` set.
fn command_env(extra_env: &[CommandVariable]) -> io::Result<Vec<CString>> {
    let mut env: Vec<CString> = Vec::new();
    for (k, v) in std::env::vars_os() {
        let hidden = HIDDEN_FROM_COMMAND.iter().any(|name| OsStr::new(name) == k);
        if hidden || extra_env.iter().any(|v| OsStr::new(v.name) == k) {
            continue;
        }
        let mut kv = k.clone();
        kv.push("=");
        kv.push(v);
        if let Ok(c) = cstring(&kv) {
            env.push(c);
        }
    }
    for v in extra_env {
        env.push(cstring(OsStr::new(&format!("{}={}", v.name, v.value)))?);
    }
    Ok(env)
}

/// The pipes that replace the command's stdout and stderr ([`guard::UNTOUCHED`]: a stream
/// left as cronlock's own): the command's write ends, and cronlock's read ends (which the guard
/// closes in its copy).
#[derive(Clone, Copy, Debug)]
pub struct Stdio {
    pub writers: [RawFd; 2],
    pub readers: [RawFd; 2],
}

impl Stdio {
    /// cronlock's own stdout and stderr.
    pub const UNTOUCHED: Stdio = Stdio {
        writers: [guard::UNTOUCHED; 2],
        readers: [guard::UNTOUCHED; 2],
    };
}

/// Start `argv` with `extra_env` added, behind a guard, in a new process group (and in a cgroup
/// the guard makes at `cgroup`, when it can).
/// The guard and the command read the kill-by time from `shared`.
pub fn spawn(
    argv: &[OsString],
    extra_env: &[CommandVariable],
    shared: Shared,
    cgroup: Option<PathBuf>,
    stdio: Stdio,
) -> Result<Child, SpawnError> {
    let path = cgroup
        .as_ref()
        .and_then(|dir| CString::new(dir.as_os_str().as_bytes()).ok());
    let mut job = prepare(argv, extra_env, shared, path, stdio)?;
    // Orphans whose guard died (SIGKILLed with the group) come to us, to be killed, not to init.
    // SAFETY: plain prctl on our own process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };

    // SAFETY: we are cronlock's main thread; the guard works on its own copy of `prepared`.
    let pid = unsafe { guard::start(&job.prepared) };
    let pid = job.started(pid)?;
    // Also from the parent, so the group exists before we could signal it.
    // SAFETY: plain system call on our child.
    unsafe { libc::setpgid(pid, pid) };
    let report = job.report();
    // The guard has made the cgroup by now (or said why not): from here on it is ours to remove,
    // whatever happens. Only one the guard made: never another run's.
    let cgroup = cgroup
        .filter(|_| shared.has(shared::CGROUP_MADE))
        .map(Cgroup::adopt);
    if let Some(code) = report {
        // The guard ends at once when its command did not start.
        process::reap(pid);
        // Dropping it kills what is left in it and removes it.
        drop(cgroup);
        return Err(not_started(job.program, code));
    }
    Ok(Child {
        group: pid,
        guarded: true,
        shared,
        cgroup,
        killed: Cell::new(false),
        taken_over: Cell::new(None),
    })
}

/// Start `argv` as [`spawn`] does, but with no guard: straight into `cgroup`, which a replica's
/// starter made for this run and guards (`command::oversight`), leading a process group of its
/// own. The command is this process's child.
pub fn spawn_overseen(
    argv: &[OsString],
    extra_env: &[CommandVariable],
    shared: Shared,
    cgroup: RunCgroup,
    stdio: Stdio,
) -> Result<Child, SpawnError> {
    let path = CString::new(cgroup.dir.as_os_str().as_bytes()).ok();
    let mut job = prepare(argv, extra_env, shared, path, stdio)?;
    job.prepared.own_group = true;
    // What the command's processes leave orphaned comes to us (not to the starter, not to a
    // replica that is PID 1), to be killed and reaped as the command ends.
    // SAFETY: plain prctl on our own process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    // SAFETY: `own_group` is set; this thread waits until the command's process has exec'd or
    // exited, and `job` outlives the call.
    let pid = unsafe { guard::start_alone(&job.prepared, cgroup.fd.as_raw_fd()) };
    let pid = job.started(pid)?;
    // SAFETY: plain system call on our child (it does the same itself before `execve`).
    unsafe { libc::setpgid(pid, pid) };
    let report = job.report();
    let RunCgroup { dir, fd } = cgroup;
    drop(fd);
    let cgroup = Some(Cgroup::adopt(dir));
    if let Some(code) = report {
        // Its process ends at once when the command did not start.
        process::reap(pid);
        return Err(not_started(job.program, code));
    }
    Ok(Child {
        group: pid,
        guarded: false,
        shared,
        cgroup,
        killed: Cell::new(false),
        taken_over: Cell::new(None),
    })
}

/// A command about to start: what the guard or the command's process is given, and the pipe
/// an exec failure is reported on.
struct Job {
    program: String,
    prepared: Prepared,
    read_end: Option<OwnedFd>,
    write_end: Option<OwnedFd>,
}

fn prepare(
    argv: &[OsString],
    extra_env: &[CommandVariable],
    shared: Shared,
    cgroup_path: Option<CString>,
    stdio: Stdio,
) -> Result<Job, SpawnError> {
    let program = argv[0].to_string_lossy().into_owned();
    let fail = |error| SpawnError {
        program: program.clone(),
        error,
        too_late: false,
        no_process: false,
    };
    let args = argv
        .iter()
        .map(|a| cstring(a))
        .collect::<io::Result<Vec<_>>>()
        .map_err(fail)?;
    let env = command_env(extra_env).map_err(fail)?;
    let (read_end, write_end) = pipe2(OFlag::O_CLOEXEC).map_err(|e| fail(e.into()))?;
    let mut prepared = Prepared::new(
        candidates(&argv[0]).map_err(fail)?,
        args,
        env,
        shared,
        cgroup_path,
    )
    .map_err(fail)?;
    prepared.stdio = stdio.writers;
    prepared.stdio_readers = stdio.readers;
    prepared.report_fd = write_end.as_raw_fd();
    Ok(Job {
        program,
        prepared,
        read_end: Some(read_end),
        write_end: Some(write_end),
    })
}

impl Job {
    /// The pid [`guard::start`] or [`guard::start_alone`] returned, or why no process was made.
    /// The report pipe's write end is closed here: only the new process holds it now.
    fn started(&mut self, pid: isize) -> Result<libc::pid_t, SpawnError> {
        drop(self.write_end.take());
        if pid < 0 {
            return Err(SpawnError {
                program: self.program.clone(),
                error: io::Error::from_raw_os_error(-pid as i32),
                too_late: false,
                no_process: true,
            });
        }
        Ok(pid as libc::pid_t)
    }

    /// What the new process reported: nothing (the pipe closed on a successful exec), or the
    /// code of why the command did not start.
    fn report(&mut self) -> Option<i32> {
        let mut report = Vec::with_capacity(4);
        let _ = std::fs::File::from(self.read_end.take()?).read_to_end(&mut report);
        <[u8; 4]>::try_from(report.as_slice())
            .ok()
            .map(i32::from_ne_bytes)
    }
}

/// Why the guard's command did not start, from the code the guard reported: too late for the
/// lock, no process could be made, or exec's errno.
fn not_started(program: String, code: i32) -> SpawnError {
    let (error, too_late, no_process) = if code == guard::REPORT_TOO_LATE {
        let error = io::Error::other("the lock could expire before it started");
        (error, true, false)
    } else if code == guard::REPORT_NOT_CONTAINED {
        let error = io::Error::other("it could not join the cgroup its starter made");
        (error, false, true)
    } else if code >= guard::REPORT_NO_PROCESS {
        let errno = code - guard::REPORT_NO_PROCESS;
        (io::Error::from_raw_os_error(errno), false, true)
    } else {
        (io::Error::from_raw_os_error(code), false, false)
    };
    SpawnError {
        program,
        error,
        too_late,
        no_process,
    }
}

/// How the command is contained, for `-v`.
pub struct Containment {
    /// The mechanism's name: `cgroup` or `process-group`.
    pub mechanism: &'static str,
    /// A phrase: "its own cgroup ...".
    pub how: String,
}

impl Child {
    /// Send `sig` to the command's whole process group. A group that is gone is not an error.
    pub fn signal_group(&self, sig: libc::c_int) {
        // SAFETY: kill on our own process group.
        unsafe { libc::kill(-self.group, sig) };
    }

    /// A signal meant to end the command also continues it, so a stopped job sees it (uutils
    /// `timeout` does the same).
    pub fn terminate(&self, sig: libc::c_int) {
        self.signal_group(sig);
        self.signal_group(libc::SIGCONT);
    }

    /// SIGKILL the whole job: its cgroup when there is one, and its process group.
    pub(super) fn kill_all(&self) {
        self.killed.set(true);
        if let Some(cg) = &self.cgroup {
            cg.kill();
        }
        self.signal_group(libc::SIGKILL);
    }

    /// Did the guard end the job because the kill-by time passed?
    pub fn guard_enforced(&self) -> bool {
        self.shared.has(shared::GUARD_ENFORCED)
    }

    /// The job's cgroup, if the command actually joined it.
    /// How the command is contained, for `-v`; `no_cgroup` says why there is no cgroup, when
    /// there is none.
    pub fn containment(&self, no_cgroup: Option<String>) -> Containment {
        match (self.cgroup(), no_cgroup) {
            (Some(cg), _) => Containment {
                mechanism: "cgroup",
                how: format!(
                    "its own cgroup {} (ended with cgroup.kill)",
                    cg.dir.display()
                ),
            },
            (None, why) => Containment {
                mechanism: "process-group",
                how: format!(
                    "its own process group, which the guard stops as a whole (fine for most \
                     jobs; a process that leaves the group would escape it, which a cgroup \
                     prevents: {})",
                    why.unwrap_or_else(|| "the command could not join the cgroup".into())
                ),
            },
        }
    }

    pub fn cgroup(&self) -> Option<&Cgroup> {
        self.cgroup
            .as_ref()
            .filter(|_| self.shared.has(shared::CGROUP_JOINED))
    }

    /// The command's wait status when it has exited but its guard, stopped (SIGSTOP, a
    /// debugger), cannot reap it: a zombie still shows its status in /proc. The parent's pid is
    /// checked, so a pid the guard reaped and the system gave to another process is never taken
    /// for it; a guard that is merely busy ending the job (it reaps in a moment) is left to it.
    pub(super) fn unreaped(&self) -> Option<i32> {
        if !self.guarded {
            // The command is our own child: we reap it.
            return None;
        }
        let pid = self.shared.command()?;
        let fields = |pid: i32| -> Option<Vec<String>> {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // After "pid (comm)": (3) state, (4) ppid, ... (52) exit_code.
            let rest = stat.rsplit_once(')')?.1;
            Some(rest.split_whitespace().map(str::to_string).collect())
        };
        let command = fields(pid)?;
        if command.first()? != "Z" || command.get(1)?.parse::<i32>().ok()? != self.group {
            return None;
        }
        let guard = fields(self.group)?;
        if !matches!(guard.first()?.as_str(), "T" | "t") {
            return None;
        }
        command.get(49)?.parse().ok()
    }

    /// The command ended with `status` and the guard cannot say so: end the guard (SIGKILL stops
    /// a stopped process too) and what the job left, and finish with that status.
    pub(super) fn take_over(&self, status: i32) {
        self.taken_over.set(Some(status));
        self.kill_all();
    }

    /// Reap whatever has exited. Returns the command's wait status once the guard has ended, after
    /// killing anything the command left running (the lock is about to be released): its group,
    /// its cgroup, and orphans that reached us because the guard died.
    pub(super) fn try_finish(&mut self) -> Option<Finished> {
        loop {
            // Left waitable, so the guard's pid (the group's id) stays reserved until reaped.
            let pid = process::ended_any()?;
            if pid == self.group && !self.guarded {
                // The command itself: what it left behind goes now, while its pid (the
                // group's id) cannot be reused.
                self.kill_all();
                let status = process::reap(pid);
                // Its orphans, which reached us (a subreaper): killed and reaped.
                crate::command::tree::kill_descendants(
                    self.cgroup.as_ref().and_then(Cgroup::kill_fd),
                );
                // Dropping it kills what is left in it and removes it.
                drop(self.cgroup.take());
                let status = self.taken_over.get().unwrap_or(status);
                return Some(Finished {
                    status,
                    guard_died: None,
                });
            }
            if pid == self.group {
                // The guard hands over the command's status once it has killed what the command
                // left behind. Without it (the guard was killed, or ended the job itself), kill
                // the job here, while the guard is a zombie and the group id cannot be reused.
                let ended = self.shared.status();
                // Neither handed over a status nor ended the job itself, and not killed by us:
                // something else killed it.
                let unexpected = !self.guard_enforced() && !self.killed.get();
                if ended.is_none() {
                    self.kill_all();
                }
                let status = process::reap(pid);
                // Orphans that reached us because the guard died; no child's status matters now.
                crate::command::tree::kill_descendants(
                    self.cgroup.as_ref().and_then(Cgroup::kill_fd),
                );
                // Dropping it kills what is left in it and removes it.
                drop(self.cgroup.take());
                let guard_died = (ended.is_none() && unexpected).then_some(status);
                return Some(Finished {
                    status: self.taken_over.get().or(ended).unwrap_or(status),
                    guard_died,
                });
            }
            // An orphan that reached us (it has ended).
            process::reap(pid);
        }
    }
}

/// What [`Child::try_finish`] found once the guard had ended.
pub(super) struct Finished {
    /// The command's wait status (the guard's own when the guard died first).
    pub(super) status: libc::c_int,
    /// The guard's wait status, when it died without ending the job by itself.
    pub(super) guard_died: Option<libc::c_int>,
}

/// The line that says the guard died: the job was stopped with it.
pub(super) fn guard_died_message(group: libc::pid_t, status: libc::c_int) -> String {
    let how = match Exit::from_wait_status(status) {
        Exit::Signal(n) => format!("killed by {}", signals::name(n)),
        e => format!("exited with status {}", e.code()),
    };
    format!(
        "the guard process ({group}) died unexpectedly ({how}); the command was stopped with it"
    )
}
