//! Sentinel topologies: a primary, its replicas and three sentinels, and failovers on demand.

use super::*;

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
        Replicated::with_servers(n, &[])
    }

    /// [`Replicated::with_replicas`], every server with more options.
    pub fn with_servers(n: usize, extra: &[&str]) -> Replicated {
        let primary = Redis::start_tcp_with(extra);
        let replica = Redis::replica_with(&primary, extra);
        let more: Vec<Redis> = (1..n)
            .map(|_| Redis::replica_with(&primary, extra))
            .collect();
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

    /// The server of the topology listening on `port`.
    pub fn server(&self, port: u16) -> &Redis {
        std::iter::once(&self.primary)
            .chain(std::iter::once(&self.replica))
            .chain(&self.more)
            .find(|r| r.port == port)
            .expect("a server of the topology")
    }

    /// The server the sentinels agree is the primary, once they agree and it says so.
    pub fn current(&self) -> &Redis {
        let mut port = None;
        assert!(
            wait_for(Duration::from_secs(30), || {
                port = self.primary_port();
                port.is_some_and(|p| self.server(p).role() == "master")
            }),
            "the sentinels agree on no primary"
        );
        self.server(port.unwrap())
    }

    /// The server the sentinels agree is the primary now, if they agree on one.
    pub fn primary_port(&self) -> Option<u16> {
        let ports: Vec<Option<u16>> = self.sentinels.iter().map(|s| s.primary_port()).collect();
        ports[0].filter(|_| ports.iter().all(|p| *p == ports[0]))
    }
}
