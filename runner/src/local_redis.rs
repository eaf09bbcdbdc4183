//! The private redis-server that `eggtimer` starts when it is given no Redis URL: a child process
//! on a free loopback port, with append-only persistence under the data directory.
//!
//! The data directory is 0700 and locked (`<dir>/lock`, flock) for as long as the runner lives,
//! so a second runner on the same directory is refused instead of starting a second server on the
//! same append-only file. The server requires a random password, kept in `<dir>/redis.conf` and in
//! `<dir>/redis-url` (both 0600; never on a command line, which other local users can read).
//!
//! The child is started from the main thread with a parent-death signal (SIGTERM), so it goes away
//! with the runner even after a kill -9, and flushes its append-only file as it does.

use std::fs::File;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// A redis-server child; stopped (SIGTERM, then waited for) when dropped.
pub struct LocalRedis {
    child: Child,
    /// The URL with the password: for connecting, never for logs (see [`LocalRedis::shown_url`]).
    pub url: String,
    port: u16,
    password: String,
    /// Held (flock) until the runner exits.
    _lock: File,
}

/// Writes a file readable by its owner only.
fn write_private(path: &Path, text: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// Takes the data directory's lock, or says who has it.
fn lock(dir: &Path) -> Result<File> {
    let path = dir.join("lock");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        bail!(
            "another eggtimer is already using the data directory {} (it holds {}): give this \
             runner its own --data-dir, or join the same Redis with --redis \"$(cat {})\"",
            dir.display(),
            path.display(),
            dir.join("redis-url").display()
        );
    }
    Ok(f)
}

/// The server's password: kept from an earlier start (the data outlives one run), else new.
fn password(dir: &Path) -> Result<String> {
    let conf = std::fs::read_to_string(dir.join("redis.conf")).unwrap_or_default();
    if let Some(pw) = conf
        .lines()
        .find_map(|l| l.strip_prefix("requirepass "))
        .map(str::trim)
        .filter(|p| p.len() >= 32 && p.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return Ok(pw.to_owned());
    }
    Ok(hex::encode(rand::random::<[u8; 32]>()))
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
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} private (0700)", dir.display()))?;
        let lock = lock(&dir)?;
        let password = password(&dir)?;
        let conf = dir.join("redis.conf");
        write_private(&conf, &format!("requirepass {password}\n"))?;
        let port = free_port()?;
        let mut cmd = Command::new("redis-server");
        cmd.arg(&conf)
            .args([
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
            url: format!("redis://default:{password}@127.0.0.1:{port}"),
            port,
            password,
            _lock: lock,
        };
        me.wait_ready(&dir)?;
        // For people and scripts: `redis-cli -u "$(cat eggtimer-data/redis-url)"`.
        write_private(&dir.join("redis-url"), &format!("{}\n", me.url))?;
        Ok(me)
    }

    /// The URL without the password, for logs.
    pub fn shown_url(&self) -> String {
        format!("redis://default:***@127.0.0.1:{}", self.port)
    }

    fn wait_ready(&mut self, dir: &Path) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let addr = format!("127.0.0.1:{}", self.port);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "redis-server exited at start ({status}); see {}",
                    dir.join("redis.log").display()
                );
            }
            if let Ok(mut s) = TcpStream::connect(&addr) {
                use std::io::Read;
                s.set_read_timeout(Some(Duration::from_secs(1)))?;
                let auth = format!(
                    "*2\r\n$4\r\nAUTH\r\n${}\r\n{}\r\nPING\r\n",
                    self.password.len(),
                    self.password
                );
                // Loading an AOF answers -LOADING: wait for +PONG after +OK.
                let mut got = Vec::new();
                if s.write_all(auth.as_bytes()).is_ok() {
                    let mut buf = [0u8; 128];
                    while let Ok(n @ 1..) = s.read(&mut buf) {
                        got.extend_from_slice(&buf[..n]);
                        // two replies: AUTH's and PING's
                        if got.windows(2).filter(|w| w == b"\r\n").count() >= 2 {
                            break;
                        }
                    }
                }
                if got.windows(5).any(|w| w == b"+PONG") {
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
