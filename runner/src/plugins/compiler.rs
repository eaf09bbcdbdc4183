//! Compiling a plugin in a child process, so that one compile's time and memory are bounded:
//! cranelift can't be stopped from inside, and a component made to be expensive to compile would
//! otherwise hold a core and any amount of memory of the runner for as long as it likes.
//!
//! The runner starts its own binary (`/proc/self/exe`, the same build even if the file was
//! replaced meanwhile) as `eggtimer compile-plugin`, with its data segment limited
//! (`RLIMIT_DATA`: the heap and every private writable mapping), writes the wasm to its stdin
//! and reads the compiled code from its stdout; past the time limit it kills it. The compiled
//! code is then loaded like the compiled-code cache's (`Component::deserialize`, which checks the
//! engine settings it was made with and the pooling allocator's limits).

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use wasmtime::{Config, Engine};

/// Bounds of one compile, and the binary that compiles.
#[derive(Clone, Debug)]
pub struct CompileLimits {
    /// The `eggtimer` binary (`/proc/self/exe`).
    pub exe: PathBuf,
    /// Wall-clock time one compile may take.
    pub timeout: Duration,
    /// Memory one compile may use (bytes; the child's data segment).
    pub memory: u64,
}

impl CompileLimits {
    /// Limits for compiling with this very binary.
    pub fn this_binary(timeout: Duration, memory: u64) -> Result<CompileLimits> {
        let proc_exe = PathBuf::from("/proc/self/exe");
        let exe = if proc_exe.exists() {
            proc_exe
        } else {
            std::env::current_exe()
                .context("finding the eggtimer binary to compile plugins with")?
        };
        Ok(CompileLimits {
            exe,
            timeout,
            memory,
        })
    }
}

/// The engine settings compiled code depends on; the runner's engine adds the pooling allocator,
/// which changes where instances live, not the code (wasmtime's compatibility hash leaves it out).
pub(super) fn code_config() -> Config {
    let mut config = Config::new();
    config.epoch_interruption(true);
    config
}

/// `eggtimer compile-plugin`: reads a component from stdin and writes its compiled code to
/// stdout (what the runner starts; not for people).
pub fn compile_child() -> Result<()> {
    let mut wasm = Vec::new();
    std::io::stdin()
        .read_to_end(&mut wasm)
        .context("reading the plugin from stdin")?;
    let engine = Engine::new(&code_config()).map_err(|e| anyhow!("creating the engine: {e:#}"))?;
    let code = engine
        .precompile_component(&wasm)
        .map_err(|e| anyhow!("{e:#}"))?;
    std::io::stdout()
        .write_all(&code)
        .context("writing the compiled code")?;
    Ok(())
}

/// Most of the child's stderr kept for the error message.
const MAX_STDERR: u64 = 16 << 10;

/// Compiles `wasm` in a child process within `lim`: the compiled code, or what went wrong for
/// the uploader (a compile error as the compiler gave it, or the limit that was passed).
/// Blocking.
pub(super) fn compile(lim: &CompileLimits, wasm: &[u8]) -> Result<Vec<u8>, String> {
    let memory = lim.memory;
    let mut cmd = Command::new(&lim.exe);
    // a cleared environment: the compile of an uploaded component learns nothing of the runner's
    // (no EGGTIMER_TOKEN, no EGGTIMER_REDIS, no secrets key path)
    cmd.arg("compile-plugin")
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: between fork and exec only async-signal-safe calls (setrlimit, prctl).
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: memory,
                rlim_max: memory,
            };
            if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // the compile dies with the runner (the thread that waits for it lives as long)
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("could not start the compiler ({}): {e}", lim.exe.display()))?;
    let (mut stdin, mut stdout, stderr) = (
        child.stdin.take().expect("piped"),
        child.stdout.take().expect("piped"),
        child.stderr.take().expect("piped"),
    );
    let started = Instant::now();
    let (code, err, status) = std::thread::scope(|s| {
        // a child that dies early closes its stdin: the write fails and the status tells why
        s.spawn(move || {
            let _ = stdin.write_all(wasm);
        });
        let out = s.spawn(move || {
            let mut v = Vec::new();
            let _ = stdout.read_to_end(&mut v);
            v
        });
        let err = s.spawn(move || {
            let mut v = String::new();
            let _ = stderr.take(MAX_STDERR).read_to_string(&mut v);
            v
        });
        let status = wait(&mut child, started + lim.timeout);
        (
            out.join().unwrap_or_default(),
            err.join().unwrap_or_default(),
            status,
        )
    });
    match status {
        Waited::TimedOut => Err(format!(
            "compiling the plugin took longer than {} (the runner's --plugin-compile-timeout), so it was stopped",
            humantime::format_duration(lim.timeout)
        )),
        Waited::Failed(e) => Err(format!("waiting for the compiler failed: {e}")),
        Waited::Exited(st) if st.success() => Ok(code),
        Waited::Exited(st) => {
            let err = err.trim();
            let err = err.strip_prefix("eggtimer: ").unwrap_or(err);
            if err.contains("memory allocation of") || err.contains("out of memory") {
                // Rust's allocation failure, or wasmtime's
                Err(format!(
                    "compiling the plugin needed more than {} MiB of memory (the runner's --plugin-compile-memory)",
                    lim.memory >> 20
                ))
            } else if let Some(sig) = st.signal() {
                Err(format!("the compiler was killed by signal {sig}: {err}"))
            } else if err.is_empty() {
                Err(format!("the compiler failed ({st})"))
            } else {
                Err(err.to_owned())
            }
        }
    }
}

enum Waited {
    Exited(std::process::ExitStatus),
    TimedOut,
    Failed(std::io::Error),
}

/// Waits for the child until `deadline`, then kills it.
fn wait(child: &mut std::process::Child, deadline: Instant) -> Waited {
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Waited::Exited(st),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Waited::TimedOut;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Waited::Failed(e);
            }
        }
    }
}
