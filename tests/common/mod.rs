//! Test harness: a real `redis-server` per test on a free loopback port, the real cronlock binary,
//! and bounded polling instead of sleeps.
#![allow(dead_code)]

pub mod prom;
pub mod replicas;
pub mod story;

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_cronlock");

/// Poll `cond` every 5 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
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

pub fn scratch(name: &str) -> Scratch {
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

/// A real redis-server, killed on drop. It always listens on a Unix socket of its own, which the
/// test uses to reach it: a socket path cannot be taken by another test's server, so readiness
/// checks and restarts never race for a port. Servers for tests where TCP itself is under test
/// also listen on a free loopback port ([`Redis::start_tcp`]); start-up moves to a new port when
/// the bind fails.
pub struct Redis {
    /// 0 when the server has no TCP port.
    pub port: u16,
    pub password: Option<String>,
    pub sock: PathBuf,
    tcp: bool,
    /// The TCP port speaks TLS (the Unix socket stays plain, for the harness).
    tls: bool,
    /// A cluster node: its bus port (port + 10000) must be free too.
    cluster: bool,
    extra: Vec<String>,
    dir: Scratch,
    child: Option<Child>,
    cached: std::sync::Mutex<Option<redis::Connection>>,
}

impl Redis {
    /// A server on a Unix socket only.
    pub fn start() -> Redis {
        Redis::launch_new(None, &[], false)
    }

    /// A server on a Unix socket and a loopback TCP port.
    pub fn start_tcp() -> Redis {
        Redis::launch_new(None, &[], true)
    }

    /// A TCP server that requires `pw`.
    pub fn with_password(pw: &str) -> Redis {
        Redis::launch_new(Some(pw), &[], true)
    }

    pub fn start_with(password: Option<&str>, extra: &[&str]) -> Redis {
        Redis::launch_new(password, extra, false)
    }

    /// A server whose TCP port is TLS-only; `extra` gives its certificate options.
    pub fn start_tls(password: Option<&str>, extra: &[&str]) -> Redis {
        let mut r = Redis::new_unlaunched(password, extra, true);
        r.tls = true;
        r.launch(None);
        r
    }

    fn launch_new(password: Option<&str>, extra: &[&str], tcp: bool) -> Redis {
        let mut r = Redis::new_unlaunched(password, extra, tcp);
        r.launch(None);
        r
    }

    fn new_unlaunched(password: Option<&str>, extra: &[&str], tcp: bool) -> Redis {
        let dir = scratch("redis");
        let r = Redis {
            port: 0,
            password: password.map(str::to_string),
            sock: dir.join("redis.sock"),
            tcp,
            tls: false,
            cluster: false,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            dir,
            child: None,
            cached: Default::default(),
        };
        r
    }

    /// (Re)start the server, on the same TCP port when given.
    fn launch(&mut self, port: Option<u16>) {
        for _ in 0..20 {
            let port = if self.tcp {
                port.unwrap_or_else(if self.cluster {
                    free_cluster_port
                } else {
                    free_port
                })
            } else {
                0
            };
            let _ = std::fs::remove_file(&self.sock);
            let mut cmd = Command::new(server_bin());
            let (plain, tls) = if self.tls { (0, port) } else { (port, 0) };
            cmd.args(["--port", &plain.to_string(), "--bind", "127.0.0.1"]);
            if self.tls {
                // Only then: a server built without TLS does not know the option.
                cmd.args(["--tls-port", &tls.to_string()]);
            }
            cmd.arg("--unixsocket")
                .arg(&self.sock)
                .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
                .args(["--loglevel", "warning"])
                .arg("--dir")
                .arg(&*self.dir)
                .args(&self.extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some(pw) = &self.password {
                cmd.args(["--requirepass", pw]);
            }
            // Even if the test process aborts, the server must not outlive it.
            tie(&mut cmd);
            let mut child = cmd.spawn().expect(
                "redis-server is required for the tests and was not found on PATH; \
                 run ./scripts/test.sh, which installs it",
            );
            self.port = port;
            // Up when our own socket answers (the TCP port, if any, is bound by then), or gone
            // when the bind failed.
            let up = wait_for(Duration::from_secs(10), || {
                if let Ok(Some(_)) = child.try_wait() {
                    return true;
                }
                self.try_con().is_ok()
            });
            if up && child.try_wait().unwrap().is_none() {
                self.child = Some(child);
                return;
            }
            let _ = child.kill();
            let _ = child.wait();
            assert!(port == 0 || self.tcp, "redis-server did not start");
        }
        panic!("redis-server did not start");
    }

    /// The URL cronlock gets: TCP for a TCP server, else the Unix socket.
    pub fn url(&self) -> String {
        if self.tcp {
            self.tcp_url()
        } else {
            self.unix_url()
        }
    }

    pub fn tcp_url(&self) -> String {
        assert!(
            self.tcp,
            "this server has no TCP port: use Redis::start_tcp"
        );
        match &self.password {
            Some(pw) => format!("redis://:{pw}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// The `rediss://` URL of a [`Redis::start_tls`] server, naming it by `host`.
    pub fn tls_url(&self, host: &str) -> String {
        assert!(
            self.tls,
            "this server has no TLS port: use Redis::start_tls"
        );
        format!("rediss://{host}:{}", self.port)
    }

    pub fn unix_url(&self) -> String {
        match &self.password {
            Some(pw) => format!("redis+unix://{}?pass={pw}", self.sock.display()),
            None => format!("redis+unix://{}", self.sock.display()),
        }
    }

    fn try_con(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.unix_url())?;
        let mut con = client.get_connection_with_timeout(Duration::from_secs(1))?;
        con.set_read_timeout(Some(Duration::from_secs(5)))?;
        redis::cmd("PING").query::<String>(&mut con)?;
        Ok(con)
    }

    /// A test-side connection, for looking at and tampering with keys.
    /// Retried: a connect can fail transiently (EINTR, a full accept backlog); only a server
    /// that stays unreachable for 5 s fails the test.
    pub fn con(&self) -> redis::Connection {
        let mut last = None;
        let ok = wait_for(Duration::from_secs(5), || match self.try_con() {
            Ok(c) => {
                last = Some(Ok(c));
                true
            }
            Err(e) => {
                last = Some(Err(e));
                false
            }
        });
        match last {
            Some(Ok(c)) if ok => c,
            Some(Err(e)) => panic!("connect to test redis: {e}"),
            _ => panic!("connect to test redis: no attempt"),
        }
    }

    /// Run `cmd` on the cached test connection, reconnecting once if it broke (a restart).
    pub fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..2 {
            let mut con = match cached.take() {
                Some(c) => c,
                None => self.con(),
            };
            match cmd.query::<T>(&mut con) {
                Ok(v) => {
                    *cached = Some(con);
                    return v;
                }
                Err(e) if e.is_io_error() || e.is_connection_dropped() => continue,
                Err(e) => panic!("test query failed: {e}"),
            }
        }
        panic!("test connection to redis keeps failing");
    }

    /// How many connections the server has accepted (`INFO stats`).
    pub fn connections_received(&self) -> u64 {
        let info: String = self.query(redis::cmd("INFO").arg("stats"));
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    pub fn get(&self, key: &str) -> Option<String> {
        self.query(redis::cmd("GET").arg(key))
    }

    pub fn exists(&self, key: &str) -> bool {
        self.query::<i64>(redis::cmd("EXISTS").arg(key)) == 1
    }

    pub fn pttl(&self, key: &str) -> i64 {
        self.query(redis::cmd("PTTL").arg(key))
    }

    pub fn set(&self, key: &str, value: &str) {
        self.query::<()>(redis::cmd("SET").arg(key).arg(value))
    }

    pub fn del(&self, key: &str) {
        self.query::<()>(redis::cmd("DEL").arg(key))
    }

    /// All keys, sorted.
    pub fn keys(&self) -> Vec<String> {
        let mut k: Vec<String> = self.query(redis::cmd("KEYS").arg("*"));
        k.sort();
        k
    }

    fn send(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: sending a signal to a process the test started.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// SIGSTOP: the server hangs (connections are accepted by the kernel, nothing answers).
    pub fn pause(&self) {
        self.send(libc::SIGSTOP);
    }

    pub fn resume(&self) {
        self.send(libc::SIGCONT);
    }

    /// SIGKILL the server: connections are refused until it is restarted.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again on the same socket (and port), without persistence: every key is gone.
    pub fn restart(&mut self) {
        self.kill();
        let port = self.port;
        self.launch(Some(port));
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}

/// The server the tests start: `redis-server`, or `CRONLOCK_TEST_REDIS_SERVER` (the test command
/// runs some suites again against Redis 6.2 and Valkey 8.1 this way).
pub fn server_bin() -> String {
    std::env::var("CRONLOCK_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

/// The client that creates clusters: `redis-cli`, or `CRONLOCK_TEST_REDIS_CLI`.
pub fn cli_bin() -> String {
    std::env::var("CRONLOCK_TEST_REDIS_CLI").unwrap_or_else(|_| "redis-cli".into())
}

/// The binary under test: this build's, or `CRONLOCK_TEST_BIN` (to show that a test fails on an
/// older build).
pub fn bin() -> String {
    std::env::var("CRONLOCK_TEST_BIN").unwrap_or_else(|_| BIN.to_string())
}

/// The cronlock binary with a clean environment pointing at `redis`.
pub fn cronlock(redis: &Redis) -> Command {
    cronlock_at(&redis.url())
}

/// The cronlock binary with a clean environment pointing at `url`.
pub fn cronlock_at(url: &str) -> Command {
    cronlock_of(&bin(), url)
}

/// This test build's binary, whatever `CRONLOCK_TEST_BIN` says: the only one with the fault
/// injection hooks (`CRONLOCK_DEBUG_PANIC`), which a release build leaves out.
pub fn cronlock_debug(redis: &Redis) -> Command {
    cronlock_of(BIN, &redis.url())
}

fn cronlock_of(bin: &str, url: &str) -> Command {
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars() {
        if k.starts_with("CRONLOCK_") || k == "REDIS_URL" {
            cmd.env_remove(k);
        }
    }
    cmd.env("CRONLOCK_REDIS_URL", url);
    cmd.stdin(Stdio::null());
    cmd
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

impl Redis {
    /// A server on a Unix socket and a loopback TCP port, with more server options.
    pub fn start_tcp_with(extra: &[&str]) -> Redis {
        Redis::launch_new(None, extra, true)
    }

    /// A replica of `primary` (over TCP), up once its link to the primary is.
    pub fn replica_of(primary: &Redis) -> Redis {
        let port = primary.port.to_string();
        let r = Redis::start_tcp_with(&["--replicaof", "127.0.0.1", &port]);
        r.wait_synced();
        r
    }

    /// Wait until this replica's link to its primary is up.
    pub fn wait_synced(&self) {
        assert!(
            wait_for(Duration::from_secs(20), || {
                let info: String = self.query(redis::cmd("INFO").arg("replication"));
                info.contains("master_link_status:up")
            }),
            "replica did not sync"
        );
    }

    /// The server's role: "master" or "slave".
    pub fn role(&self) -> String {
        let role: Vec<redis::Value> = self.query(&redis::cmd("ROLE"));
        match role.first() {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        }
    }
}

/// Spawn `cmd` so that it dies with the thread that spawned it (PR_SET_PDEATHSIG).
pub fn spawn_tied(cmd: &mut Command) -> Child {
    tie(cmd);
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is required for the tests; run ./scripts/test.sh")
}

/// A Redis Sentinel process (`redis-server sentinel.conf --sentinel`), killed on drop.
pub struct Sentinel {
    pub port: u16,
    /// The port speaks TLS only, with a certificate from this CA (PEM file).
    tls: Option<PathBuf>,
    dir: Scratch,
    child: Option<Child>,
}

/// The service name the test sentinels monitor.
pub const SERVICE: &str = "cronlock-test";

impl Sentinel {
    /// A sentinel watching `primary` (quorum 2, down after 1 s).
    pub fn start(primary_port: u16) -> Sentinel {
        Sentinel::start_with(primary_port, 2, None)
    }

    /// A sentinel with `quorum`; with `tls`, its configuration lines for a TLS-only port (the
    /// port line is written here) and TLS to the servers it watches.
    pub fn start_with(primary_port: u16, quorum: u32, tls: Option<(&str, &Path)>) -> Sentinel {
        for _ in 0..20 {
            let dir = scratch("sentinel");
            let port = free_port();
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "{}\nbind 127.0.0.1\nprotected-mode no\ndir {}\nloglevel warning\n\
                     sentinel monitor {SERVICE} 127.0.0.1 {primary_port} {quorum}\n\
                     sentinel down-after-milliseconds {SERVICE} 1000\n\
                     sentinel failover-timeout {SERVICE} 10000\n\
                     sentinel parallel-syncs {SERVICE} 1\n",
                    match tls {
                        Some((lines, _)) =>
                            format!("port 0\ntls-port {port}\ntls-replication yes\n{lines}"),
                        None => format!("port {port}"),
                    },
                    dir.display()
                ),
            )
            .unwrap();
            let mut child = spawn_tied(Command::new(server_bin()).arg(&conf).arg("--sentinel"));
            let mut s = Sentinel {
                port,
                tls: tls.map(|(_, ca)| ca.to_path_buf()),
                dir,
                child: None,
            };
            let up = wait_for(Duration::from_secs(10), || {
                matches!(child.try_wait(), Ok(Some(_)))
                    || s.try_query::<String>(&redis::cmd("PING")).is_ok()
            });
            if up && child.try_wait().unwrap().is_none() {
                s.child = Some(child);
                return s;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis sentinel did not start");
    }

    pub fn try_query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let client = match &self.tls {
            Some(ca) => redis::Client::build_with_tls(
                format!("rediss://127.0.0.1:{}", self.port),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(std::fs::read(ca).unwrap()),
                },
            )?,
            None => redis::Client::open(format!("redis://127.0.0.1:{}", self.port))?,
        };
        let mut con = client.get_connection_with_timeout(Duration::from_secs(1))?;
        con.set_read_timeout(Some(Duration::from_secs(5)))?;
        cmd.query(&mut con)
    }

    /// The primary's port as this sentinel sees it.
    pub fn primary_port(&self) -> Option<u16> {
        let addr: Option<(String, u16)> = self
            .try_query(
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(SERVICE),
            )
            .ok()
            .flatten();
        addr.map(|(_, p)| p)
    }

    fn count(&self, what: &str) -> usize {
        self.try_query::<Vec<redis::Value>>(redis::cmd("SENTINEL").arg(what).arg(SERVICE))
            .map_or(0, |v| v.len())
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = &self.dir;
    }
}

/// A primary, one replica (and maybe more) and three sentinels that know each other.
pub struct Replicated {
    pub primary: Redis,
    pub replica: Redis,
    /// Replicas beyond the first.
    pub more: Vec<Redis>,
    pub sentinels: Vec<Sentinel>,
}

impl Replicated {
    pub fn start() -> Replicated {
        Replicated::with_replicas(1)
    }

    pub fn with_replicas(n: usize) -> Replicated {
        let primary = Redis::start_tcp();
        let replica = Redis::replica_of(&primary);
        let more: Vec<Redis> = (1..n).map(|_| Redis::replica_of(&primary)).collect();
        let sentinels: Vec<Sentinel> = (0..3).map(|_| Sentinel::start(primary.port)).collect();
        // Ready for a failover once every sentinel knows the replicas and the two other
        // sentinels (they meet through hello messages every 2 s).
        assert!(
            wait_for(Duration::from_secs(30), || sentinels
                .iter()
                .all(|s| s.count("replicas") == n && s.count("sentinels") == 2)),
            "sentinels did not discover each other and the replicas"
        );
        Replicated {
            primary,
            replica,
            more,
            sentinels,
        }
    }

    /// Ask a sentinel for a planned failover (`SENTINEL FAILOVER`).
    pub fn failover(&self) {
        let _: () = self.sentinels[0]
            .try_query(redis::cmd("SENTINEL").arg("FAILOVER").arg(SERVICE))
            .expect("SENTINEL FAILOVER");
    }

    /// `redis+sentinel://` naming every sentinel, for `service`.
    pub fn url(&self, service: &str) -> String {
        let ports = self.sentinels.iter().map(|s| s.port);
        format!("{}/{service}", hosts_url("redis+sentinel", ports))
    }

    /// The server the sentinels agree is the primary now, if they agree on one.
    pub fn primary_port(&self) -> Option<u16> {
        let ports: Vec<Option<u16>> = self.sentinels.iter().map(|s| s.primary_port()).collect();
        ports[0].filter(|_| ports.iter().all(|p| *p == ports[0]))
    }
}

/// Contenders for one KEY while a holder runs: every 200 ms a cronlock with `args` whose job
/// fails to `mkdir DIR/running` (and leaves `DIR/overlap`) if another job is running, until
/// [`Contenders::stop`], which returns their exit codes.
pub struct Contenders {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<i32>>>,
}

/// The job a holder runs: it holds `DIR/running` until `DIR/go` exists.
pub fn holding_job(dir: &Path) -> String {
    format!(
        "cd {} && {{ mkdir running || touch overlap; }} && touch started && \
         while [ ! -e go ]; do sleep 0.05; done; rmdir running",
        dir.display()
    )
}

/// Start `cmd` (a cronlock with its options and KEY) on [`holding_job`] in `dir`; returns once the
/// job runs.
pub fn spawn_holding(cmd: &mut Command, dir: &Path) -> Child {
    let holder = cmd
        .args(["--", "sh", "-c"])
        .arg(holding_job(dir))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || dir.join("started").exists()),
        "the holder did not start"
    );
    holder
}

impl Contenders {
    pub fn start(make: impl Fn() -> Command + Send + 'static, dir: &Path) -> Contenders {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (st, dir) = (stop.clone(), dir.to_path_buf());
        let thread = std::thread::spawn(move || {
            let mut running: Vec<Child> = Vec::new();
            let mut codes = Vec::new();
            while !st.load(Ordering::SeqCst) {
                let mut c = make();
                c.args(["sh", "-c"])
                    .arg(format!(
                        "cd {} && {{ mkdir running && rmdir running || touch overlap; }}",
                        dir.display()
                    ))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                tie(&mut c);
                // Fails only once the test has ended (its directory is gone).
                let Ok(child) = c.spawn() else { break };
                running.push(child);
                std::thread::sleep(Duration::from_millis(200));
                running.retain_mut(|c| match c.try_wait().unwrap() {
                    Some(s) => {
                        codes.push(s.code().unwrap_or(-1));
                        false
                    }
                    None => true,
                });
            }
            for mut c in running {
                codes.push(c.wait().unwrap().code().unwrap_or(-1));
            }
            codes
        });
        Contenders {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop starting new ones; wait for those running; their exit codes.
    pub fn stop(mut self) -> Vec<i32> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }
}

/// A topology shared by the tests of one binary that do not disturb it: made once, by a thread
/// that lives as long as the test process (its servers die with that thread, so with the process).
pub fn shared<T: Send + Sync + 'static>(
    cell: &'static std::sync::OnceLock<&'static T>,
    make: fn() -> T,
) -> &'static T {
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

/// A Redis Cluster made with `redis-cli --cluster create`: three primaries, each with `replicas`
/// replicas, `cluster-node-timeout` 1000 ms.
pub struct Cluster {
    pub nodes: Vec<Redis>,
}

impl Cluster {
    pub fn start(replicas: usize) -> Cluster {
        let nodes: Vec<Redis> = (0..3 * (1 + replicas))
            .map(|_| {
                let mut r = Redis::new_unlaunched(
                    None,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-node-timeout",
                        "1000",
                        "--cluster-config-file",
                        "nodes.conf",
                    ],
                    true,
                );
                r.cluster = true;
                r.launch(None);
                r
            })
            .collect();
        let out = Command::new(cli_bin())
            .arg("--cluster")
            .arg("create")
            .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli is required for the cluster tests; run ./scripts/test.sh");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let c = Cluster { nodes };
        c.wait_ok();
        for n in &c.nodes {
            if n.role() == "slave" {
                n.wait_synced();
            }
        }
        c
    }

    /// Wait until every live node says the cluster is ok and agrees on the slot owners.
    pub fn wait_ok(&self) {
        assert!(
            wait_for(Duration::from_secs(30), || self.nodes.iter().all(|n| {
                n.child.is_none() || {
                    let info: String = n.query(redis::cmd("CLUSTER").arg("INFO"));
                    info.contains("cluster_state:ok")
                }
            }) && self.primaries().len()
                == 3),
            "the cluster did not become ok"
        );
    }

    /// `redis+cluster://` naming every node.
    pub fn url(&self) -> String {
        hosts_url("redis+cluster", self.nodes.iter().map(|n| n.port))
    }

    /// `CLUSTER SLOTS` as a live node sees it: (first slot, last slot, primary's port).
    fn slot_ranges(&self) -> Vec<(i64, i64, u16)> {
        let node = self.nodes.iter().find(|n| n.child.is_some()).unwrap();
        let slots: Vec<redis::Value> = node.query(redis::cmd("CLUSTER").arg("SLOTS"));
        slots
            .iter()
            .filter_map(|r| {
                let redis::Value::Array(parts) = r else {
                    return None;
                };
                match (parts.first(), parts.get(1), parts.get(2)) {
                    (
                        Some(redis::Value::Int(a)),
                        Some(redis::Value::Int(b)),
                        Some(redis::Value::Array(n)),
                    ) => match n.get(1) {
                        Some(redis::Value::Int(p)) => Some((*a, *b, *p as u16)),
                        _ => None,
                    },
                    _ => None,
                }
            })
            .collect()
    }

    /// The ports of the primaries that serve slots.
    pub fn primaries(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self.slot_ranges().into_iter().map(|(_, _, p)| p).collect();
        ports.sort();
        ports.dedup();
        ports
    }

    /// The node that serves `key`'s slot now.
    pub fn owner(&self, key: &str) -> &Redis {
        let node = self.nodes.iter().find(|n| n.child.is_some()).unwrap();
        let slot: i64 = node.query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key));
        let (_, _, port) = self
            .slot_ranges()
            .into_iter()
            .find(|(a, b, _)| (*a..=*b).contains(&slot))
            .unwrap_or_else(|| panic!("no owner for slot {slot}"));
        self.node(port)
    }

    pub fn node(&self, port: u16) -> &Redis {
        self.nodes.iter().find(|r| r.port == port).unwrap()
    }

    pub fn node_mut(&mut self, port: u16) -> &mut Redis {
        self.nodes.iter_mut().find(|r| r.port == port).unwrap()
    }
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
        use std::io::{Read, Write};
        use std::net::TcpStream;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let mode = std::sync::Arc::new(std::sync::Mutex::new(Mischief::Pass));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let replies = std::sync::Arc::new(AtomicU32::new(0));
        let (m, st, sent) = (mode.clone(), stop.clone(), replies.clone());
        std::thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                let Ok((mut client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let (m, st, sent) = (m.clone(), st.clone(), sent.clone());
                std::thread::spawn(move || {
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
                        let reply = match mode {
                            Mischief::Ok => b"+OK\r\n".to_vec(),
                            Mischief::True => b"#t\r\n".to_vec(),
                            Mischief::Huge => {
                                if client.write_all(b"$1000000000\r\n").is_err() {
                                    return;
                                }
                                let chunk = vec![b'x'; 64 * 1024];
                                // At most the declared gigabyte, for at most 60 s.
                                let end = Instant::now() + Duration::from_secs(60);
                                for _ in 0..(1_000_000_000 / chunk.len()) {
                                    if Instant::now() > end || client.write_all(&chunk).is_err() {
                                        return;
                                    }
                                }
                                return;
                            }
                            _ => {
                                if server.write_all(&buf[..n]).is_err() {
                                    return;
                                }
                                let Ok(got) = server.read(&mut buf) else {
                                    return;
                                };
                                let real = buf[..got].to_vec();
                                match mode {
                                    Mischief::Before(f) | Mischief::BeforeOnce(f) => {
                                        [f, &real[..]].concat()
                                    }
                                    Mischief::After(f) => [&real[..], f].concat(),
                                    Mischief::Late(f) => {
                                        if client.write_all(&real).is_err() {
                                            return;
                                        }
                                        std::thread::sleep(Duration::from_millis(20));
                                        f.to_vec()
                                    }
                                    _ => real,
                                }
                            }
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
                });
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
        use std::io::{Read, Write};
        use std::net::{Shutdown, TcpStream};
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
                let (counted, st2) = (records.clone(), st.clone());
                std::thread::spawn(move || {
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
                    let _ = to.shutdown(Shutdown::Both);
                });
                // Server to client, dripping when told.
                let (mut from, mut to) = (server, client);
                let (all, st2) = (all.clone(), st.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16 * 1024];
                    while !st2.load(Ordering::SeqCst) {
                        let n = match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let drip = all.load(Ordering::SeqCst)
                            || drip_after.is_some_and(|k| records.load(Ordering::SeqCst) >= k);
                        if !drip {
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
                });
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

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Run `cmd` to its end, as `wait4` reports it: its output, exit code and peak RSS in KiB.
// The child is reaped with wait4 (for its rusage), which clippy does not see.
#[allow(clippy::zombie_processes)]
pub fn run_measured(cmd: &mut Command) -> (Output, i32, i64) {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let mut stdout = Vec::new();
    let _ = out.read_to_end(&mut stdout);
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child, with valid out-pointers.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    let stderr = reader.join().unwrap();
    let status = std::process::ExitStatus::from_raw(status);
    let code = status.code().unwrap_or(-1);
    (
        Output {
            status,
            stdout,
            stderr,
        },
        code,
        usage.ru_maxrss,
    )
}

/// A `--ttl 30s` job through `cmd` (a cronlock with its URL), started and watching its lock key
/// (the JSON log's `tracking_on` event); `vanish` then makes the lock vanish. Asserts that the
/// command is stopped (122) within 500 ms of it, and returns how long it took.
pub fn stopped_at_once(mut cmd: Command, key: &str, vanish: impl FnOnce()) -> Duration {
    use std::io::BufRead;
    let mut c = cmd
        .args([
            "-v",
            "--log-format",
            "json",
            "--ttl",
            "30s",
            key,
            "sleep",
            "60",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let err = c.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains("\"tracking_on\"") {
                let _ = tx.send(());
            }
            all += &line;
            all.push('\n');
        }
        all
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("cronlock did not start watching its lock");
    vanish();
    let gone = Instant::now();
    let mut status = None;
    let stopped = wait_for(Duration::from_secs(15), || {
        status = c.try_wait().unwrap();
        status.is_some()
    });
    let took = gone.elapsed();
    if !stopped {
        let _ = c.kill();
    }
    let _ = c.wait();
    let err = reader.join().unwrap();
    assert!(stopped, "the command was not stopped: {err}");
    assert_eq!(status.unwrap().code(), Some(122), "{err}");
    assert!(
        took < Duration::from_millis(500),
        "stopped {took:?} after the lock vanished"
    );
    took
}

/// Four cronlocks (`cmd` makes each, with its URL) with `--limit 2 -E 75` for `key`, each holding
/// until `DIR/go`: exactly two run (both listed by `--status`), two skip.
pub fn limit_two_of_four(cmd: impl Fn() -> Command, key: &str) {
    let dir = scratch("limit-two");
    let children: Vec<Child> = (0..4)
        .map(|_| {
            let mut c = cmd();
            c.args(["--limit", "2", "-E", "75", key, "sh", "-c"])
                .arg(format!(
                    "cd {} && touch started.$$ && while [ ! -e go ]; do sleep 0.05; done",
                    dir.display()
                ));
            tie(&mut c);
            c.stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let started = || {
        std::fs::read_dir(&*dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("started."))
            })
            .count()
    };
    assert!(wait_for(Duration::from_secs(10), || started() == 2));
    let out = run(cmd().args(["--status", "--json", key]));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("status JSON");
    assert_eq!(v["holders"].as_array().map(Vec::len), Some(2), "{v}");
    std::fs::write(dir.join("go"), "").unwrap();
    let mut codes = exit_codes(children);
    codes.sort();
    assert_eq!(codes, vec![0, 0, 75, 75]);
    assert_eq!(started(), 2);
}

/// The minimal ACL line of docs/deployments.md (linked from the README), split into words, with
/// `PASSWORD` replaced.
pub fn documented_acl(password: &str) -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/deployments.md"))
        .unwrap();
    let line = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER cronlock "))
        .expect("docs/deployments.md has the ACL line");
    line.split(' ')
        .map(|w| w.replace("PASSWORD", password))
        .collect()
}
