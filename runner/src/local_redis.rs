//! The private redis-server that `eggtimer` starts when it is given no Redis URL: a child process
//! on a free loopback port, with append-only persistence under the data directory.
//!
//! The child is started from the main thread with a parent-death signal (SIGTERM), so it goes away
//! with the runner even after a kill -9, and flushes its append-only file as it does.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// A redis-server child; stopped (SIGTERM, then waited for) when dropped.
pub struct LocalRedis {
    child: Child,
    pub url: String,
}

/// How to install redis-server, for error messages.
pub const INSTALL_HINT: &str = "install it (Debian/Ubuntu: `sudo apt-get install -y redis-server`; \
     Fedora: `sudo dnf install redis`; macOS: `brew install redis`), or pass --redis URL";

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl LocalRedis {
    /// Starts redis-server with its data under `dir` (fsync policy `always` or `everysec`).
    pub fn start(dir: &Path, fsync: &str) -> Result<LocalRedis> {
        if !matches!(fsync, "always" | "everysec") {
            bail!("--redis-fsync must be always or everysec, not {fsync:?}");
        }
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the data directory {}", dir.display()))?;
        let dir = dir
            .canonicalize()
            .with_context(|| format!("resolving {}", dir.display()))?;
        let port = free_port()?;
        let mut cmd = Command::new("redis-server");
        cmd.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes",
        ])
        .args([
            "--appendfsync",
            fsync,
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
        ])
        .arg("--dir")
        .arg(&dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                    Ok(())
                });
            }
        }
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!("redis-server was not found on PATH: {INSTALL_HINT}")
            }
            Err(e) => return Err(e).context("starting redis-server"),
        };
        let mut me = LocalRedis {
            child,
            url: format!("redis://127.0.0.1:{port}"),
        };
        me.wait_ready(&dir)?;
        // For people and scripts: `redis-cli -u $(cat eggtimer-data/redis-url)`.
        std::fs::write(dir.join("redis-url"), format!("{}\n", me.url))
            .context("writing redis-url")?;
        Ok(me)
    }

    fn wait_ready(&mut self, dir: &Path) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = self.url.trim_start_matches("redis://").to_owned();
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "redis-server exited at start ({status}); see {}",
                    dir.join("redis.log").display()
                );
            }
            if let Ok(mut s) = TcpStream::connect(&addr) {
                use std::io::{Read, Write};
                s.set_read_timeout(Some(Duration::from_secs(1)))?;
                let mut buf = [0u8; 64];
                // Loading an AOF answers -LOADING: wait for +PONG.
                if s.write_all(b"PING\r\n").is_ok()
                    && matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
                {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "redis-server did not answer within 30 s; see {}",
                    dir.join("redis.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        // SAFETY: sending a signal to our own child by pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}
