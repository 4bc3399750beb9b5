//! Containment: where cgroup v2 is writable (root on a host, systemd `Delegate=yes`), the job runs
//! in a cgroup of its own, and ending it is one write to `cgroup.kill`, as systemd does. Nothing
//! escapes that: not `setsid`, not a double fork, not a process group of its own.
//!
//! Where no cgroup can be made (a container with a read-only `/sys/fs/cgroup`, an unprivileged
//! user), the [guard](crate::command::guard)'s subreaper and its process group do the same job, one
//! process at a time.
//!
//! cronlock only plans where the cgroup goes (a name no other run can have); the guard makes it, right before it starts the
//! command, and removes it if cronlock dies. So a cgroup never exists without a guard to remove it,
//! even when cronlock is SIGKILLed between taking the lock and starting the guard.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::clock::Instant;

/// The job's cgroup, made by the guard before it starts the command (so that it exists only while
/// a guard is there to remove it, even if cronlock is SIGKILLed a moment after making its plan):
/// cronlock's handle on it, to kill what is in it and to remove it.
#[derive(Debug)]
pub struct Cgroup {
    pub dir: PathBuf,
    /// `cgroup.kill`, opened once the command runs (None: it could not be opened).
    kill: Option<File>,
}

/// Undo `/proc/self/mountinfo`'s octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Our own cgroup v2 directory, found once per process: a replica's starter finds it before it
/// forks its runs (see [`find_own`]), so they do not look again. cronlock never moves itself to
/// another cgroup.
fn own_dir() -> Result<PathBuf, String> {
    static OWN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    OWN.get_or_init(find_own_dir).clone()
}

/// Find our own cgroup v2 directory now, so that the processes forked from here know it.
pub fn find_own() {
    let _ = own_dir();
}

/// The cgroup2 mount plus our path from `/proc/self/cgroup`.
fn find_own_dir() -> Result<PathBuf, String> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let rel = cgroups
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("no cgroup v2 hierarchy")?;
    // Where systemd mounts it (pure v2, or hybrid's "unified"): no need to read mountinfo. A
    // wrong guess could only misplace the cgroup, never weaken it: it contains what it contains.
    for mount in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let is_v2 = nix::sys::statfs::statfs(mount)
            .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC);
        let dir = Path::new(mount).join(rel.trim_start_matches('/'));
        if is_v2 && dir.is_dir() {
            return Ok(dir);
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    for line in mounts.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        if right.split(' ').next() != Some("cgroup2") {
            continue;
        }
        let fields: Vec<&str> = left.split(' ').collect();
        let (Some(root), Some(mount)) = (fields.get(3), fields.get(4)) else {
            continue;
        };
        let root = unescape(root);
        let Some(inside) = rel.strip_prefix(root.trim_end_matches('/')) else {
            continue;
        };
        let mut dir = PathBuf::from(unescape(mount));
        dir.extend(inside.split('/').filter(|s| !s.is_empty()));
        return Ok(dir);
    }
    Err("no cgroup2 file system mounted".into())
}

/// Where this run's cgroup goes: `cronlock-TOKEN` under our own cgroup, named after the run's
/// lock token (a random uuid), so that it is unique on the machine whatever PID namespace cronlock
/// runs in: every cronlock that is PID 1 in a container has the same pid. The guard makes it and
/// never takes over one that exists already. The error says why there is none, for `-v`.
pub fn plan(token: &str) -> Result<PathBuf, String> {
    Ok(own_dir()?.join(format!("cronlock-{token}")))
}

/// How long a `cronlock-*` cgroup must have been empty-and-unchanged before [`sweep`] takes it
/// for an orphan: a starting run's guard creates the command inside its new cgroup within
/// microseconds of making it, so one this old and empty belongs to no run that is starting.
const ORPHAN_AGE: Duration = Duration::from_secs(5);

/// Remove the empty `cronlock-*` cgroups beside `ours` (in the same parent) that runs killed
/// together with their guards (SIGKILL to both, as a crashing host does) left behind, so that a
/// host that crash-loops does not pile them up. Only cgroups with no process in them (`populated
/// 0`: no live run's command is there) and older than [`ORPHAN_AGE`]; a run that is ending
/// removes its own too, and whichever `rmdir` comes first wins; one that is locked is a starter's,
/// for a command still to come, and is left. Best effort: errors are ignored.
pub fn sweep(ours: &Path) {
    if let Some(parent) = ours.parent() {
        sweep_in(parent, Some(ours));
    }
}

/// [`sweep`] for the runs a replica starts, which do not sweep themselves (each would read every
/// other run's cgroup: quadratic in the runs at once): the replica sweeps its own cgroup's
/// `cronlock-*` children now and then.
pub fn sweep_own() {
    if let Ok(dir) = own_dir() {
        sweep_in(&dir, None);
    }
}

fn sweep_in(parent: &Path, ours: Option<&Path>) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let named = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with("cronlock-"));
        if !named || Some(dir.as_path()) == ours {
            continue;
        }
        let empty = std::fs::read_to_string(dir.join("cgroup.events"))
            .is_ok_and(|e| e.lines().any(|l| l == "populated 0"));
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age >= ORPHAN_AGE));
        // Not one a replica's starter made for a run whose command is still to come: that one
        // is locked (`command::oversight`).
        let unclaimed = || {
            let f = std::fs::File::open(&dir).ok()?;
            f.try_lock().ok().map(|_| f)
        };
        if empty && old {
            if let Some(_unclaimed) = unclaimed() {
                // rmdir: a cgroup with a process (or a child cgroup) in it is refused (EBUSY).
                let _ = std::fs::remove_dir(&dir);
            }
        }
    }
}

impl Cgroup {
    /// Take charge of the cgroup the guard made at `dir`.
    pub fn adopt(dir: PathBuf) -> Cgroup {
        let kill = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.kill"))
            .ok();
        Cgroup { dir, kill }
    }

    /// `cgroup.kill`, for [`crate::command::tree::kill_descendants`].
    pub fn kill_fd(&self) -> Option<RawFd> {
        self.kill.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Kill everything in the cgroup.
    pub fn kill(&self) {
        use std::io::Write;
        if let Some(mut kill) = self.kill.as_ref() {
            let _ = kill.write_all(b"1");
        }
    }
}

impl Drop for Cgroup {
    /// Whoever drops the cgroup removes it, killing what is left in it and waiting at most a
    /// second for it to empty: after the job, and also when an internal error unwinds past it.
    fn drop(&mut self) {
        remove_dir(&self.dir, Duration::from_secs(1), &|| self.kill());
    }
}

/// Kill everything in the cgroup at `dir`, by its path (one that is gone is not an error): for a
/// replica's starter, which keeps no descriptor per run (`command::oversight`).
pub fn kill_at(dir: &Path) {
    use std::io::Write;
    let kill = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.kill"));
    if let Ok(mut kill) = kill {
        let _ = kill.write_all(b"1");
    }
}

/// Remove the cgroup at `dir` by its path, killing what is left in it, within `within`.
pub fn remove_at(dir: &Path, within: Duration) {
    remove_dir(dir, within, &|| kill_at(dir));
}

/// Remove the cgroup at `dir`, calling `kill` while it is busy (a process still on its way
/// out), for at most `within`.
fn remove_dir(dir: &Path, within: Duration, kill: &dyn Fn()) {
    let end = Instant::now() + within;
    let Ok(path) = CString::new(dir.as_os_str().as_bytes()) else {
        return;
    };
    loop {
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::rmdir(path.as_ptr()) } == 0 {
            return;
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EBUSY) if Instant::now() < end => {
                kill();
                std::thread::sleep(Duration::from_millis(1));
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/sys/fs/cgroup"), "/sys/fs/cgroup");
        assert_eq!(unescape(r"/a\040b"), "/a b");
    }
}
