//! The redis-server processes tests start: each on a free port and a temp dir, stoppable,
//! killable and restartable.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, temp_dir};

/// A redis-server owned by a test, on its own port and directory, with append-only persistence.
pub struct RedisServer {
    pub port: u16,
    pub dir: PathBuf,
    pub(crate) child: Option<Child>,
    pub(crate) extra: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
}

impl RedisServer {
    /// Starts a redis-server with `appendfsync always`, so a kill -9 loses no acknowledged write.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> RedisServer {
        Self::start_in_env(extra, &[])
    }

    /// Starts a redis-server with these extra arguments and environment variables.
    pub fn start_in_env(extra: &[&str], env: &[(&str, &str)]) -> RedisServer {
        let mut s = RedisServer {
            port: free_port(),
            dir: temp_dir("redis"),
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        // another test may start a server on the same free port first (it is free until a server
        // binds it): ours then exits, and another port is tried
        for _ in 0..10 {
            if s.launch() {
                return s;
            }
            s.port = free_port();
        }
        panic!(
            "redis-server did not start on any of 10 free ports ({:?})",
            s.dir
        );
    }

    /// Starts redis-server on `self.port`: whether it is up (false: it exited, the port taken).
    pub(crate) fn launch(&mut self) -> bool {
        let mut cmd = Command::new("redis-server");
        cmd.args([
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes",
        ])
        .args(["--appendfsync", "always", "--daemonize", "no"])
        .arg("--dir")
        .arg(&self.dir)
        .arg("--logfile")
        .arg(self.dir.join("redis.log"))
        .args(&self.extra)
        .envs(self.env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start redis-server ({e}). These tests need it on PATH: \
                 `sudo apt-get install -y redis-server` (Debian/Ubuntu) or `brew install redis` (macOS)"
            )
        });
        let pid = format!("process_id:{}", child.id());
        self.child = Some(child);
        let client = redis::Client::open(self.url()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(c) = self.child.as_mut()
                && matches!(c.try_wait(), Ok(Some(_)))
            {
                self.child = None;
                return false;
            }
            // (another test's server on the same port answers too, until ours gives up)
            if let Ok(mut c) = client.get_connection()
                && let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(&mut c)
                && info.lines().any(|l| l.trim() == pid)
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not come up",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A blocking connection for assertions.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// kill -9.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Freezes the process (SIGSTOP: it answers nothing, its connections stay open) or lets it go
    /// on (SIGCONT).
    pub fn freeze(&self, frozen: bool) {
        let c = self.child.as_ref().expect("running");
        let sig = if frozen { libc::SIGSTOP } else { libc::SIGCONT };
        unsafe { libc::kill(c.id() as i32, sig) };
    }

    /// A clean stop (SIGTERM: redis flushes its append-only file).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and directory (it loads its append-only file).
    pub fn restart(&mut self) {
        self.stop();
        assert!(
            self.launch(),
            "redis-server did not restart on port {}",
            self.port
        );
    }

    /// Starts it again after a stop or kill.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "still running");
        assert!(
            self.launch(),
            "redis-server did not start again on port {}",
            self.port
        );
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
