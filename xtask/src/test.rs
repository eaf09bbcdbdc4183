//! `cargo xtask test`: the whole suite on a machine that has only the README's prerequisites.
//! It installs what the tests call that is not a Rust crate (schemathesis and
//! openapi-python-client, pinned, into target/py and target/py-gen, as the plugins' toolchains go into target/), runs every test file even when one
//! fails, and ends with one summary: passed, failed, the failing tests by name, the wall time.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// schemathesis, pinned: the OpenAPI tests run it against a runner.
pub const SCHEMATHESIS: &str = "schemathesis==4.32.5";

/// openapi-python-client, pinned: a test generates a client from the document with it.
pub const OPENAPI_PYTHON_CLIENT: &str = "openapi-python-client==0.29.1";

/// The virtualenvs of the OpenAPI tests' tools, made when missing: target/py with schemathesis,
/// target/py-gen with openapi-python-client (apart: their dependencies need not agree).
pub fn openapi_tools(root: &Path) -> Result<()> {
    python_tool(root, "target/py", "schemathesis", SCHEMATHESIS)?;
    python_tool(
        root,
        "target/py-gen",
        "openapi-python-client",
        OPENAPI_PYTHON_CLIENT,
    )
}

/// The virtualenv `dir` with `package` (whose command is `bin`), made when missing.
fn python_tool(root: &Path, dir: &str, bin: &str, package: &str) -> Result<()> {
    let venv = root.join(dir);
    if venv.join("bin").join(bin).is_file() {
        return Ok(());
    }
    eprintln!("xtask: installing {package} into {dir}");
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        bail!(
            "`python3 -m venv {dir}` failed: the OpenAPI tests need Python 3 with venv \
             (Debian/Ubuntu: `sudo apt-get install -y python3-venv`)"
        );
    }
    let status = Command::new(venv.join("bin/pip"))
        .args(["install", "-q", package])
        .status()
        .context("running pip")?;
    if !status.success() {
        bail!("`{dir}/bin/pip install {package}` failed ({status})");
    }
    Ok(())
}

/// What the test binaries said, read from their output as it streams past.
#[derive(Default)]
struct Tally {
    passed: u64,
    failed: u64,
    ignored: u64,
    /// `test <name> ... FAILED` lines, in order.
    failures: Vec<String>,
}

impl Tally {
    fn read(&mut self, line: &str) {
        if let Some(rest) = line.strip_prefix("test result: ") {
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(what), Some(n)) = (words.next(), words.next()) else {
                    continue;
                };
                let n: u64 = n.parse().unwrap_or(0);
                match what {
                    "passed" => self.passed += n,
                    "failed" => self.failed += n,
                    "ignored" => self.ignored += n,
                    _ => {}
                }
            }
        } else if let Some(name) = line
            .strip_prefix("test ")
            .and_then(|l| l.strip_suffix(" ... FAILED"))
        {
            self.failures.push(name.to_owned());
        }
    }
}

/// Runs `cargo test --workspace --no-fail-fast` with `args`, its output passed through, then the
/// summary. Fails when a test failed or a test file did not run to its end.
pub fn run(root: &Path, mut cargo: Command, args: &[String]) -> Result<()> {
    let started = Instant::now();
    let mut child = cargo
        .current_dir(root)
        .args(["test", "--workspace", "--no-fail-fast"])
        .args(args)
        // the runner binary built with the tests, copied (the harness builds none of its own)
        .env(
            "EGGTIMER_BIN",
            std::env::var_os("CARGO_TARGET_DIR")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| root.join("target"))
                .join("test-bin/eggtimer"),
        )
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo test")?;
    let mut tally = Tally::default();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line.context("reading the tests' output")?;
        println!("{line}");
        tally.read(&line);
    }
    let status = child.wait().context("waiting for cargo test")?;
    let took = started.elapsed().as_secs();
    println!();
    println!("xtask: the tests took {} min {} s", took / 60, took % 60);
    if !tally.failures.is_empty() {
        println!("xtask: failed:");
        for f in &tally.failures {
            println!("    {f}");
        }
    }
    if !status.success() && tally.failed == 0 {
        println!(
            "xtask: cargo test failed ({status}) though no test said FAILED: a test file did not \
             build or did not run to its end (see above)"
        );
    }
    let ignored = if tally.ignored > 0 {
        format!(", {} skipped", tally.ignored)
    } else {
        String::new()
    };
    println!(
        "summary: {} passed, {} failed{ignored}",
        tally.passed, tally.failed
    );
    if !status.success() {
        bail!("the tests failed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tally_adds_every_result_line_and_names_each_failure() {
        let mut t = Tally::default();
        for l in [
            "test a::b ... ok",
            "test result: ok. 12 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.2s",
            "test teams::x ... FAILED",
            "test result: FAILED. 3 passed; 1 failed; 2 ignored; 0 measured; 0 filtered out; finished in 9.0s",
        ] {
            t.read(l);
        }
        assert_eq!((t.passed, t.failed, t.ignored), (15, 1, 2));
        assert_eq!(t.failures, ["teams::x"]);
    }
}
