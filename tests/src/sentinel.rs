//! Real Redis Sentinels (`redis-server --sentinel`) watching a master, for failover tests.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, temp_dir};

/// Sentinels watching one master under one name; killed when dropped.
pub struct Sentinels {
    pub ports: Vec<u16>,
    pub name: String,
    dir: PathBuf,
    children: Vec<Child>,
}

impl Sentinels {
    /// Starts `n` Sentinels watching the master on `master_port` as `name`, with a quorum of a
    /// majority and a master taken as down after 1 s without an answer.
    pub fn start(master_port: u16, name: &str, n: usize) -> Sentinels {
        let mut s = Sentinels {
            ports: Vec::new(),
            name: name.to_owned(),
            dir: temp_dir("sentinel"),
            children: Vec::new(),
        };
        for i in 0..n {
            let port = free_port();
            let conf = s.dir.join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                     sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n\
                     sentinel down-after-milliseconds {name} 1000\n\
                     sentinel failover-timeout {name} 5000\n\
                     sentinel parallel-syncs {name} 1\n",
                    dir = s.dir.display(),
                    quorum = n / 2 + 1,
                ),
            )
            .unwrap();
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .arg("--logfile")
                .arg(s.dir.join(format!("sentinel-{i}.log")))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot start redis-server --sentinel ({e}): `sudo apt-get install -y redis-server`"
                    )
                });
            s.children.push(child);
            s.ports.push(port);
        }
        for port in s.ports.clone() {
            let deadline = Instant::now() + Duration::from_secs(20);
            while s.master_port_on(port).is_none() {
                assert!(
                    Instant::now() < deadline,
                    "sentinel on port {port} did not come up ({:?})",
                    s.dir
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        s
    }

    /// The runner's URL for this master: `redis+sentinel://h:p,h:p/<name>`.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{}", nodes.join(","), self.name)
    }

    /// The master's port as the first Sentinel that answers sees it.
    pub fn master_port(&self) -> Option<u16> {
        self.ports.iter().find_map(|p| self.master_port_on(*p))
    }

    fn master_port_on(&self, port: u16) -> Option<u16> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
        let mut c = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        let addr: Vec<String> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.name)
            .query(&mut c)
            .ok()?;
        addr.get(1)?.parse().ok()
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
