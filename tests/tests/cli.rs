//! The command-line client against a real runner: each command is one API call, its reply shown
//! as a table or as JSON.

use std::time::Duration;

use eggtimer_tests::{RedisServer, RunnerProcess, eggtimer_bin, plugins_dir, wait_state};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);

fn start(redis: &RedisServer, extra: &[&str]) -> RunnerProcess {
    let dir = plugins_dir();
    let mut args = vec!["--plugins-dir", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    RunnerProcess::start(&redis.url(), &args)
}

#[tokio::test]
async fn the_cli_speaks_the_api() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(eggtimer_bin())
            .args(args)
            .args(["--url", &r.url])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let wasm = plugins_dir().join("noop.wasm");
    let (c, out, err) = cli(&["plugin", "push", "cli-noop", wasm.to_str().unwrap()]);
    assert_eq!(c, Some(0), "{err}");
    assert!(out.contains("\"version\": 1"), "{out}");
    // lists print aligned tables; --json prints the API's reply
    let (c, out, _) = cli(&["plugin", "list"]);
    assert_eq!(c, Some(0));
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("NAME ") && lines[0].contains(" VERSION  DIGEST "),
        "{out}"
    );
    let version_col = lines[0].find("VERSION").unwrap();
    let row = lines
        .iter()
        .find(|l| l.starts_with("cli-noop "))
        .expect(&out);
    assert_eq!(
        row.find(" 1 ").map(|i| i + 1),
        Some(version_col),
        "aligned: {out}"
    );
    let (c, out, _) = cli(&["plugin", "list", "--json"]);
    assert_eq!(c, Some(0));
    let list: Value = serde_json::from_str(&out).unwrap();
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "cli-noop"),
        "{out}"
    );
    // a plugin's own time limit and memory cap, shown in the list
    let (c, _, err) = cli(&["plugin", "time-limit", "cli-noop", "2500ms"]);
    assert_eq!(c, Some(0), "{err}");
    let (c, _, err) = cli(&["plugin", "memory", "cli-noop", "134217728"]);
    assert_eq!(c, Some(0), "{err}");
    let (c, _, err) = cli(&["plugin", "max-pending", "cli-noop", "5000"]);
    assert_eq!(c, Some(0), "{err}");
    let (c, _, err) = cli(&["plugin", "owner-limit", "cli-noop", "--max", "2"]);
    assert_eq!(c, Some(0), "{err}");
    let (c, _, err) = cli(&["plugin", "rate-limit", "cli-noop", "600/1m"]);
    assert_eq!(c, Some(0), "{err}");
    let (c, _, err) = cli(&["plugin", "owner-rate-limit", "cli-noop", "2/1s"]);
    assert_eq!(c, Some(0), "{err}");
    let (c, _, err) = cli(&["plugin", "owner-max-pending", "cli-noop", "500"]);
    assert_eq!(c, Some(0), "{err}");
    let (c, out, err) = cli(&["plugin", "owner-weight", "cli-noop", "merchant 7", "3"]);
    assert_eq!(c, Some(0), "{err}");
    let w: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&w["owner"], &w["weight"]),
        (&json!("merchant 7"), &json!(3)),
        "{out}"
    );
    let (_, out, _) = cli(&["plugin", "list"]);
    let row = out
        .lines()
        .find(|l| l.starts_with("cli-noop "))
        .expect(&out);
    assert!(
        row.contains(" 2500 ms ") && row.contains(" 128 MiB ") && row.trim_end().ends_with(" 5000"),
        "{out}"
    );
    let (c, _, err) = cli(&["plugin", "memory", "cli-noop", "1000"]);
    assert_eq!(c, Some(2), "refused before a request: {err}");
    assert!(err.contains("1048576 (1 MiB)"), "{err}");
    for cmd in ["time-limit", "memory", "max-pending"] {
        let (c, _, err) = cli(&["plugin", cmd, "cli-noop", "--default"]);
        assert_eq!(c, Some(0), "{err}");
    }
    let (_, out, _) = cli(&["plugin", "get", "cli-noop"]);
    let p: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&p["time_limit_ms"], &p["memory_bytes"]),
        (&Value::Null, &Value::Null),
        "{out}"
    );
    assert_eq!(p["max_pending"], 1_000_000, "{out}");
    assert_eq!(p["max_concurrency_per_owner"], 2, "{out}");
    assert_eq!(
        p["rate_limit"],
        json!({"max": 600, "per_ms": 60000}),
        "{out}"
    );
    assert_eq!(
        p["owner_rate_limit"],
        json!({"max": 2, "per_ms": 1000}),
        "{out}"
    );
    assert_eq!(p["max_pending_per_owner"], json!(500), "{out}");
    let (c, _, err) = cli(&["plugin", "rate-limit", "cli-noop", "--none"]);
    assert_eq!(c, Some(0), "{err}");
    let (c, _, err) = cli(&["plugin", "owner-limit", "cli-noop", "--none"]);
    assert_eq!(c, Some(0), "{err}");
    let (c, out, _) = cli(&["runners"]);
    assert_eq!(c, Some(0));
    assert!(out.starts_with("ID"), "{out}");
    assert!(out.contains(&r.url), "{out}");
    let (_, out, _) = cli(&["runners", "--json"]);
    let runners: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(runners.as_array().map(Vec::len), Some(1), "{out}");
    let (c, _, err) = cli(&[
        "task",
        "add",
        "cli-noop",
        "--payload",
        "{\"a\":1}",
        "--in",
        "2h",
        "--id",
        "t1",
        "--owner",
        "u1",
    ]);
    assert_eq!(c, Some(0), "{err}");
    let (c, out, _) = cli(&["task", "move", "t1", "--by", "-1h"]);
    assert_eq!(c, Some(0));
    let moved: Value = serde_json::from_str(&out).unwrap();
    let (c, _, _) = cli(&[
        "owner", "shift", "u1", "--by", "-30m", "--plugin", "cli-noop",
    ]);
    assert_eq!(c, Some(0));
    // an owner paused: its task waits; resumed: due as it was
    let (c, out, err) = cli(&["owner", "pause", "u1", "--plugin", "cli-noop"]);
    assert_eq!(c, Some(0), "{err}");
    let paused: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        paused["paused"],
        json!({"all": false, "plugins": ["cli-noop"]}),
        "{out}"
    );
    // its counts per plugin, as a table and as JSON
    let (c, out, err) = cli(&["owner", "stats", "u1"]);
    assert_eq!(c, Some(0), "{err}");
    let row = out.lines().find(|l| l.starts_with("cli-noop"));
    let row: Vec<&str> = row.unwrap_or_default().split_whitespace().collect();
    assert_eq!(row, ["cli-noop", "1", "0", "0", "1", "paused"], "{out}");
    let (_, out, _) = cli(&["owner", "stats", "u1", "--json"]);
    let stats: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&stats["scheduled"], &stats["plugins"][0]["plugin"]),
        (&json!(1), &json!("cli-noop")),
        "{out}"
    );
    let (c, out, err) = cli(&["owner", "resume", "u1"]);
    assert_eq!(c, Some(0), "{err}");
    let resumed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        resumed["paused"],
        json!({"all": false, "plugins": []}),
        "{out}"
    );
    let (_, out, _) = cli(&["task", "get", "t1"]);
    assert!(out.contains("\nowner          u1\n"), "{out}");
    assert!(out.contains("\npayload        {\"a\":1}\n"), "{out}");
    let (_, out, _) = cli(&["task", "get", "t1", "--json"]);
    let t: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        t["run_at"].as_i64().unwrap(),
        moved["run_at"].as_i64().unwrap() - 1_800_000
    );
    let (c, _, _) = cli(&["task", "run", "t1"]);
    assert_eq!(c, Some(0));
    wait_state(&r.url, "t1", "done", T).await;
    let (c, _, err) = cli(&["task", "cancel", "nope"]);
    assert_eq!(c, Some(1));
    assert!(err.contains("404"), "{err}");
    // one id in two plugins: --plugin names one
    for plugin in ["cli-noop", "noop"] {
        let (c, _, err) = cli(&["task", "add", plugin, "--in", "2h", "--id", "twin"]);
        assert_eq!(c, Some(0), "{err}");
    }
    let (c, _, err) = cli(&["task", "get", "twin"]);
    assert_eq!(c, Some(1));
    assert!(
        err.contains("409") && err.contains("each have a task"),
        "{err}"
    );
    let (c, out, err) = cli(&["task", "get", "twin", "--plugin", "noop", "--json"]);
    assert_eq!(c, Some(0), "{err}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["plugin"],
        "noop"
    );
    let (c, _, err) = cli(&["task", "cancel", "twin", "--plugin", "noop"]);
    assert_eq!(c, Some(0), "{err}");
    let (c, _, err) = cli(&["task", "cancel", "twin"]);
    assert_eq!(c, Some(0), "the other plugin's, now the only one: {err}");
    let (c, _, err) = cli(&["task", "add", "nosuch"]);
    assert_eq!(c, Some(1));
    assert!(err.contains("no plugin named"), "{err}");
    let (c, out, _) = cli(&["dead", "list"]);
    assert_eq!(c, Some(0));
    assert_eq!(out.lines().count(), 1, "only the header: {out}");
    assert!(out.starts_with("ID  PLUGIN  STATE"), "{out}");
    let (c, out, _) = cli(&["dead", "list", "--json"]);
    assert_eq!(c, Some(0));
    assert!(out.contains("\"tasks\": []"), "{out}");
}

#[tokio::test]
async fn an_admin_makes_lists_and_revokes_keys_and_reads_the_audit_from_the_cli() {
    let redis = RedisServer::start();
    let r = start(&redis, &["--token", "cli-admin"]);
    let token_file = eggtimer_tests::temp_dir("cli-token").join("token");
    std::fs::write(&token_file, "cli-admin\n").unwrap();
    let cli = |args: &[&str], env: &[(&str, &str)]| {
        let out = std::process::Command::new(eggtimer_bin())
            .args(args)
            .args(["--url", &r.url])
            .env_remove("EGGTIMER_TOKEN")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let admin = [("EGGTIMER_TOKEN_FILE", token_file.to_str().unwrap())];
    let (c, out, err) = cli(
        &[
            "key",
            "create",
            "team-pets",
            "--role",
            "operator",
            "--plugins",
            "auto-feed,pet-*",
        ],
        &admin,
    );
    assert_eq!(c, Some(0), "{err}");
    let made: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(made["plugins"], serde_json::json!(["auto-feed", "pet-*"]));
    let (id, key) = (made["id"].as_str().unwrap(), made["key"].as_str().unwrap());
    // the team's key from the environment: its plugins only, no keys
    let team = [("EGGTIMER_TOKEN", key)];
    let (c, _, err) = cli(&["plugin", "get", "noop"], &team);
    assert_eq!(c, Some(1));
    assert!(err.contains("403") && err.contains("\"noop\""), "{err}");
    let (c, _, err) = cli(&["key", "list"], &team);
    assert!(c == Some(1) && err.contains("needs admin"), "{err}");
    // the list is a table without the secret
    let (c, out, _) = cli(&["key", "list"], &admin);
    assert_eq!(c, Some(0));
    assert!(
        out.starts_with("ID ") && out.contains("team-pets") && out.contains("operator"),
        "{out}"
    );
    assert!(!out.contains(key), "{out}");
    let (c, out, _) = cli(&["audit", "--key", "team-pets"], &admin);
    assert_eq!(c, Some(0));
    assert!(
        out.contains("GET") && out.contains("/v1/plugins/noop") && out.contains("403"),
        "{out}"
    );
    let (c, _, err) = cli(&["key", "revoke", id], &admin);
    assert_eq!(c, Some(0), "{err}");
    let (c, _, err) = cli(&["plugin", "list"], &team);
    assert!(c == Some(1) && err.contains("401"), "{err}");
}

#[tokio::test]
async fn a_plugins_secrets_hosts_and_config_from_the_cli() {
    let redis = RedisServer::start();
    let key = eggtimer_tests::secrets_key_file();
    let r = start(&redis, &["--secrets-key-file", key.to_str().unwrap()]);
    let cli = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut child = std::process::Command::new(eggtimer_bin())
            .args(args)
            .args(["--url", &r.url])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // the value comes from standard input (not the command line, which `ps` shows)
    let (c, _, err) = cli(
        &["plugin", "secret", "set", "webhook", "signing_key"],
        "whsec-from-stdin\n",
    );
    assert_eq!(c, Some(0), "{err}");
    let (c, out, _) = cli(&["plugin", "secret", "list", "webhook"], "");
    assert_eq!(c, Some(0));
    let list: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list[0]["name"], "signing_key", "{out}");
    assert!(!out.contains("whsec-from-stdin"));
    let (c, _, err) = cli(
        &["plugin", "secret", "delete", "webhook", "signing_key"],
        "",
    );
    assert_eq!(c, Some(0), "{err}");
    let (c, _, err) = cli(
        &["plugin", "secret", "delete", "webhook", "signing_key"],
        "",
    );
    assert_eq!(c, Some(1));
    assert!(err.contains("has no secret \"signing_key\""), "{err}");
    // nothing on standard input is a mistake, not an empty secret
    let (c, _, err) = cli(&["plugin", "secret", "set", "webhook", "signing_key"], "");
    assert_eq!(c, Some(1));
    assert!(err.contains("is empty"), "{err}");
    // a client flag before the command is named for where it goes (clap suggested --token)
    let out = std::process::Command::new(eggtimer_bin())
        .args(["--token-file", "/nonexistent", "task", "find"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--token-file is a flag of the client commands"),
        "{err}"
    );

    let (c, out, err) = cli(
        &[
            "plugin",
            "allow-hosts",
            "webhook",
            "https://hooks.example.com",
            "https://*.partner.example",
        ],
        "",
    );
    assert_eq!(c, Some(0), "{err}");
    let p: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        p["allowed_hosts"],
        json!(["https://hooks.example.com", "https://*.partner.example"])
    );
    assert!(
        err.contains("added https://hooks.example.com, https://*.partner.example"),
        "{err}"
    );
    // --add and --remove change the list; a replace says what it dropped
    let (c, out, err) = cli(
        &[
            "plugin",
            "allow-hosts",
            "webhook",
            "--add",
            "http://127.0.0.1:9000",
        ],
        "",
    );
    assert_eq!(c, Some(0), "{err}");
    let p: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(p["allowed_hosts"].as_array().unwrap().len(), 3, "{p}");
    assert!(err.contains("(added http://127.0.0.1:9000)"), "{err}");
    let (c, out, err) = cli(
        &[
            "plugin",
            "allow-hosts",
            "webhook",
            "--remove",
            "https://*.partner.example",
        ],
        "",
    );
    assert_eq!(c, Some(0), "{err}");
    let p: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        p["allowed_hosts"],
        json!(["https://hooks.example.com", "http://127.0.0.1:9000"])
    );
    assert!(err.contains("removed https://*.partner.example"), "{err}");
    let (c, out, err) = cli(
        &[
            "plugin",
            "allow-hosts",
            "webhook",
            "--set",
            "https://hooks.example.com",
        ],
        "",
    );
    assert_eq!(c, Some(0), "{err}");
    assert!(err.contains("removed http://127.0.0.1:9000"), "{err}");
    let p: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(p["allowed_hosts"], json!(["https://hooks.example.com"]));
    let (c, _, err) = cli(
        &[
            "plugin",
            "allow-hosts",
            "webhook",
            "--set",
            "--add",
            "https://a.example",
        ],
        "",
    );
    assert_eq!(c, Some(2), "--set and --add conflict: {err}");
    let (c, _, err) = cli(
        &["plugin", "allow-hosts", "webhook", "hooks.example.com/x"],
        "",
    );
    assert_eq!(c, Some(1));
    assert!(err.contains("is not an origin"), "{err}");
    let (c, out, err) = cli(
        &["plugin", "config", "webhook", "region=eu", "tier=gold"],
        "",
    );
    assert_eq!(c, Some(0), "{err}");
    let p: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(p["config"], json!({"region": "eu", "tier": "gold"}));
    // none clears them
    let (c, out, _) = cli(&["plugin", "allow-hosts", "webhook"], "");
    assert_eq!(c, Some(0));
    let p: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(p["allowed_hosts"], json!([]));
}
