//! For the tests of plugins in other languages and of the clients: a runner made for them, the
//! plugins' uploads and events, and the outside programs (node, python3, tsc) they run.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

use crate::{RedisServer, RunnerProcess, find_program, plugin_wasm, plugins_dir, upload};

/// A runner with the Rust plugins and a long request timeout (an 18 MB Python upload compiles
/// for seconds on a debug build under a loaded CI machine).
pub fn guest_runner(redis: &RedisServer) -> RunnerProcess {
    let dir = plugins_dir();
    RunnerProcess::start(
        &redis.url(),
        &[
            "--plugins-dir",
            dir.to_str().unwrap(),
            "--http-request-timeout",
            "600s",
            "--retry-base",
            "50ms",
            "--secrets-key-file",
            KEY.get_or_init(crate::secrets_key_file).to_str().unwrap(),
        ],
    )
}

static KEY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Uploads each of the built plugins `names`, asserting 201.
pub async fn upload_all(base: &str, names: &[&str]) {
    for n in names {
        let (s, b) = upload(base, n, plugin_wasm(n)).await;
        assert_eq!(s, 201, "uploading {n}: {b}");
    }
}

/// The `data` field of every event of these plugins on a topic, by task id.
pub fn events_by_task(
    redis: &RedisServer,
    plugins: &[&str],
    topic: &str,
) -> HashMap<String, Vec<String>> {
    let rows: Vec<(String, Vec<(String, String)>)> = plugins
        .iter()
        .flat_map(|p| {
            redis::cmd("XRANGE")
                .arg(crate::events_key(p, topic))
                .arg("-")
                .arg("+")
                .query::<Vec<(String, Vec<(String, String)>)>>(&mut redis.conn())
                .unwrap()
        })
        .collect();
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    for (_, fields) in rows {
        let f: HashMap<String, String> = fields.into_iter().collect();
        out.entry(f["task_id"].clone())
            .or_default()
            .push(f["data"].clone());
    }
    out
}

/// A program on PATH, or a failure naming how to install it.
pub fn program(name: &str, install: &str) -> PathBuf {
    find_program(&[name]).unwrap_or_else(|| panic!("{name} is not on PATH: {install}"))
}

/// Runs `cmd`, asserting it succeeds; its stdout and stderr together.
pub fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed:\n{text}");
    text
}
