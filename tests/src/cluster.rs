//! A local Redis Cluster of redis-server processes, for the cluster tests.

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{RedisServer, free_port, temp_dir};

/// A free port whose cluster-bus port (+10000) is free too.
fn free_cluster_port() -> u16 {
    loop {
        let p = free_port();
        if p < 55_000 && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            return p;
        }
    }
}

/// A local Redis Cluster of redis-server processes: `masters` masters with `replicas` replicas
/// each, made with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    pub masters: usize,
}

impl RedisCluster {
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        Self::start_with(masters, replicas, &[])
    }

    /// As `start`, with more redis-server arguments for every node (e.g. `--appendfsync everysec`).
    pub fn start_with(masters: usize, replicas: usize, extra: &[&str]) -> RedisCluster {
        let mut nodes = Vec::new();
        for _ in 0..masters * (1 + replicas) {
            let port = free_cluster_port();
            let dir = temp_dir("cluster");
            let mut s = RedisServer {
                port,
                dir: dir.clone(),
                child: None,
                env: Vec::new(),
                extra: [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-replica-validity-factor",
                    "0",
                    "--cluster-config-file",
                    dir.join("nodes.conf").to_str().unwrap(),
                ]
                .iter()
                .chain(extra)
                .map(|s| s.to_string())
                .collect(),
            };
            assert!(s.launch(), "cluster node on port {port} did not start");
            nodes.push(s);
        }
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        for n in &nodes {
            cmd.arg(format!("127.0.0.1:{}", n.port));
        }
        cmd.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        let out = cmd.output().unwrap_or_else(|e| {
            panic!("cannot run redis-cli ({e}): install it with `sudo apt-get install -y redis-server` (it ships redis-cli)")
        });
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let c = RedisCluster { nodes, masters };
        c.wait_ok(Duration::from_secs(30));
        c.wait_replicas_in_sync(Duration::from_secs(30));
        c
    }

    /// Waits until every running node says the cluster is ok.
    pub fn wait_ok(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let ok = self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                let mut c = n.conn();
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut c)
                    .unwrap_or_default();
                info.contains("cluster_state:ok")
            });
            if ok {
                return;
            }
            if Instant::now() > deadline {
                let states: Vec<String> = self
                    .nodes
                    .iter()
                    .filter(|n| n.child.is_some())
                    .map(|n| {
                        let mut c = n.conn();
                        let nodes: String = redis::cmd("CLUSTER")
                            .arg("NODES")
                            .query(&mut c)
                            .unwrap_or_default();
                        format!("node {}:\n{nodes}", n.port)
                    })
                    .collect();
                panic!("the cluster did not become ok:\n{}", states.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every replica's link to its master is up.
    pub fn wait_replicas_in_sync(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let synced = self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query(&mut n.conn())
                    .unwrap_or_default();
                info.contains("role:master") || info.contains("master_link_status:up")
            });
            if synced {
                return;
            }
            assert!(Instant::now() < deadline, "the replicas did not sync");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The task ids of a stream's entries (XRANGE through a cluster-aware connection).
    pub fn stream_task_ids(&self, key: &str) -> Vec<String> {
        let client = redis::cluster::ClusterClient::new(
            self.nodes
                .iter()
                .filter(|n| n.port > 0)
                .map(|n| n.url())
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let mut c = client.get_connection().unwrap();
        let v: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
            .arg(key)
            .arg("-")
            .arg("+")
            .query(&mut c)
            .unwrap_or_default();
        v.into_iter()
            .map(|(_, fields)| {
                fields
                    .into_iter()
                    .find(|(k, _)| k == "task_id")
                    .map(|(_, v)| v)
                    .unwrap_or_default()
            })
            .collect()
    }

    /// `redis+cluster://` URL of the masters.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The index of the node that is master of the slot of `key`.
    pub fn master_of(&self, key: &str) -> usize {
        let mut c = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .unwrap()
            .conn();
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut c)
            .unwrap();
        let slots: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query(&mut c).unwrap();
        if let redis::Value::Array(ranges) = slots {
            for r in ranges {
                if let redis::Value::Array(parts) = r {
                    let lo: u16 = redis::from_redis_value_ref(&parts[0]).unwrap();
                    let hi: u16 = redis::from_redis_value_ref(&parts[1]).unwrap();
                    if (lo..=hi).contains(&slot)
                        && let redis::Value::Array(m) = &parts[2]
                    {
                        let port: u16 = redis::from_redis_value_ref(&m[1]).unwrap();
                        return self.nodes.iter().position(|n| n.port == port).unwrap();
                    }
                }
            }
        }
        panic!("no master for {key}");
    }
}
