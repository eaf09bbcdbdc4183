//! Dry runs with a real runner, real plugins and a real redis-server: a dead letter run against a
//! fixed candidate says `done` and applies nothing (the task, kv entries, event streams stay as
//! they were; the candidate stays a candidate); a dry run's HTTP requests are recorded, never
//! sent (a listening socket sees no connection), answered from canned answers; secrets read as
//! placeholders; and the CLI runs a stored task against a local build.

use std::collections::BTreeMap;
use std::time::Duration;

use eggtimer_tests::guests::guest_runner;
use eggtimer_tests::{
    RedisServer, call, eggtimer_bin, eventually, plugin_wasm, plugins_dir, post_tasks, upload,
    wait_state,
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

/// Every task record, kv entry and event stream in Redis, as DUMP bytes by key: what a dry run
/// must leave as it was (runner heartbeats and leases are left out: they change on their own).
fn data(redis: &RedisServer) -> BTreeMap<String, Vec<u8>> {
    let mut conn = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    keys.into_iter()
        .filter(|k| {
            k.ends_with(":tasks")
                || k.ends_with(":dead")
                || k.contains(":kv")
                || k.contains(":events:")
        })
        .map(|k| {
            let v: Vec<u8> = redis::cmd("DUMP").arg(&k).query(&mut conn).unwrap();
            (k, v)
        })
        .collect()
}

async fn dry_run(base: &str, id: &str, body: Value) -> Value {
    let (s, r) = call("POST", &format!("{base}/v1/tasks/{id}/dry-run"), Some(body)).await;
    assert_eq!(s, 200, "{r}");
    r
}

#[tokio::test]
async fn a_dead_letter_dry_run_against_a_fixed_candidate_applies_nothing() {
    let redis = RedisServer::start();
    let r = guest_runner(&redis);
    let base = r.url.as_str();
    // v1 of `orders` panics: its task is dead after its one attempt
    let (s, up) = upload(base, "orders", plugin_wasm("test-panic")).await;
    assert_eq!(s, 201, "{up}");
    post_tasks(
        base,
        json!({"id": "o1", "plugin": "orders", "max_attempts": 1,
            "payload": {"order_id": "o1", "user_id": "u1"}}),
    )
    .await;
    wait_state(base, "o1", "dead", T).await;
    // the fix as a candidate (order-cancel's code)
    let (s, up) = upload(base, "orders?promote=false", plugin_wasm("order-cancel")).await;
    assert_eq!((s, &up["candidate"]), (201, &json!(true)), "{up}");

    let before = data(&redis);
    let r2 = dry_run(base, "o1", json!({"version": 2})).await;
    assert_eq!(r2["outcome"], json!({"done": true}), "{r2}");
    assert_eq!(r2["version"], 2, "{r2}");
    let fx = &r2["effects"];
    assert_eq!(fx["kv"][0]["set"], "cancelled:o1", "{r2}");
    assert_eq!(fx["events"][0]["topic"], "order", "{r2}");
    assert_eq!(fx["events"][0]["data"]["order_id"], "o1", "{r2}");
    assert!(r2["took_ms"].as_f64().unwrap() > 0.0, "{r2}");
    // against the current version: what killed it
    let r1 = dry_run(base, "o1", json!({})).await;
    assert_eq!(r1["version"], 1, "{r1}");
    assert!(r1["outcome"]["error"].is_string(), "{r1}");
    assert_eq!(data(&redis), before, "a dry run writes nothing");
    let (_, t) = call("GET", &format!("{base}/v1/tasks/o1"), None).await;
    assert_eq!(
        (&t["state"], &t["attempts"]),
        (&json!("dead"), &json!(1)),
        "{t}"
    );
    let (_, p) = call("GET", &format!("{base}/v1/plugins/orders"), None).await;
    assert_eq!(p["version"], 1, "the candidate is still a candidate: {p}");

    // then the fix for real: promote, retry, done
    let (s, e) = call(
        "POST",
        &format!("{base}/v1/plugins/orders/promote"),
        Some(json!({"version": 2})),
    )
    .await;
    assert_eq!(s, 200, "{e}");
    let (s, e) = call("POST", &format!("{base}/v1/dead/o1/retry"), None).await;
    assert!(s < 300, "{e}");
    let t = wait_state(base, "o1", "done", T).await;
    assert!(
        t["last_error"].is_null(),
        "a retried task that then succeeds shows no error of before its retry: {t}"
    );
}

#[tokio::test]
async fn a_dry_runs_http_requests_are_recorded_not_sent_and_secrets_stay_hidden() {
    // a port that listens: a request sent to it would be seen as a connection
    let receiver = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    receiver.set_nonblocking(true).unwrap();
    let port = receiver.local_addr().unwrap().port();
    let redis = RedisServer::start();
    let r = guest_runner(&redis);
    let base = r.url.as_str();
    let (s, b) = call(
        "PATCH",
        &format!("{base}/v1/plugins/webhook"),
        Some(json!({"allowed_hosts": [format!("http://127.0.0.1:{port}")]})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = call(
        "PUT",
        &format!("{base}/v1/plugins/webhook/secrets/signing_key"),
        Some(json!({"value": "whsec-real-value"})),
    )
    .await;
    assert_eq!(s, 204, "{b}");
    let url = format!("http://127.0.0.1:{port}/in");
    post_tasks(
        base,
        json!({"id": "wh1", "plugin": "webhook", "delay_ms": 3_600_000,
            "payload": {"url": url, "body": {"state": "cancelled"}}}),
    )
    .await;
    // once the runner applies allowed_hosts, the request is recorded, and answered "dry run"
    let r1 = eventually(T, "a dry run's request to be recorded", || async {
        let r = dry_run(base, "wh1", json!({})).await;
        (r["effects"]["http"][0]["url"] == url.as_str()).then_some(r)
    })
    .await;
    let err = r1["outcome"]["error"].as_str().unwrap_or_default();
    assert!(err.contains("dry run"), "{r1}");
    let req = &r1["effects"]["http"][0];
    assert_eq!(req["method"], "POST", "{r1}");
    assert_eq!(req["body"], r#"{"state":"cancelled"}"#, "{r1}");
    assert!(
        !r1.to_string().contains("whsec-real-value"),
        "a dry run never hands out a secret: {r1}"
    );
    // a canned answer: the delivery is done
    let r2 = dry_run(
        base,
        "wh1",
        json!({"http": [{"status": 200, "body": "ok"}]}),
    )
    .await;
    assert_eq!(r2["outcome"], json!({"done": true}), "{r2}");
    // nothing ever connected
    assert_eq!(
        receiver.accept().map(|_| ()).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "no request was sent"
    );
    let (_, t) = call("GET", &format!("{base}/v1/tasks/wh1"), None).await;
    assert_eq!(
        (&t["state"], &t["attempts"]),
        (&json!("scheduled"), &json!(0)),
        "{t}"
    );
}

#[tokio::test]
async fn the_cli_runs_a_stored_task_against_a_local_build() {
    let redis = RedisServer::start();
    let r = guest_runner(&redis);
    let base = r.url.as_str();
    post_tasks(
        base,
        json!({"id": "o2", "plugin": "order-cancel", "delay_ms": 3_600_000,
            "payload": {"order_id": "o2", "user_id": "u2"}}),
    )
    .await;
    let local = |wasm: &str| {
        let path = plugins_dir().join(wasm);
        let out = std::process::Command::new(eggtimer_bin())
            .args(["task", "dry-run", "o2", "--wasm", path.to_str().unwrap()])
            .args(["--url", base])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let fixed = local("order-cancel.wasm");
    assert_eq!(fixed["outcome"], json!({"done": true}), "{fixed}");
    assert_eq!(
        fixed["effects"]["events"][0]["data"]["order_id"], "o2",
        "{fixed}"
    );
    let broken = local("test-panic.wasm");
    assert!(broken["outcome"]["error"].is_string(), "{broken}");
    let (_, t) = call("GET", &format!("{base}/v1/tasks/o2"), None).await;
    assert_eq!(t["state"], "scheduled", "nothing ran remotely: {t}");
}
