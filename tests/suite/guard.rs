//! The guard is independent of cronlock: whatever takes cronlock down (the kernel's OOM killer,
//! which also kills every process sharing the victim's memory) leaves the guard to end the job;
//! and every run's job cgroup is its own, whatever PID namespace cronlock runs in.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::*;

/// A job that leaves a `setsid` escapee behind, and says where it runs: `pid`, `setsid.pid`,
/// `cgroup` in `dir`.
fn job(dir: &Path) -> String {
    format!(
        "cd {} || exit 99; setsid sh -c 'echo $$ > setsid.pid; exec sleep 60' & \
         grep ^0:: /proc/$$/cgroup > cgroup; echo $$ > pid; wait",
        dir.display()
    )
}

/// Start a cronlock running [`job`] with `--ttl 10s`, with `setup` run before `execve`.
fn start(
    r: &Redis,
    dir: &Path,
    setup: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static,
) -> Child {
    let mut c = cronlock(r);
    c.args(["--ttl", "10s", "k", "-c"]).arg(job(dir));
    // SAFETY: `setup` makes only system calls (writes to /proc and cgroup files).
    unsafe { c.pre_exec(setup) };
    let c = c.spawn().unwrap();
    read_pid(&dir.join("pid"));
    read_pid(&dir.join("setsid.pid"));
    c
}

/// The job and its escapee are gone well before the lock could expire, and so is its cgroup.
fn assert_job_gone(r: &Redis, dir: &Path, what: &str) {
    let cgroup = job_cgroup(dir);
    for f in ["pid", "setsid.pid"] {
        let pid = read_pid(&dir.join(f));
        assert!(
            wait_for(Duration::from_secs(3), || !alive(pid)),
            "{what}: {f} ({pid}) survived cronlock"
        );
    }
    // Still locked: the job ended while the lock was valid, not because it expired.
    assert!(r.pttl("cronlock:{k}") > 0, "{what}: the lock expired first");
    if let Some(cg) = cgroup {
        assert!(
            wait_for(Duration::from_secs(3), || !cg.exists()),
            "{what}: {} left behind",
            cg.display()
        );
    }
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}

/// A memory cgroup with a limit, v1 (`memory.limit_in_bytes`) or v2 (`memory.max`), whichever
/// this machine has; everything in it is killed and it is removed on drop.
struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    fn new(limit: u64) -> MemoryCgroup {
        let name = format!("cronlock-test-oom-{}", std::process::id());
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .unwrap_or_else(|e| lacks(&format!("/proc/self/cgroup ({e})"), "the OOM test"));
        let v1 = own
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()));
        let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"));
        if v1.is_none() && !v2 {
            lacks(
                "a memory cgroup controller (no ':memory:' line in /proc/self/cgroup, no \
                 'memory' in /sys/fs/cgroup/cgroup.controllers)",
                "the OOM test, to give the job a memory limit",
            );
        }
        let make = |dir: &Path| {
            std::fs::create_dir(dir).unwrap_or_else(|e| {
                lacks(
                    &format!("a writable memory cgroup ({}: {e})", dir.display()),
                    "the OOM test",
                )
            })
        };
        let cg = if let Some(rel) = v1 {
            let dir = Path::new("/sys/fs/cgroup/memory")
                .join(rel.trim_start_matches('/'))
                .join(name);
            make(&dir);
            write(&dir.join("memory.limit_in_bytes"), &limit.to_string());
            MemoryCgroup { dir, v2: false }
        } else {
            // Pure v2: under the root, which may enable the memory controller for its children.
            write(
                Path::new("/sys/fs/cgroup/cgroup.subtree_control"),
                "+memory",
            );
            let dir = Path::new("/sys/fs/cgroup").join(name);
            make(&dir);
            write(&dir.join("memory.max"), &limit.to_string());
            let _ = std::fs::write(dir.join("memory.swap.max"), "0");
            MemoryCgroup { dir, v2: true }
        };
        cg
    }

    fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// How many processes the kernel's OOM killer killed in it.
    fn oom_kills(&self) -> u64 {
        let (file, field) = if self.v2 {
            ("memory.events", "oom_kill ")
        } else {
            ("memory.oom_control", "oom_kill ")
        };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix(field)?.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        remove_cgroup(&self.dir);
    }
}

/// SIGKILL everything in the cgroup `dir` and in the cgroups under it, and remove them all
/// (within a second; best effort).
fn remove_cgroup(dir: &Path) {
    let kids = |d: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(d)
            .map(|e| {
                e.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default()
    };
    for _ in 0..100 {
        for d in kids(dir).iter().map(PathBuf::as_path).chain([dir]) {
            let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
            procs
                .lines()
                .filter_map(|p| p.parse().ok())
                .for_each(|p| signal(p, libc::SIGKILL));
        }
        kids(dir).iter().for_each(|d| {
            let _ = std::fs::remove_dir(d);
        });
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Put the calling process (between fork and exec) into the cgroup whose `cgroup.procs` is `procs`.
fn join(procs: &Path) -> impl FnMut() -> std::io::Result<()> + Send + Sync + 'static {
    let procs = std::ffi::CString::new(procs.as_os_str().as_encoded_bytes()).unwrap();
    move || {
        // SAFETY: open/write/close on a path we own; no allocation between fork and exec.
        unsafe {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
        }
        Ok(())
    }
}

/// The kernel's OOM killer picks cronlock (oom_score_adj 1000, as any user may raise its own):
/// it SIGKILLs cronlock and every process sharing its memory. The guard has its own, so it lives
/// on and ends the job, escapee included, and removes the job's cgroup.
#[test]
fn an_oom_kill_of_cronlock_leaves_the_guard_to_end_the_job() {
    let r = Redis::start();
    for round in 0..2 {
        let what = format!("round {round}");
        let memory = MemoryCgroup::new(64 << 20);
        let dir = scratch("oom");
        let mut c = start(&r, &dir, join(&memory.procs()));
        // Raised once the job runs, so the guard (started before) keeps the adjustment it had.
        write(
            &PathBuf::from(format!("/proc/{}/oom_score_adj", c.id())),
            "1000",
        );
        // A memory user in the same cgroup that needs more than the limit leaves.
        // `tail` holds the last 96 MiB it read. Not python3: the kernel scores cronlock (adj 1000)
        // at its RSS plus the whole limit and the hog at its RSS, shared libraries included, and
        // python3's 4.5 MiB of mapped libraries can outscore a release build of cronlock.
        let mut hog = Command::new("/bin/sh");
        hog.args(["-c", "cat /dev/zero | tail -c 96M > /dev/null"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        tie(&mut hog);
        // SAFETY: `join` makes only system calls.
        unsafe { hog.pre_exec(join(&memory.procs())) };
        let mut hog = hog.spawn().unwrap();
        let mut status = None;
        let killed = wait_for(Duration::from_secs(20), || {
            status = c.try_wait().unwrap();
            status.is_some()
        });
        let _ = hog.kill();
        assert!(killed, "{what}: the OOM killer did not kill cronlock");
        let status = status.unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{what}: {status:?}");
        assert!(memory.oom_kills() >= 1, "{what}: no OOM kill happened");
        assert_job_gone(&r, &dir, &what);
        let _ = hog.wait();
        r.del("cronlock:{k}");
    }
}

/// `kcmp(2)`'s type for "same address space" (`enum kcmp_type` in `linux/kcmp.h`).
const KCMP_VM: libc::c_int = 1;

/// The processes that share `pid`'s memory (`kcmp(KCMP_VM)`), `pid` included.
fn sharing_memory_with(pid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&other| {
            // SAFETY: kcmp only compares two processes' kernel objects.
            unsafe { libc::syscall(libc::SYS_kcmp, pid, other, KCMP_VM, 0, 0) == 0 }
        })
        .collect()
}

/// The OOM killer's rule by hand: SIGKILL cronlock and every process sharing its memory.
#[test]
fn killing_everything_that_shares_cronlocks_memory_leaves_the_guard() {
    let r = Redis::start();
    for round in 0..3 {
        let dir = scratch("kcmp");
        let mut c = start(&r, &dir, || Ok(()));
        let victims = sharing_memory_with(c.id() as i32);
        assert_eq!(
            victims,
            vec![c.id() as i32],
            "round {round}: shared with {victims:?}"
        );
        for pid in victims {
            signal(pid, libc::SIGKILL);
        }
        c.wait().unwrap();
        assert_job_gone(&r, &dir, &format!("round {round}"));
        r.del("cronlock:{k}");
    }
}

/// A killed guard is one line, and the job goes with it.
#[test]
fn a_guard_that_dies_is_said_and_the_job_goes_with_it() {
    let r = Redis::start();
    let dir = scratch("guard-died");
    let mut c = cronlock(&r);
    let c = c
        .args(["--ttl", "10s", "k", "-c"])
        .arg(job(&dir))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let cmd = read_pid(&dir.join("pid"));
    read_pid(&dir.join("setsid.pid"));
    // The command's parent is the guard.
    let guard = parent_of(cmd);
    signal(guard, libc::SIGKILL);
    let out = c.wait_with_output().unwrap();
    assert_eq!(code(&out), 137);
    let err = stderr(&out);
    let lines = own_lines(&err);
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains(&format!(
            "the guard process ({guard}) died unexpectedly (killed by SIGKILL)"
        )),
        "{err}"
    );
    for f in ["pid", "setsid.pid"] {
        let pid = read_pid(&dir.join(f));
        assert!(
            wait_for(Duration::from_secs(3), || !alive(pid)),
            "{f} survived"
        );
    }
    assert!(!r.exists("cronlock:{k}"), "the lock was not released");
}

/// Every cronlock that is PID 1 in its own PID namespace has pid 1: two of them started at once in
/// one cgroup still get a job cgroup each, and neither touches the other's.
#[test]
fn pid_1_cronlocks_side_by_side_get_a_cgroup_each() {
    let r = Redis::start();
    let unshare = which("unshare");
    let probe = Command::new(&unshare)
        .args(["-fp", "--mount-proc", "true"])
        .output()
        .unwrap();
    if !probe.status.success() {
        lacks(
            &format!(
                "a PID namespace with its own /proc (`unshare -fp --mount-proc true` failed: {}; \
                 is / a mount point?)",
                String::from_utf8_lossy(&probe.stderr).trim()
            ),
            "the PID-1 test",
        );
    }
    for pair in 0..20 {
        let dirs = [scratch("pid1-a"), scratch("pid1-b")];
        let children: Vec<Child> = dirs
            .iter()
            .enumerate()
            .map(|(i, dir)| {
                let mut u = Command::new(&unshare);
                u.args(["-fp", "--mount-proc", &bin(), "-v", &format!("k{i}"), "-c"])
                    .arg(format!(
                        "cd {} && grep ^0:: /proc/self/cgroup > cgroup && sleep 0.3 && echo done > done",
                        dir.display()
                    ))
                    .env_clear()
                    .env("PATH", "/usr/bin:/bin")
                    .env("CRONLOCK_REDIS_URL", r.url())
                    .stdin(Stdio::null())
                    .stderr(Stdio::piped());
                tie(&mut u);
                u.spawn().unwrap()
            })
            .collect();
        let mut seen = Vec::new();
        for (mut c, dir) in children.into_iter().zip(&dirs) {
            let err = BufReader::new(c.stderr.take().unwrap())
                .lines()
                .map(Result::unwrap)
                .collect::<Vec<_>>()
                .join("\n");
            assert_eq!(c.wait().unwrap().code(), Some(0), "pair {pair}: {err}");
            assert!(
                dir.join("done").exists(),
                "pair {pair}: the job did not run to its end"
            );
            let cg = err
                .split_once("its own cgroup ")
                .map(|(_, rest)| PathBuf::from(rest.split(" (").next().unwrap()))
                .unwrap_or_else(|| panic!("pair {pair}: no cgroup of its own: {err}"));
            assert_eq!(job_cgroup(dir).as_ref(), Some(&cg), "pair {pair}");
            assert!(!cg.exists(), "pair {pair}: {} left behind", cg.display());
            seen.push(cg);
        }
        assert_ne!(seen[0], seen[1], "pair {pair}");
    }
}

fn which(name: &str) -> String {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin"]
        .iter()
        .map(|d| format!("{d}/{name}"))
        .find(|p| Path::new(p).exists())
        .unwrap_or_else(|| panic!("{name} is required for the tests"))
}

/// So few processes allowed (`ulimit -u`, as an unprivileged user: root is exempt) that the
/// guard, or then the command's process, cannot be made: the command never ran, so it is
/// cronlock's own failure (125, as timeout(1)'s failed fork), one line, the lock released.
#[test]
fn no_process_for_the_guard_or_the_command_is_cronlocks_failure() {
    let r = Redis::start_tcp();
    let dir = scratch("nproc");
    std::fs::set_permissions(&*dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let marker = dir.join("ran");
    // 1: the guard cannot be forked; 2: the guard can, the command's process cannot.
    for nproc in ["1", "2"] {
        let c = cronlock(&r);
        let program = c.get_program().to_owned();
        let mut limited = Command::new(which("prlimit"));
        limited
            .arg(format!("--nproc={nproc}"))
            .arg(which("setpriv"))
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .arg(program)
            .args(["k", "touch"])
            .arg(&marker);
        for (k, v) in c.get_envs() {
            match v {
                Some(v) => limited.env(k, v),
                None => limited.env_remove(k),
            };
        }
        limited.stdin(Stdio::null());
        let out = run(&mut limited);
        let err = stderr(&out);
        assert_eq!(code(&out), 125, "nproc {nproc}: {err}");
        assert!(one_line(&out).contains("ulimit -u"), "nproc {nproc}: {err}");
        assert!(!marker.exists(), "nproc {nproc}: the command ran");
        assert!(
            !r.exists("cronlock:{k}"),
            "nproc {nproc}: the lock was left behind"
        );
    }
}

/// The tests that measure time: they run alone (`common::alone`).
mod alone;
mod sweep;
