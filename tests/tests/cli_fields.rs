//! The command-line client on par with the API, against a real runner: `task add` takes every
//! field of a task spec, `key list` shows every field of a key, every `serve` flag has a row in
//! the README's configuration table, and no `--help` prints a secret.

use std::time::Duration;

use eggtimer_tests::{
    RedisServer, RunnerProcess, eggtimer_bin, eventually, plugins_dir, wait_state,
};
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
    // and its table shows them
    let (c, table, err) = cli(&["task", "get", "l1"]);
    assert_eq!(c, Some(0), "{err}");
    for shown in [
        "orders.paid:o:1 -> cancel",
        "orders.shipped:o2 -> run",
        "5000",
    ] {
        assert!(table.contains(shown), "{shown} missing from:\n{table}");
    }
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
    let (c, table, err) = cli(&["task", "get", "feed-1"]);
    assert_eq!(c, Some(0), "{err}");
    assert!(table.contains("3 payloads, 0 dropped"), "{table}");
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

    // a priority, and one out of range refused by the API with what is wrong
    let (c, _, err) = cli(&[
        "task",
        "add",
        "noop",
        "--id",
        "pr1",
        "--in",
        "1h",
        "--priority",
        "7",
    ]);
    assert_eq!(c, Some(0), "{err}");
    assert_eq!(get("pr1")["priority"], 7);
    let (c, _, err) = cli(&["task", "add", "noop", "--in", "1h", "--priority", "12"]);
    assert_ne!(c, Some(0));
    assert!(
        err.contains("priority must be an integer from 0 to 9"),
        "{err}"
    );

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

/// `key update` changes a key in place: what it gives replaces the key's own, `none` lifts a
/// limit, the secret stays, and the change reaches the runner within a second. Only an admin
/// changes a key (a team can't raise its own rights), a bad pattern is refused naming it, and a
/// key revoked meanwhile is never brought back.
#[tokio::test]
async fn key_update_changes_a_key_in_place_and_only_an_admin_may() {
    let redis = RedisServer::start();
    let r = start(&redis);
    let cli = |args: &[&str]| cli(&r.url, args);
    let (c, out, err) = cli(&[
        "key",
        "create",
        "payments",
        "--role",
        "developer",
        "--plugins",
        "pay-*",
        "--max-plugins",
        "3",
        "--json",
    ]);
    assert_eq!(c, Some(0), "{err}");
    let made: Value = serde_json::from_str(&out).unwrap();
    let (id, secret) = (made["id"].as_str().unwrap(), made["key"].as_str().unwrap());
    let publish = || async {
        let resp = reqwest::Client::new()
            .post(format!("{}/v1/events/payments", r.url))
            .bearer_auth(secret)
            .json(&json!({"key": "o1", "data": null}))
            .send()
            .await
            .unwrap();
        resp.status().as_u16()
    };
    assert_eq!(publish().await, 403, "the key may not publish yet");

    // a team can't change its own key (nor any other): keys are the admin's
    let resp = reqwest::Client::new()
        .patch(format!("{}/v1/keys/{id}", r.url))
        .bearer_auth(secret)
        .json(&json!({"publish": ["*"], "plugins": ["*"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403);

    let (c, out, err) = cli(&[
        "key",
        "update",
        id,
        "--publish",
        "payments",
        "--name",
        "payments-team",
        "--max-plugins",
        "none",
        "--max-pending",
        "700",
        "--json",
    ]);
    assert_eq!(c, Some(0), "{err}");
    let k: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&k["name"], &k["publish"], &k["max_pending"], &k["plugins"]),
        (
            &json!("payments-team"),
            &json!(["payments"]),
            &json!(700),
            &json!(["pay-*"])
        ),
        "{k}"
    );
    assert!(k.get("max_plugins").is_none(), "lifted: {k}");
    assert!(k.get("key").is_none(), "no secret in the answer: {k}");
    eventually(
        Duration::from_secs(1),
        "the runner to take the change",
        || async { (publish().await == 200).then_some(()) },
    )
    .await;

    // an empty list takes a right away again; a bad pattern is refused, naming it
    let (c, _, err) = cli(&["key", "update", id, "--publish", ""]);
    assert_eq!(c, Some(0), "{err}");
    let (c, _, err) = cli(&["key", "update", id, "--listen", "Bad Topic"]);
    assert_ne!(c, Some(0));
    assert!(err.contains("Bad Topic") && err.contains("listen"), "{err}");
    let (c, _, err) = cli(&["key", "update", id, "--max-pending=-1"]);
    assert_ne!(c, Some(0));
    assert!(err.contains("max_pending"), "{err}");
    eventually(
        Duration::from_secs(1),
        "the runner to take the change",
        || async { (publish().await == 403).then_some(()) },
    )
    .await;

    // a revoked key is not brought back by a change
    let (c, _, err) = cli(&["key", "revoke", id]);
    assert_eq!(c, Some(0), "{err}");
    let (c, _, err) = cli(&["key", "update", id, "--name", "back"]);
    assert_ne!(c, Some(0));
    assert!(err.contains("404"), "{err}");
    let (_, out, _) = cli(&["key", "list", "--json"]);
    assert_eq!(out.trim(), "[]", "{out}");
}

/// When the CLI asked, an error's advice names the CLI's commands and flags, not the API's routes
/// and query parameters; `plugin history` shows which version a rollback makes current.
#[tokio::test]
async fn cli_errors_advise_cli_commands_and_history_shows_the_rollback_target() {
    let redis = RedisServer::start();
    let r = start(&redis);
    let cli = |args: &[&str]| cli(&r.url, args);
    let ok = |args: &[&str]| {
        let (c, out, err) = cli(args);
        assert_eq!(c, Some(0), "{args:?}: {err}");
        out
    };
    let refused = |args: &[&str]| {
        let (c, _, err) = cli(args);
        assert_ne!(c, Some(0), "{args:?}");
        err
    };
    // one id in two plugins
    ok(&["task", "add", "noop", "--id", "dup", "--in", "1h"]);
    ok(&["task", "add", "noop-plain", "--id", "dup", "--in", "1h"]);
    let err = refused(&["task", "get", "dup"]);
    assert!(
        err.contains("name one with --plugin PLUGIN") && !err.contains("?plugin="),
        "{err}"
    );
    // a plugin with tasks
    let err = refused(&["plugin", "delete", "noop"]);
    assert!(
        err.contains("`eggtimer plugin delete noop --cancel-tasks`") && !err.contains("DELETE /v1"),
        "{err}"
    );
    ok(&["plugin", "delete", "noop", "--cancel-tasks"]);
    // a version the waiting task can't take
    ok(&[
        "task",
        "add",
        "order-cancel",
        "--id",
        "o1",
        "--in",
        "1h",
        "--payload",
        r#"{"order_id": "o1", "user_id": "u1"}"#,
    ]);
    let v2 = eggtimer_tests::workspace().join("target/plugins/order-cancel-v2.wasm");
    let err = refused(&["plugin", "push", "order-cancel", v2.to_str().unwrap()]);
    for said in [
        "o1",
        "`eggtimer plugin promote order-cancel 2`",
        "deploy it anyway with --force",
    ] {
        assert!(err.contains(said), "{said} missing from: {err}");
    }
    assert!(
        !err.contains("?force=true") && !err.contains("POST /v1"),
        "{err}"
    );
    ok(&["plugin", "promote", "order-cancel", "2", "--force"]);
    let history = ok(&["plugin", "history", "order-cancel"]);
    let line = |v: &str| {
        history
            .lines()
            .find(|l| l.split_whitespace().next() == Some(v))
            .unwrap_or_else(|| panic!("no v{v} in:\n{history}"))
            .to_owned()
    };
    assert!(line("2").contains("current"), "{history}");
    assert!(
        line("1").contains("previous (rollback target)"),
        "{history}"
    );
    let back: Value =
        serde_json::from_str(&ok(&["plugin", "rollback", "order-cancel", "--json"])).unwrap();
    assert_eq!(
        (&back["version"], &back["previous"]),
        (&json!(1), &json!(2)),
        "{back}"
    );
}

/// `cargo xtask token` makes a token file only its owner may read, never over an existing one,
/// and prints how to use it but not the token.
#[test]
fn xtask_token_makes_a_file_only_its_owner_reads() {
    use std::os::unix::fs::PermissionsExt;
    let file = eggtimer_tests::temp_dir("token").join("admin.token");
    let xtask = eggtimer_tests::workspace().join("target/debug/xtask");
    let run = || {
        std::process::Command::new(&xtask)
            .arg("token")
            .arg(&file)
            .output()
            .unwrap()
    };
    let out = run();
    assert!(out.status.success(), "{out:?}");
    let token = std::fs::read_to_string(&file).unwrap();
    let token = token.trim();
    assert!(
        token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "{token}"
    );
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("export EGGTIMER_TOKEN=") && !said.contains(token),
        "{said}"
    );
    let again = run();
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("exists"),
        "{again:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap().trim(),
        token,
        "kept"
    );
}

/// A port in use is said first, before a private redis-server starts or a plugin loads, with
/// the flag that moves it.
#[test]
fn a_port_in_use_is_said_before_redis_starts() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let data = eggtimer_tests::temp_dir("port-in-use");
    let out = std::process::Command::new(eggtimer_bin())
        .args(["serve", "--listen", &addr.to_string(), "--data-dir"])
        .arg(&data)
        .env_remove("EGGTIMER_REDIS")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let all = format!("{}{err}", String::from_utf8_lossy(&out.stdout));
    assert_ne!(out.status.code(), Some(0), "{all}");
    assert!(
        err.contains(&format!("{addr} is in use")) && err.contains("--listen"),
        "{all}"
    );
    assert!(
        !all.contains("redis-server"),
        "no redis-server was started: {all}"
    );
    assert_eq!(
        std::fs::read_dir(&data).map_or(0, Iterator::count),
        0,
        "nothing was written into the data directory"
    );
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
