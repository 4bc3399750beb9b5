//! Redis Cluster: `redis+cluster://` and `rediss+cluster://`.
//!
//! Routing is redis-rs' cluster client: it reads the slot map from any reachable seed node, sends
//! each script to the node that serves its first key's slot, and follows `MOVED`/`ASK`. All of a
//! KEY's Redis keys share one hash tag (see `lock::Keys`), so every script stays on one node. Its
//! own retries are kept few and short: the caller's deadline rules, and a call that fails drops
//! the connection, so the next one starts from a fresh slot map (that is how a renewal finds the
//! replica promoted after its primary died).

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig, ClusterConnection};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ConnectionAddr, IntoConnectionInfo, RedisResult, TlsMode, Value};

use crate::connect::{first_line, HostsUrl, Node};
use crate::tls::TlsOptions;

/// A cluster, known by its seed nodes.
pub struct Cluster {
    client: ClusterClient,
    /// The seed nodes as single servers, to explain a seed that is no cluster node.
    seeds: Vec<Node>,
}

/// SCAN one node to the end, given a way to send it a command.
pub type ScanNode =
    fn(&mut dyn FnMut(&Cmd) -> RedisResult<Value>, &str) -> RedisResult<Vec<String>>;

impl Cluster {
    /// Parse `redis+cluster://[user][:password@]host:port[,host:port...]`.
    pub fn parse(url: &str, source: &str, shown: &str, tls: &TlsOptions) -> Result<Cluster> {
        let invalid = |problem: &str| anyhow!("invalid {source} '{shown}': {problem}");
        let u = HostsUrl::parse(url, Some(6379)).map_err(|p| invalid(&p))?;
        if !u.path.is_empty() {
            return Err(invalid(
                "a Redis Cluster has only database 0: expected \
                 redis+cluster://[user][:password@]host:port[,host:port...]",
            ));
        }
        if let Some((k, _)) = u.query.first() {
            return Err(invalid(&format!("unknown parameter '{k}'")));
        }
        let nodes: Vec<ConnectionAddr> = u
            .hosts
            .into_iter()
            .map(|(host, port)| match u.tls {
                true => ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: false,
                    tls_params: None,
                },
                false => ConnectionAddr::Tcp(host, port),
            })
            .collect();
        let certs = if u.tls {
            Some(tls.certificates()?)
        } else {
            None
        };
        let mut seeds = Vec::new();
        for addr in &nodes {
            let mut settings = redis::RedisConnectionInfo::default();
            if let Some(user) = &u.user {
                settings = settings.set_username(user);
            }
            if let Some(pw) = &u.password {
                settings = settings.set_password(pw);
            }
            let info = addr
                .clone()
                .into_connection_info()
                .map_err(|e| invalid(&first_line(&e)))?;
            let node = Node::open(info.set_redis_settings(settings), certs.clone())
                .map_err(|e| invalid(&first_line(&e)))?;
            seeds.push(node);
        }
        let mut b = ClusterClientBuilder::new(nodes)
            // A few quick retries for redirections; longer outages are the caller's to retry.
            .retries(2)
            .min_retry_wait(10)
            .max_retry_wait(100);
        if let Some(user) = u.user {
            b = b.username(user);
        }
        if let Some(pw) = u.password {
            b = b.password(pw);
        }
        if let Some(certs) = certs {
            b = b.tls(TlsMode::Secure).certs(certs);
        } else if tls.any() {
            bail!(
                "--tls-ca-cert, --tls-cert and --tls-key are for rediss+cluster:// URLs, and \
                 {source} is '{shown}'"
            );
        }
        let client = b.build().map_err(|e| invalid(&first_line(&e)))?;
        Ok(Cluster { client, seeds })
    }

    /// Connect to a seed node and read the slot map, within `within`.
    pub fn connect(&self, within: Duration) -> Result<ClusterConnection> {
        let within = within.max(Duration::from_millis(1));
        let config = ClusterConfig::new()
            .set_connection_timeout(within)
            .set_response_timeout(within);
        self.client
            .get_connection_with_config(config)
            .map_err(|e| anyhow!("{}", first_line(&e)))
    }

    /// Why the cluster client found no node for a KEY (redis-rs reads a non-cluster server's
    /// refusal of `CLUSTER SLOTS` as an empty slot map): ask the seeds themselves.
    pub fn explain(&self, within: Duration) -> String {
        for seed in &self.seeds {
            let Ok(mut con) = seed.connect(within) else {
                continue;
            };
            let _ = crate::connect::set_io_timeout(&con, within);
            let info: redis::RedisResult<String> =
                redis::cmd("INFO").arg("cluster").query(&mut con);
            if info.is_ok_and(|i| i.contains("cluster_enabled:0")) {
                return "a seed node is not a Redis Cluster node (cluster support is off): \
                        use redis:// for a single server"
                    .into();
            }
        }
        "no node of the cluster serves this KEY's slot (is the cluster down?)".into()
    }

    /// SCAN every primary (the slot map's, read now) with `scan`, and merge what they hold.
    pub fn scan_primaries(
        con: &mut ClusterConnection,
        pattern: &str,
        scan: ScanNode,
    ) -> RedisResult<Vec<String>> {
        let mut slots = redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let map = con.route_command(
            &slots,
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
        )?;
        let mut found = Vec::new();
        for (host, port) in primaries(map) {
            let at = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
            found.extend(scan(
                &mut |cmd| con.route_command(cmd, at.clone()),
                pattern,
            )?);
        }
        Ok(found)
    }
}

/// The primaries in a `CLUSTER SLOTS` reply: each range's first node, once each.
fn primaries(map: Value) -> Vec<(String, u16)> {
    let mut out: Vec<(String, u16)> = Vec::new();
    let Value::Array(ranges) = map else {
        return out;
    };
    for range in ranges {
        let Value::Array(parts) = range else { continue };
        let Some(Value::Array(node)) = parts.get(2) else {
            continue;
        };
        let host = match node.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => continue,
        };
        let Some(Value::Int(port)) = node.get(1) else {
            continue;
        };
        let entry = (host, *port as u16);
        if !entry.0.is_empty() && !out.contains(&entry) {
            out.push(entry);
        }
    }
    out
}
