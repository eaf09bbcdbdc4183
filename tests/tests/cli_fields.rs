//! The command-line client on par with the API, against a real runner: `task add` takes every
//! field of a task spec, `key list` shows every field of a key, every `serve` flag has a row in
//! the README's configuration table, and no `--help` prints a secret.

use std::time::Duration;

use eggtimer_tests::{RedisServer, RunnerProcess, eggtimer_bin, plugins_dir, wait_state};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);

fn start(redis: &RedisServer) -> RunnerProcess {
    let dir = plugins_dir();
    RunnerProcess::start(&redis.url(), &["--plugins-dir", dir.to_str().unwrap()])
}

/// `eggtimer ARGS --url URL`: (exit code, stdout, stderr).
fn cli(url: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(eggtimer_bin())
        .args(args)
        .args(["--url", url])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `--help` names the variables that hold secrets but never prints their values (clap shows an
/// env variable's value by default: the token in clear, beside the warning about `ps`).
#[test]
fn help_never_prints_a_secret() {
    let secret = "s3cret-token-value";
    for args in [
        &["--help"][..],
        &["serve", "--help"],
        &["task", "--help"],
        &["task", "add", "--help"],
        &["plugin", "push", "--help"],
    ] {
        let out = std::process::Command::new(eggtimer_bin())
            .args(args)
            .env("EGGTIMER_TOKEN", secret)
            .env("EGGTIMER_METRICS_TOKEN", secret)
            .env("EGGTIMER_REDIS", format!("redis://:{secret}@127.0.0.1:1"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(
            !text.contains(secret),
            "{args:?} printed the secret:\n{text}"
        );
    }
    let out = std::process::Command::new(eggtimer_bin())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("EGGTIMER_TOKEN"),
        "the variable is still named:\n{text}"
    );
}

/// `task add` takes every field of a task spec (listeners with `--on` and `--lookback`, a
/// debounce window, a dedup window, a trace context), and `key list` shows every field of a key
/// (its topics, streams and limits).
#[tokio::test]
async fn task_add_takes_every_field_of_a_spec_and_key_list_shows_every_field() {
    let redis = RedisServer::start();
    let r = start(&redis);
    let cli = |args: &[&str]| cli(&r.url, args);
    let get = |id: &str| -> Value {
        let (c, out, err) = cli(&["task", "get", id, "--json"]);
        assert_eq!(c, Some(0), "{err}");
        serde_json::from_str(&out).unwrap()
    };
    // listeners: a key may hold a `:`, a topic may not
    let (c, _, err) = cli(&[
        "task",
        "add",
        "noop",
        "--id",
        "l1",
        "--in",
        "1h",
        "--on",
        "orders.paid:o:1:cancel",
        "--on",
        "orders.shipped:o2:run",
        "--lookback",
        "5s",
    ]);
    assert_eq!(c, Some(0), "{err}");
    let t = get("l1");
    assert_eq!(
        t["on"],
        json!([{"topic": "orders.paid", "key": "o:1", "then": "cancel"},
               {"topic": "orders.shipped", "key": "o2", "then": "run"}]),
        "{t}"
    );
    assert_eq!(t["lookback_ms"], 5000, "{t}");
    let (c, _, err) = cli(&["task", "add", "noop", "--on", "orders.paid"]);
    assert_ne!(c, Some(0));
    assert!(err.contains("TOPIC:KEY:cancel"), "{err}");

    // a debounce window: three adds, one task with the three payloads
    for i in 0..3 {
        let (c, out, err) = cli(&[
            "task",
            "add",
            "noop",
            "--payload",
            &format!("{{\"i\":{i}}}"),
            "--debounce",
            "feed-1",
            "--quiet",
            "1h",
            "--json",
        ]);
        assert_eq!(c, Some(0), "{err}");
        assert!(out.contains("debounced"), "{out}");
    }
    let t = get("feed-1");
    assert_eq!(t["batch"], json!([{"i": 0}, {"i": 1}, {"i": 2}]), "{t}");
    assert_eq!(
        (&t["debounce"]["quiet_ms"], &t["debounce"]["max_wait_ms"]),
        (&json!(3_600_000), &json!(3_600_000)),
        "{t}"
    );

    // a dedup window: once done, the same id is refused for 10 minutes
    let (c, _, err) = cli(&["task", "add", "noop", "--id", "u1", "--unique-for", "10m"]);
    assert_eq!(c, Some(0), "{err}");
    wait_state(&r.url, "u1", "done", T).await;
    let (c, _, err) = cli(&["task", "add", "noop", "--id", "u1", "--unique-for", "10m"]);
    assert_ne!(c, Some(0), "a second u1 inside its dedup window: {err}");
    assert!(err.contains("409"), "{err}");

    // a trace context
    let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let (c, _, err) = cli(&[
        "task",
        "add",
        "noop",
        "--id",
        "t1",
        "--in",
        "1h",
        "--traceparent",
        tp,
    ]);
    assert_eq!(c, Some(0), "{err}");
    assert_eq!(get("t1")["traceparent"], tp);

    // every field of a key in its list
    let (c, _, err) = cli(&[
        "key",
        "create",
        "payments",
        "--role",
        "developer",
        "--plugins",
        "pay-*",
        "--publish",
        "payments",
        "--listen",
        "orders.*",
        "--streams",
        "payments*",
        "--max-pending",
        "500",
    ]);
    assert_eq!(c, Some(0), "{err}");
    let (c, out, err) = cli(&["key", "list"]);
    assert_eq!(c, Some(0), "{err}");
    for shown in [
        "PUBLISH",
        "LISTEN",
        "STREAMS",
        "orders.*",
        "payments*",
        "pending 500",
    ] {
        assert!(out.contains(shown), "{shown} missing from:\n{out}");
    }
}

/// Every flag of `eggtimer serve` has a row in the README's configuration table (a row may name
/// several flags), so none is only found by reading `--help`.
#[test]
fn every_serve_flag_is_in_the_readmes_configuration_table() {
    let out = std::process::Command::new(eggtimer_bin())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let readme = std::fs::read_to_string(eggtimer_tests::workspace().join("README.md")).unwrap();
    let rows: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("| `--"))
        .map(|l| l.split(" | ").next().unwrap_or(""))
        .collect();
    let flags: Vec<&str> = help
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .filter_map(|l| l.split([' ', '<']).next())
        .filter(|f| *f != "help")
        .collect();
    assert!(flags.len() > 40, "read {} flags from:\n{help}", flags.len());
    let missing: Vec<&&str> = flags
        .iter()
        .filter(|f| !rows.iter().any(|r| r.contains(&format!("`--{f}`"))))
        .collect();
    assert!(
        missing.is_empty(),
        "serve flags without a row in the README's configuration table: {missing:?}"
    );
}
