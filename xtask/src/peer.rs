//! `cargo xtask bench --peer bullmq [--rounds K] [--n N] [--only W0,W1,W2]`: eggtimer's W0, W1
//! and W2 and the same workloads run by BullMQ (`bench/peers/bullmq`), alternating, K rounds
//! (default 2), in one session; then a line per round with the ratios. Both print their JSON
//! lines as they come; the summary is one more JSON line, `"workload": "peer"`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// The peers there are: their directory under bench/peers.
const PEERS: &[&str] = &["bullmq"];

/// The workloads a peer runs.
const PEER_WORKLOADS: &[&str] = &["W0", "W1", "W2"];

/// What `--peer` runs: the peer, the rounds, and the flags both benchmarks take.
pub struct PeerArgs {
    pub peer: String,
    rounds: usize,
    n: Option<String>,
    only: String,
    /// Flags for eggtimer-bench alone.
    rest: Vec<String>,
}

/// `Some` when `args` name a peer (`--peer NAME`); the other flags are split between the two.
pub fn parse(args: &[String]) -> Result<Option<PeerArgs>> {
    if !args.iter().any(|a| a == "--peer") {
        return Ok(None);
    }
    let mut p = PeerArgs {
        peer: String::new(),
        rounds: 2,
        n: None,
        only: PEER_WORKLOADS.join(","),
        rest: Vec::new(),
    };
    let mut i = 0;
    while i < args.len() {
        let value = || {
            args.get(i + 1)
                .cloned()
                .with_context(|| format!("{} needs a value", args[i]))
        };
        match args[i].as_str() {
            "--peer" => p.peer = value()?,
            "--rounds" => {
                p.rounds = value()?
                    .parse()
                    .context("--rounds takes a number of rounds")?
            }
            "--n" => p.n = Some(value()?),
            "--only" => p.only = value()?,
            other => {
                p.rest.push(other.to_string());
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    if !PEERS.contains(&p.peer.as_str()) {
        bail!("--peer {:?}: the peers are {}", p.peer, PEERS.join(", "));
    }
    for w in p.only.split(',') {
        if !PEER_WORKLOADS.contains(&w.trim()) {
            bail!("--peer runs {} only, not {w}", PEER_WORKLOADS.join(", "));
        }
    }
    Ok(Some(p))
}

/// Installs the peer's pinned packages into target/peers/NAME (again when its lockfile changed)
/// and returns that directory, which holds its script.
fn install(root: &Path, target: &Path, peer: &str) -> Result<PathBuf> {
    let src = root.join("bench/peers").join(peer);
    let dir = target.join("peers").join(peer);
    std::fs::create_dir_all(&dir)?;
    let lock = std::fs::read(src.join("package-lock.json"))?;
    let fresh = std::fs::read(dir.join("package-lock.json")).is_ok_and(|l| l == lock)
        && dir.join("node_modules").is_dir();
    for f in ["package.json", "package-lock.json", "bench.mjs"] {
        std::fs::copy(src.join(f), dir.join(f)).with_context(|| format!("copying {f}"))?;
    }
    if !fresh {
        eprintln!(
            "xtask: installing the {peer} peer's packages into {}",
            dir.display()
        );
        let status = Command::new("npm")
            .current_dir(&dir)
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .status()
            .context(
                "running npm (install Node.js and npm: `sudo apt-get install -y nodejs npm`)",
            )?;
        if !status.success() {
            bail!("npm ci in {} failed ({status})", dir.display());
        }
    }
    Ok(dir)
}

/// Runs `cmd`, echoing its stdout, and returns the JSON lines it printed.
fn json_lines(cmd: &mut Command, what: &str) -> Result<Vec<Value>> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let mut out = Vec::new();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        println!("{line}");
        if let Ok(v) = serde_json::from_str::<Value>(&line) {
            out.push(v);
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(out)
}

/// The line of `workload` (and, for W0, of `plugin`) among `lines`.
fn find<'a>(lines: &'a [Value], workload: &str, plugin: Option<&str>) -> Option<&'a Value> {
    lines.iter().find(|v| {
        v["workload"] == workload && plugin.is_none_or(|p| v["plugin"].as_str() == Some(p))
    })
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some((a / b * 10.0).round() / 10.0),
        _ => None,
    }
}

/// The figures of one round side by side.
fn compare(ours: &[Value], theirs: &[Value]) -> Value {
    let f = |v: Option<&Value>, path: &[&str]| {
        path.iter()
            .try_fold(v?, |v, k| v.get(k))
            .and_then(Value::as_f64)
    };
    // W0's benchmarked plugin has no `check` (`noop-plain`); `noop`, beside it, has one
    let w0 = f(find(ours, "W0", Some("noop-plain")), &["tasks_per_s"]);
    let w0_checked = f(find(ours, "W0", Some("noop")), &["tasks_per_s"]);
    let b0 = f(find(theirs, "W0", None), &["tasks_per_s"]);
    let w2 = f(find(ours, "W2", None), &["tasks_per_s"]);
    let b2 = f(find(theirs, "W2", None), &["tasks_per_s"]);
    let p99 = |lines: &[Value]| f(find(lines, "W1", None), &["lateness_ms", "p99"]);
    let max = |lines: &[Value]| f(find(lines, "W1", None), &["lateness_ms", "max"]);
    json!({
        "w0_tasks_per_s": [w0, b0], "w0_ratio": ratio(w0, b0),
        "w0_checked_ratio": ratio(w0_checked, b0),
        "w1_p99_ms": [p99(ours), p99(theirs)], "w1_max_ms": [max(ours), max(theirs)],
        "w2_tasks_per_s": [w2, b2], "w2_ratio": ratio(w2, b2),
    })
}

/// Alternates eggtimer-bench (already built, at `bench`) and the peer, `rounds` times.
pub fn run(root: &Path, target: &Path, bench: &Path, plugins: &Path, p: &PeerArgs) -> Result<()> {
    let dir = install(root, target, &p.peer)?;
    let mut rounds = Vec::new();
    for round in 1..=p.rounds {
        eprintln!("xtask: round {round} of {}: eggtimer", p.rounds);
        let mut ours = Command::new(bench);
        ours.current_dir(root)
            .arg("--plugins-dir")
            .arg(plugins)
            .args(["--only", &p.only])
            .args(&p.rest);
        if let Some(n) = &p.n {
            ours.args(["--n", n]);
        }
        let ours = json_lines(&mut ours, "eggtimer-bench")?;
        eprintln!("xtask: round {round} of {}: {}", p.rounds, p.peer);
        let mut theirs = Command::new("node");
        theirs
            .current_dir(&dir)
            .arg("bench.mjs")
            .args(["--only", &p.only]);
        if let Some(n) = &p.n {
            theirs.args(["--n", n]);
        }
        let theirs = json_lines(&mut theirs, &format!("the {} peer", p.peer))?;
        rounds.push(compare(&ours, &theirs));
    }
    println!(
        "{}",
        json!({"workload": "peer", "peer": p.peer, "rounds": rounds})
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn the_flags_split_between_the_two_benchmarks() {
        assert!(parse(&args("--only W1")).unwrap().is_none());
        let p = parse(&args("--peer bullmq --rounds 3 --n 5000 --shards 8"))
            .unwrap()
            .unwrap();
        assert_eq!(
            (p.rounds, p.n.as_deref(), p.only.as_str()),
            (3, Some("5000"), "W0,W1,W2")
        );
        assert_eq!(p.rest, args("--shards 8"));
        let e = parse(&args("--peer sidekiq")).err().unwrap().to_string();
        assert!(e.contains("the peers are bullmq"), "{e}");
        let e = parse(&args("--peer bullmq --only W2,W9"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not W9"), "{e}");
        assert!(parse(&args("--peer")).is_err());
    }

    #[test]
    fn a_round_compares_the_benchmarked_plugin_without_a_check() {
        let ours = [
            json!({"workload": "W0", "plugin": "noop", "tasks_per_s": 150.0}),
            json!({"workload": "W0", "plugin": "noop-plain", "tasks_per_s": 200.0}),
            json!({"workload": "W1", "lateness_ms": {"p99": 4.0, "max": 12.0}}),
            json!({"workload": "W2", "tasks_per_s": 120.0}),
        ];
        let theirs = [
            json!({"workload": "W0", "peer": "bullmq", "tasks_per_s": 40.0}),
            json!({"workload": "W1", "lateness_ms": {"p99": 2000.0, "max": 3000.0}}),
            json!({"workload": "W2", "tasks_per_s": 20.0}),
        ];
        let r = compare(&ours, &theirs);
        assert_eq!(r["w0_ratio"], 5.0);
        assert_eq!(r["w0_checked_ratio"], 3.8);
        assert_eq!(r["w2_ratio"], 6.0);
        assert_eq!(r["w1_p99_ms"], json!([4.0, 2000.0]));
        // a workload one side did not run has no ratio
        assert!(compare(&ours[..1], &theirs)["w2_ratio"].is_null());
    }
}
