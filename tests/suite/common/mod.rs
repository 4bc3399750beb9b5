//! Test harness: the real cronlock binary, scratch directories, bounded polling instead of sleeps,
//! a bound on the whole run, and the processes tests start. What they start is split by kind:
//! `servers` (redis-server), `sentinel`, `cluster`, `hostile` (a proxy, a relay), `scenarios`
//! (told by several suites), `replicas` (`--crontab`), `story` (catch-up, retries, suspend),
//! `prom` (Prometheus's tools). `alone` keeps the tests that measure time apart from the others.

pub mod alone;
pub mod cluster;
pub mod hostile;
pub mod prom;
pub mod replicas;
pub mod scenarios;
pub mod sentinel;
pub mod servers;
pub mod story;

pub use alone::measure_alone;
pub use cluster::*;
pub use hostile::*;
pub use scenarios::*;
pub use sentinel::*;
pub use servers::*;

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_cronlock");

/// Poll `cond` every 5 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    alone::enter();
    let end = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A fresh directory for one test's files, deleted when dropped.
pub struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How long the test binary may run in all (`CRONLOCK_TEST_LIMIT`, seconds; 900 by default: the
/// whole suite takes about 5 minutes on 2 cores).
const RUN_LIMIT: u64 = 900;

/// Bound the whole test run: once it has run for [`RUN_LIMIT`], it says so and exits, and
/// every process a test started dies with it (they are tied to it, or to its threads). So no
/// wait of any test can hang a run, whatever the servers or signal dispositions do. Started by
/// the first scratch directory, server or cronlock of the run.
pub fn limit_run() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        let secs = std::env::var("CRONLOCK_TEST_LIMIT")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(RUN_LIMIT);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(secs));
            eprintln!("this test binary ran for {secs} s (CRONLOCK_TEST_LIMIT): a test hangs; stopping it");
            std::process::exit(124);
        });
    });
}

pub fn scratch(name: &str) -> Scratch {
    alone::enter();
    limit_run();
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// A free port below 55536 whose cluster bus port (port + 10000) is free too.
pub fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port < 55536 && TcpListener::bind(("127.0.0.1", port + 10000)).is_ok() {
            return port;
        }
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The binary under test: this build's, or `CRONLOCK_TEST_BIN` (to show that a test fails on an
/// older build).
pub fn bin() -> String {
    alone::enter();
    std::env::var("CRONLOCK_TEST_BIN").unwrap_or_else(|_| BIN.to_string())
}

/// The cronlock binary with a clean environment pointing at `redis`.
pub fn cronlock(redis: &Redis) -> Command {
    cronlock_at(&redis.url())
}

/// The binary under test starts with the default dispositions of the signals tests send,
/// whatever this process inherited (a background job of a non-interactive shell ignores SIGINT
/// and SIGQUIT, nohup SIGHUP): an ignored signal would never reach it. They are reset here, in
/// the test process, once, and not between fork and exec: a `pre_exec` makes std fork (not
/// `posix_spawn`), which costs a fork of this whole process for every child.
fn default_signals() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: setting a signal's disposition to its default.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    });
}

/// The cronlock binary with a clean environment pointing at `url`.
pub fn cronlock_at(url: &str) -> Command {
    cronlock_of(&bin(), url)
}

/// This test build's binary, whatever `CRONLOCK_TEST_BIN` says: the only one with the fault
/// injection hooks (`CRONLOCK_TEST_PANIC`), which a release build leaves out.
pub fn cronlock_debug(redis: &Redis) -> Command {
    cronlock_of(BIN, &redis.url())
}

/// The binary at `bin` (a copy of the one under test) with a clean environment pointing at `url`.
pub fn cronlock_of(bin: &str, url: &str) -> Command {
    let mut cmd = Command::new(bin);
    clean_env(&mut cmd, url);
    cmd
}

/// Leave out cronlock's variables this process inherited, point at `url`, no stdin.
fn clean_env(cmd: &mut Command, url: &str) {
    alone::enter();
    limit_run();
    default_signals();
    for (k, _) in std::env::vars() {
        if k.starts_with("CRONLOCK_") || k == "REDIS_URL" {
            cmd.env_remove(k);
        }
    }
    cmd.env("CRONLOCK_REDIS_URL", url);
    cmd.stdin(Stdio::null());
}

/// Run to completion and return the output.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run cronlock")
}

pub fn code(out: &Output) -> i32 {
    out.status.code().expect("cronlock exited by a signal")
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// cronlock's own lines (the child may write to the same stderr).
pub fn own_lines(err: &str) -> Vec<&str> {
    err.lines().filter(|l| l.starts_with("cronlock:")).collect()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The parent of `pid` (for a command's process: its guard, or a replica's run).
pub fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = stat.rsplit_once(')').unwrap().1;
    after_comm
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

/// Is process `pid` still alive (and not a zombie)?
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or("X");
            state != "Z" && state != "X"
        }
        Err(_) => false,
    }
}

/// The CPU a process used itself (user and system clock ticks, /proc/PID/stat).
pub fn own_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = stat.rsplit_once(") ").unwrap().1;
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Send `sig` to `pid`.
pub fn signal(pid: i32, sig: i32) {
    // SAFETY: sending a signal to a process the test started.
    unsafe { libc::kill(pid, sig) };
}

/// Read a pid a test child wrote to `path`, waiting for it to appear.
pub fn read_pid(path: &Path) -> i32 {
    let mut pid = 0;
    assert!(
        wait_for(Duration::from_secs(10), || {
            pid = std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            pid > 0
        }),
        "no pid in {}",
        path.display()
    );
    pid
}

/// The job's own cgroup directory, from the `cgroup` file a job script wrote into `dir` with
/// `grep ^0:: /proc/$$/cgroup > cgroup`; None when the job had none of its own (no file, or a
/// cgroup that is not a `cronlock-` one). Read it once the script has gone past writing it.
pub fn job_cgroup(dir: &Path) -> Option<PathBuf> {
    let line = std::fs::read_to_string(dir.join("cgroup")).ok()?;
    let rel = line.trim().trim_start_matches("0::/");
    let name = rel.rsplit('/').next()?;
    if !name.starts_with("cronlock-") {
        return None;
    }
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .iter()
        .map(|m| Path::new(m).join(rel))
        .find(|p| p.parent().is_some_and(Path::is_dir))
}

/// cronlock's stderr, asserted to be exactly one `cronlock: ` line.
pub fn one_line(out: &Output) -> String {
    let err = stderr(out);
    assert_eq!(err.lines().count(), 1, "expected one line: {err:?}");
    assert!(err.starts_with("cronlock: "), "{err:?}");
    err
}

/// Spawn `cmd` so that it dies with the thread that spawned it (PR_SET_PDEATHSIG).
pub fn spawn_tied(cmd: &mut Command) -> Child {
    tie(cmd);
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is required for the tests; run ./scripts/test.sh")
}

/// A topology shared by the tests of one binary that do not disturb it: made once, by a thread
/// that lives as long as the test process (its servers die with that thread, so with the process).
pub fn shared<T: Send + Sync + 'static>(
    cell: &'static std::sync::OnceLock<&'static T>,
    make: fn() -> T,
) -> &'static T {
    alone::enter();
    cell.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let made: &'static T = Box::leak(Box::new(make()));
            tx.send(made).unwrap();
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("the shared topology did not start")
    })
}

/// Make `cmd`'s process die with the thread that spawns it (PR_SET_PDEATHSIG).
pub fn tie(cmd: &mut Command) {
    // SAFETY: only prctl between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            );
            Ok(())
        });
    }
}

/// Wait for every child; their exit codes.
pub fn exit_codes(children: Vec<Child>) -> Vec<i32> {
    children
        .into_iter()
        .map(|c| code(&c.wait_with_output().unwrap()))
        .collect()
}

/// `SCHEME://127.0.0.1:P1,127.0.0.1:P2,...`
pub fn hosts_url(scheme: &str, ports: impl Iterator<Item = u16>) -> String {
    let hosts: Vec<String> = ports.map(|p| format!("127.0.0.1:{p}")).collect();
    format!("{scheme}://{}", hosts.join(","))
}

/// cronlock pointing at `url`, started under GNU time so that its peak RSS is its own: a child
/// this process spawns starts its peak at this process's (at exec the kernel keeps the larger of
/// the peak of the memory it leaves, which after `posix_spawn` is this whole test process's, and
/// after a fork its resident size), and a busy pass of this suite reaches 110 MiB. GNU time's own
/// child is forked from a process of a few hundred KiB.
pub struct Measured {
    pub cmd: Command,
    report: Scratch,
}

/// [`Measured`] cronlock pointing at `url`.
pub fn cronlock_measured(url: &str) -> Measured {
    const TIME: &str = "/usr/bin/time";
    if !Path::new(TIME).exists() {
        lacks(
            "GNU time (/usr/bin/time, Debian package time)",
            "measuring cronlock's own peak RSS",
        );
    }
    let report = scratch("measured");
    let mut cmd = Command::new(TIME);
    cmd.arg("-f").arg("%M").arg("-o").arg(report.join("rss"));
    cmd.arg("--").arg(bin());
    clean_env(&mut cmd, url);
    Measured { cmd, report }
}

impl Measured {
    /// Run to the end: the output, the exit code (128+N after signal N) and the peak RSS in KiB.
    pub fn run(mut self) -> (Output, i32, i64) {
        let out = run(&mut self.cmd);
        let code = out.status.code().unwrap_or(-1);
        let report = std::fs::read_to_string(self.report.join("rss")).unwrap_or_default();
        // After a signal GNU time writes "Command terminated by signal N" first.
        let rss = report
            .lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("GNU time reported no peak RSS: {report:?}"));
        (out, code, rss)
    }
}

/// How far into the current second the wall clock is (ms).
pub fn ms_into_second() -> u64 {
    (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 1000) as u64
}

/// Fail the test with one line naming what this machine lacks and who needs it: a missing
/// kernel feature is a failure (never a skip), but one that says what to fix.
pub fn lacks(what: &str, needed_by: &str) -> ! {
    panic!("this machine lacks {what}, which {needed_by} needs")
}

/// This process's cgroup v2 directory (under `/sys/fs/cgroup/unified` or `/sys/fs/cgroup`),
/// checked writable by making a directory in it and removing it; else what the machine lacks.
pub fn own_cgroup2() -> Result<PathBuf, String> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let rel = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("a cgroup v2 hierarchy (no '0::' line in /proc/self/cgroup)")?;
    let dir = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .iter()
        .map(|m| Path::new(m).join(rel.trim_start_matches('/')))
        // cgroup.max.depth: a cgroup v2 directory (v1 has no such file).
        .find(|d| d.join("cgroup.max.depth").exists())
        .ok_or(
            "a mounted cgroup v2 file system (none at /sys/fs/cgroup or /sys/fs/cgroup/unified: a \
             chroot or an unprivileged container has none)",
        )?;
    let probe = dir.join(format!("cronlock-test-probe-{}", std::process::id()));
    std::fs::create_dir(&probe)
        .and_then(|()| std::fs::remove_dir(&probe))
        .map_err(|e| format!("a writable cgroup v2 hierarchy ({}: {e})", dir.display()))?;
    Ok(dir)
}

/// Whether `/` is a mount point in this mount namespace (in a chroot it is not, and `unshare
/// --mount-proc` cannot make its mounts private).
pub fn root_is_a_mount_point() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some("/"))
}

/// Every file under `dir`, its subdirectories included, in no particular order (the suite's
/// checks of the source tree read them).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                found.push(path);
            }
        }
    }
    found
}
