//! `cargo xtask <command>`: the project's commands, in Rust instead of shell scripts.
//!
//! - `plugins` builds every plugin under plugins/ to wasm (its own target dir, so the host build is
//!   not invalidated) and copies them to target/plugins/<name>.wasm.
//! - `run [ARGS]` builds the plugins and runs `eggtimer serve --plugins-dir target/plugins ARGS`.
//! - `test [ARGS]` builds the plugins and the runner, then runs the whole test suite.
//! - `bench [ARGS]` builds in release and runs the benchmark (BENCHMARKS.md).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

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
            let dir = build_plugins()?;
            cargo(
                &[
                    "run",
                    "--quiet",
                    "-p",
                    "eggtimer",
                    "--",
                    "serve",
                    "--plugins-dir",
                ],
                Some(&dir),
                &rest,
            )
        }
        "test" => {
            build_plugins()?;
            cargo(&["build", "-p", "eggtimer", "--bin", "eggtimer"], None, &[])?;
            cargo(&["test", "--workspace"], None, &rest)
        }
        "bench" => {
            build_plugins()?;
            cargo(
                &[
                    "run",
                    "--release",
                    "-p",
                    "eggtimer",
                    "--bin",
                    "eggtimer",
                    "--",
                    "bench",
                    "--plugins-dir",
                ],
                Some(&root().join("target/plugins")),
                &rest,
            )
        }
        _ => bail!("usage: cargo xtask plugins | run [ARGS] | test [ARGS] | bench [ARGS]"),
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn cargo(args: &[&str], path_arg: Option<&Path>, rest: &[String]) -> Result<()> {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
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

fn build_plugins() -> Result<PathBuf> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output();
    if let Ok(out) = installed
        && !String::from_utf8_lossy(&out.stdout).contains("wasm32-wasip2")
    {
        bail!("the wasm32-wasip2 target is missing: run `rustup target add wasm32-wasip2`");
    }
    let names = plugin_names()?;
    let target_dir = root().join("target/wasm");
    let mut args = vec![
        "build",
        "--quiet",
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
        std::fs::copy(&built, out.join(format!("{n}.wasm")))
            .with_context(|| format!("copying {}", built.display()))?;
    }
    Ok(out)
}
