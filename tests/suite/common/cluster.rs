//! A Redis Cluster made with `redis-cli --cluster create`, shared by the tests of one binary.

use super::*;

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
