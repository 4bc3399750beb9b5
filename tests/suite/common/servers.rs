//! Real `redis-server`s for the tests: one per test on a Unix socket of its own (and a free
//! loopback port where TCP is under test), TLS, replicas, restarts and pauses.

use super::*;

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
    pub(super) cluster: bool,
    extra: Vec<String>,
    dir: Scratch,
    pub(super) child: Option<Child>,
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

    pub(super) fn new_unlaunched(password: Option<&str>, extra: &[&str], tcp: bool) -> Redis {
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
    pub(super) fn launch(&mut self, port: Option<u16>) {
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

    /// Whether the server runs (it was not killed).
    pub fn running(&self) -> bool {
        self.child.is_some()
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

impl Redis {
    /// A server on a Unix socket and a loopback TCP port, with more server options.
    pub fn start_tcp_with(extra: &[&str]) -> Redis {
        Redis::launch_new(None, extra, true)
    }

    /// A replica of `primary` (over TCP), up once its link to the primary is.
    pub fn replica_of(primary: &Redis) -> Redis {
        Redis::replica_with(primary, &[])
    }

    /// [`Redis::replica_of`], with more server options.
    pub fn replica_with(primary: &Redis, extra: &[&str]) -> Redis {
        let port = primary.port.to_string();
        let mut args = vec!["--replicaof", "127.0.0.1", &port];
        args.extend_from_slice(extra);
        let r = Redis::start_tcp_with(&args);
        r.wait_synced();
        r
    }

    /// Wait until this replica's link to its primary is up.
    pub fn wait_synced(&self) {
        assert!(
            wait_for(Duration::from_secs(20), || self.synced()),
            "replica did not sync"
        );
    }

    /// Whether this replica's link to its primary is up.
    pub fn synced(&self) -> bool {
        let info: String = self.query(redis::cmd("INFO").arg("replication"));
        info.contains("master_link_status:up")
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
