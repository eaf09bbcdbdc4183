//! The real `eggtimer` binary as a child process: started on a free port with its own data
//! directory, waited for until it answers, stopped, killed or restarted by a test.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{RedisServer, eggtimer_bin, free_port, plugins_dir, shared_plugin_cache, temp_dir};

/// A runner process.
pub struct RunnerProcess {
    child: Option<Child>,
    pub port: u16,
    pub url: String,
    pub log: Arc<Mutex<Vec<String>>>,
    data_dir: PathBuf,
}

impl RunnerProcess {
    /// Starts `eggtimer serve` with these extra args (a free --listen port is added) and waits for
    /// its "listening" line.
    pub fn start(redis_url: &str, args: &[&str]) -> RunnerProcess {
        Self::start_with_env(redis_url, args, &[])
    }

    /// Like [`RunnerProcess::start`], with extra environment variables.
    pub fn start_with_env(redis_url: &str, args: &[&str], env: &[(&str, &str)]) -> RunnerProcess {
        Self::launch(
            &eggtimer_bin(),
            Some(redis_url),
            temp_dir("runner-data"),
            args,
            env,
        )
    }

    /// Starts `eggtimer serve` of another build (`bin`: the last release's, say) on `redis_url`.
    pub fn start_build(bin: &Path, redis_url: &str, args: &[&str]) -> RunnerProcess {
        Self::launch(bin, Some(redis_url), temp_dir("runner-data"), args, &[])
    }

    /// A runner on `redis` that loads every plugin built from plugins/, with extra args.
    pub fn with_plugins(redis: &RedisServer, extra: &[&str]) -> RunnerProcess {
        let dir = plugins_dir();
        let mut args = vec!["--plugins-dir", dir.to_str().expect("a UTF-8 path")];
        args.extend_from_slice(extra);
        Self::start(&redis.url(), &args)
    }

    /// A runner with its own private redis-server under `data_dir` (no --redis).
    pub fn start_private(data_dir: &Path, args: &[&str]) -> RunnerProcess {
        Self::launch(&eggtimer_bin(), None, data_dir.to_owned(), args, &[])
    }

    /// Starts a runner on a free port. A port found free can be taken by another process before
    /// the runner binds it (any outgoing connection may be given it as its local port): a runner
    /// that says so at start is started again on another port, at most three times.
    fn launch(
        bin: &Path,
        redis_url: Option<&str>,
        data_dir: PathBuf,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> RunnerProcess {
        let mut tries = 0;
        loop {
            tries += 1;
            match Self::launch_on(free_port(), bin, redis_url, data_dir.clone(), args, env) {
                Ok(r) => return r,
                Err(log) if tries < 3 && log.contains("is in use (another eggtimer") => continue,
                Err(log) => panic!("eggtimer exited at start:\n{log}"),
            }
        }
    }

    /// Starts a runner listening on `port`; its log when it exited at start.
    fn launch_on(
        port: u16,
        bin: &Path,
        redis_url: Option<&str>,
        data_dir: PathBuf,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<RunnerProcess, String> {
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(redis_url.map(|u| ["--redis", u]).into_iter().flatten())
            // never the source tree: a fresh data dir, and one compiled-plugin cache per test
            // process (so each runner does not compile every plugin again)
            .arg("--data-dir")
            .arg(&data_dir)
            .args(if args.contains(&"--plugin-cache") {
                vec![]
            } else {
                vec!["--plugin-cache".into(), shared_plugin_cache()]
            })
            .args(args)
            .env_remove("EGGTIMER_TOKEN")
            .env("EGGTIMER_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("starting eggtimer");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        // how many of its two streams were read to their end
        let ended = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let log = Arc::clone(&log);
            let tx = tx.clone();
            let ended = Arc::clone(&ended);
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if line.contains("listening on") {
                        let _ = tx.send(());
                    }
                    if std::env::var("EGGTIMER_TEST_ECHO").is_ok() {
                        eprintln!("[runner {port}] {line}");
                    }
                    log.lock().unwrap().push(line);
                }
                ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
        let mut me = RunnerProcess {
            child: Some(child),
            port,
            url: format!("http://127.0.0.1:{port}"),
            log,
            data_dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while rx.recv_timeout(Duration::from_millis(50)).is_err() {
            if let Some(status) = me.child.as_mut().unwrap().try_wait().unwrap() {
                // all it said, once its streams are read to their end
                let read = Instant::now() + Duration::from_secs(5);
                while ended.load(std::sync::atomic::Ordering::SeqCst) < 2 && Instant::now() < read {
                    std::thread::sleep(Duration::from_millis(5));
                }
                let log = format!("({status}) {}", me.log_text());
                // its data dir stays: a runner started again uses it
                me.data_dir = PathBuf::new();
                return Err(log);
            }
            assert!(
                Instant::now() < deadline,
                "eggtimer did not start listening:\n{}",
                me.log_text()
            );
        }
        Ok(me)
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Panics with the runner's log if its process has exited (to tell a dead runner from a slow
    /// one in a test's wait).
    pub fn assert_alive(&mut self) {
        if let Some(c) = self.child.as_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            panic!(
                "the runner on port {} exited ({status}):\n{}",
                self.port,
                self.log_text()
            );
        }
    }

    /// Whether its process has exited (a failpoint aborted it, say).
    pub fn child_exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(Some(_))),
            None => true,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// kill -9.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, and waits for the exit; returns its exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        c.wait().ok().and_then(|s| s.code())
    }
}

impl Drop for RunnerProcess {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}
