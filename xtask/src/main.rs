//! `cargo xtask <command>`: the project's commands, in Rust instead of shell scripts.
//!
//! - `plugins` builds every plugin under plugins/ to wasm (its own target dir, so the host build is
//!   not invalidated) and copies them to target/plugins/<name>.wasm; the TypeScript and Python
//!   ones with their pinned toolchains (`guest`).
//! - `run [ARGS]` builds the plugins and the runner with the tests (`RUN_BUILD`, cargo's
//!   progress shown), then becomes
//!   `eggtimer serve --plugins-dir target/run-plugins ARGS` (exec: signals reach the runner) with
//!   the sample plugins and `noop` (not the test-only ones).
//! - `test [ARGS]` builds the plugins and the runner, installs schemathesis into target/py and
//!   openapi-python-client into target/py-gen, then
//!   runs every test file (`test`), ending with one summary.
//! - `bench [ARGS]` builds in release and runs the benchmark (BENCHMARKS.md); with
//!   `--peer bullmq`, alternating with the same workloads run by BullMQ (`peer`).
//! - `dist [--no-image] [--redis-image]` builds the static runner and the container images
//!   (`dist`), saying first what the machine lacks for them.
//! - `token [FILE]` makes an admin token file (`admin.token`) that only its owner may read.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use cargo_command::cargo_command;

mod cargo_command;
mod dist;
mod guest;
mod peer;
mod test;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let cmd = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    match cmd.as_str() {
        "plugins" => build_plugins().map(|_| ()),
        "run" => {
            require_redis_server()?;
            let dir = run_plugins(&build_plugins()?)?;
            cargo(RUN_BUILD, None, &[])?;
            // the runner takes this process's place: a supervisor's, `timeout`'s or a terminal's
            // SIGTERM and SIGINT reach it, and it stops its redis-server and exits
            let err = exec(
                Command::new(target_dir().join("debug/eggtimer"))
                    .arg("serve")
                    .arg("--plugins-dir")
                    .arg(&dir)
                    .args(&rest),
            );
            bail!("starting target/debug/eggtimer: {err}")
        }
        "test" => {
            build_plugins()?;
            // the binary and the tests in one build, the one `cargo xtask run` makes (its test
            // runs it: built here, not while tests run)
            cargo(RUN_BUILD, None, &[])?;
            // the tests run a copy: a `cargo xtask run` during them rebuilds target/debug/eggtimer
            let bin = target_dir().join("test-bin");
            std::fs::create_dir_all(&bin)?;
            std::fs::copy(target_dir().join("debug/eggtimer"), bin.join("eggtimer"))
                .context("copying the runner for the tests")?;
            test::openapi_tools(&root())?;
            // `cargo xtask test -- --test teams`: what follows `--` is cargo test's
            let rest = match rest.first().map(String::as_str) {
                Some("--") => &rest[1..],
                _ => &rest[..],
            };
            test::run(&root(), cargo_command(), rest)
        }
        "bench" => {
            let plugins = build_plugins()?;
            if let Some(p) = peer::parse(&rest)? {
                cargo(&["build", "--release", "-p", "eggtimer-bench"], None, &[])?;
                let bench = target_dir().join("release/eggtimer-bench");
                return peer::run(&root(), &target_dir(), &bench, &plugins, &p);
            }
            // W5 runs the eggtimer binary beside eggtimer-bench: build both
            cargo(
                &["build", "--release", "-p", "eggtimer", "--bin", "eggtimer"],
                None,
                &[],
            )?;
            cargo(
                &[
                    "run",
                    "--release",
                    "-p",
                    "eggtimer-bench",
                    "--",
                    "--plugins-dir",
                ],
                Some(&root().join("target/plugins")),
                &rest,
            )
        }
        "dist" => dist::dist(&rest),
        "token" => token(Path::new(
            rest.first().map_or("admin.token", String::as_str),
        )),
        _ => bail!(
            "usage: cargo xtask plugins | run [ARGS] | test [ARGS] | bench [ARGS] | dist [--no-image] [--redis-image] | token [FILE]"
        ),
    }
}

/// Makes an admin token: 32 random bytes as 64 hex digits in `file`, which only its owner may
/// read (mode 0600, made so, never widened after), and never over an existing file. Prints how
/// to use it, not the token: it stays out of the terminal's scrollback.
fn token(file: &Path) -> Result<()> {
    use std::io::{Read, Write};
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut r| r.read_exact(&mut bytes))
        .context("reading /dev/urandom")?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = match options.open(file) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => bail!(
            "{} exists: keep using it, or delete it first to make a new token (every runner and client must then take the new one)",
            file.display()
        ),
        r => r.with_context(|| format!("making {}", file.display()))?,
    };
    writeln!(f, "{token}").with_context(|| format!("writing {}", file.display()))?;
    let shown = file.display();
    println!(
        "made {shown} (readable by you alone). Start the runner with it, and let the CLI and curl read it:\n  \
         export EGGTIMER_TOKEN=\"$(cat {shown})\"\n  \
         cargo xtask run\n  \
         curl -H \"Authorization: Bearer $EGGTIMER_TOKEN\" -s 127.0.0.1:8080/v1/plugins"
    );
    Ok(())
}

/// Replaces this process with `cmd` (Unix); elsewhere runs it and exits with its status.
fn exec(cmd: &mut Command) -> std::io::Error {
    #[cfg(unix)]
    {
        std::os::unix::process::CommandExt::exec(cmd)
    }
    #[cfg(not(unix))]
    match cmd.status() {
        Ok(s) => std::process::exit(s.code().unwrap_or(1)),
        Err(e) => e,
    }
}

/// Cargo's target dir (`CARGO_TARGET_DIR`, else target/ of the workspace).
/// The build `cargo xtask run` makes of the runner: with the tests, as `cargo xtask test` builds
/// it. The tests' dependencies turn on features of dependencies the runner shares with them (in
/// regex-syntax, zerofrom, wasmparser, ...), so a build of the runner alone and one with the tests
/// would each compile wasmtime and everything above it (measured cold: 5 min 20 s, then 4 min
/// 14 s more); one build for both compiles them once, and either command finds the other's work
/// done.
/// (The upgrade test builds the last release with the same selection, so its dependencies are
/// these: tests/src/released.rs.)
const RUN_BUILD: &[&str] = &["build", "--workspace", "--bins", "--tests"];

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn cargo(args: &[&str], path_arg: Option<&Path>, rest: &[String]) -> Result<()> {
    let mut c = cargo_command();
    c.current_dir(root()).args(args);
    if let Some(p) = path_arg {
        c.arg(p);
    }
    c.args(rest);
    let status = c.status().context("running cargo")?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

/// The plugin crates: every directory under plugins/ with a Cargo.toml.
fn plugin_names() -> Result<Vec<String>> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(root().join("plugins"))? {
        let e = e?;
        if e.path().join("Cargo.toml").exists() {
            names.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// The plugins `cargo xtask run` loads: the samples and noop.
const RUN_PLUGINS: [&str; 5] = [
    "auto-feed",
    "coupon-expiry",
    "order-cancel",
    "webhook",
    "noop",
];

/// A directory with just the plugins a person running eggtimer wants.
fn run_plugins(built: &Path) -> Result<PathBuf> {
    let dir = root().join("target/run-plugins");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    for n in RUN_PLUGINS {
        let f = format!("{n}.wasm");
        std::fs::copy(built.join(&f), dir.join(&f)).with_context(|| format!("copying {f}"))?;
    }
    Ok(dir)
}

/// `eggtimer` without --redis starts redis-server: say how to install it before building.
/// Whether `program` is on PATH.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
}

fn require_redis_server() -> Result<()> {
    let found = on_path("redis-server");
    let redis_given = std::env::args().any(|a| a == "--redis" || a.starts_with("--redis="))
        || std::env::var_os("EGGTIMER_REDIS").is_some();
    if !found && !redis_given {
        bail!(
            "redis-server is not on PATH; eggtimer starts one for you. Install it \
             (Debian/Ubuntu: `sudo apt-get install -y redis-server`; Fedora: `sudo dnf install redis`; \
             macOS: `brew install redis`), or pass --redis redis://HOST:PORT"
        );
    }
    Ok(())
}

/// Adds the wasm32-wasip2 target through rustup when it is missing (or says how to).
fn ensure_wasm_target() -> Result<()> {
    let Ok(out) = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
    else {
        // no rustup: cargo will say if the target is missing
        return Ok(());
    };
    if String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == "wasm32-wasip2")
    {
        return Ok(());
    }
    eprintln!("xtask: adding the wasm32-wasip2 target (rustup target add wasm32-wasip2)");
    let status = Command::new("rustup")
        .args(["target", "add", "wasm32-wasip2"])
        .status()
        .context("running rustup")?;
    if !status.success() {
        bail!("`rustup target add wasm32-wasip2` failed; run it yourself and try again");
    }
    Ok(())
}

/// Copies `from` to `to` unless `to` already holds the same bytes: a runner reading a plugin
/// while this runs again (tests do) never sees it half written.
fn copy_if_changed(from: &Path, to: &Path) -> Result<()> {
    let bytes = std::fs::read(from)?;
    if std::fs::read(to).is_ok_and(|have| have == bytes) {
        return Ok(());
    }
    // written beside it, then renamed over it: readers see the old file or the new one
    let tmp = to.with_extension("wasm.tmp");
    std::fs::write(&tmp, &bytes)?;
    std::fs::rename(&tmp, to)?;
    Ok(())
}

fn build_plugins() -> Result<PathBuf> {
    ensure_wasm_target()?;
    let names = plugin_names()?;
    let target_dir = root().join("target/wasm");
    let mut args = vec![
        "build",
        "--profile",
        "plugin",
        "--target",
        "wasm32-wasip2",
        "--target-dir",
    ];
    let td = target_dir.to_string_lossy().into_owned();
    args.push(&td);
    for n in &names {
        args.push("-p");
        args.push(n);
    }
    cargo(&args, None, &[])?;
    let out = root().join("target/plugins");
    std::fs::create_dir_all(&out)?;
    for n in &names {
        let built = target_dir
            .join("wasm32-wasip2/plugin")
            .join(format!("{}.wasm", n.replace('-', "_")));
        copy_if_changed(&built, &out.join(format!("{n}.wasm")))
            .with_context(|| format!("copying {}", built.display()))?;
    }
    guest::build(&root(), &out)?;
    Ok(out)
}
