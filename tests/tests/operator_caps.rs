//! The operator's caps on a plugin's own settings: a developer's key may set `time_limit_ms`,
//! `memory_bytes` and `max_pending` within `--max-plugin-timeout`, `--max-plugin-memory` and the
//! default quota; only the admin past them. Real runner processes, real plugins, a real
//! redis-server.

use eggtimer_tests::as_key::{ADMIN, make_key, req, upload_as, wait_state};
use eggtimer_tests::{RedisServer, RunnerProcess, plugin_wasm};
use serde_json::{Value, json};

#[tokio::test]
async fn a_plugins_own_time_limit_stays_within_the_operators_cap_unless_an_admin_sets_it() {
    let redis = RedisServer::start();
    let r = RunnerProcess::start(
        &redis.url(),
        &[
            "--token",
            ADMIN,
            "--plugin-timeout",
            "1s",
            "--max-plugin-timeout",
            "5s",
        ],
    );
    let base = r.url.as_str();
    let (s, _) = upload_as(base, ADMIN, "test-sleep", plugin_wasm("test-sleep")).await;
    assert_eq!(s, 201);
    let (_, dev) = make_key(base, "team-sleep", "developer", &["test-*"]).await;
    let patch = |key: String, ms: Value| async move {
        req(
            "PATCH",
            &format!("{base}/v1/plugins/test-sleep"),
            Some(&key),
            Some(json!({"time_limit_ms": ms})),
        )
        .await
    };
    // past the operator's cap: 400 naming the field for a developer, allowed for an admin
    let (s, e) = patch(dev.clone(), json!(6_000)).await;
    assert_eq!(s, 400, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("time_limit_ms 6000 is past"),
        "{e}"
    );
    let (s, p) = patch(ADMIN.to_owned(), json!(6_000)).await;
    assert_eq!((s, &p["time_limit_ms"]), (200, &json!(6_000)), "{p}");
    // within it, a developer's own: a run of 300 ms fails under 200 ms, one of 1.5 s (over the
    // runner's 1 s) passes under 3 s
    let (s, _) = patch(dev.clone(), json!(200)).await;
    assert_eq!(s, 200);
    let sleep = |id: &str, ms: u64| json!({"plugin": "test-sleep", "id": id, "max_attempts": 1, "payload": {"ms": ms, "tag": id}});
    let (s, _) = req(
        "POST",
        &format!("{base}/v1/tasks"),
        Some(&dev),
        Some(sleep("short", 300)),
    )
    .await;
    assert_eq!(s, 201);
    let t = wait_state(base, "short", "dead").await;
    assert!(
        t["last_error"]
            .as_str()
            .unwrap()
            .contains("time limit of 200ms"),
        "{t}"
    );
    let (s, _) = patch(dev.clone(), json!(3_000)).await;
    assert_eq!(s, 200);
    let (s, _) = req(
        "POST",
        &format!("{base}/v1/tasks"),
        Some(&dev),
        Some(sleep("long", 1_500)),
    )
    .await;
    assert_eq!(s, 201);
    wait_state(base, "long", "done").await;
    // null: the runner's own limit again
    let (s, p) = patch(dev, Value::Null).await;
    assert_eq!((s, &p["time_limit_ms"]), (200, &Value::Null), "{p}");
}

#[tokio::test]
async fn a_plugins_own_memory_cap_counts_and_stays_within_the_operators_cap_unless_an_admin_sets_it()
 {
    let redis = RedisServer::start();
    let r = RunnerProcess::start(
        &redis.url(),
        &[
            "--token",
            ADMIN,
            "--plugin-memory",
            "33554432",
            "--max-plugin-memory",
            "67108864",
        ],
    );
    let base = r.url.as_str();
    let (s, _) = upload_as(base, ADMIN, "test-alloc", plugin_wasm("test-alloc")).await;
    assert_eq!(s, 201);
    let (_, dev) = make_key(base, "team-alloc", "developer", &["test-*"]).await;
    let patch = |key: String, bytes: Value| async move {
        req(
            "PATCH",
            &format!("{base}/v1/plugins/test-alloc"),
            Some(&key),
            Some(json!({"memory_bytes": bytes})),
        )
        .await
    };
    // test-alloc allocates 1 MiB at a time until it is stopped: the cap that stops it says
    // what it held then
    let run = |id: &'static str| {
        let dev = dev.clone();
        async move {
            let spec = json!({"plugin": "test-alloc", "id": id, "max_attempts": 1});
            let (s, _) = req("POST", &format!("{base}/v1/tasks"), Some(&dev), Some(spec)).await;
            assert_eq!(s, 201);
            let t = wait_state(base, id, "dead").await;
            t["last_error"].as_str().unwrap().to_owned()
        }
    };
    let held = |err: &str| -> u64 {
        let (_, rest) = err.split_once("it held ").expect(err);
        rest.split(' ').next().unwrap().parse().expect(err)
    };
    let err = run("runners-cap").await;
    assert!(err.contains("memory limit of 32 MiB"), "{err}");
    assert!((24..=32).contains(&held(&err)), "{err}");
    // past the operator's cap: 400 naming the field for a developer, allowed for an admin
    let (s, e) = patch(dev.clone(), json!(96 << 20)).await;
    assert_eq!(s, 400, "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.starts_with("memory_bytes 100663296 is past"), "{e}");
    assert!(msg.contains("--max-plugin-memory"), "{e}");
    let (s, p) = patch(ADMIN.to_owned(), json!(96 << 20)).await;
    assert_eq!((s, &p["memory_bytes"]), (200, &json!(96 << 20)), "{p}");
    let err = run("admins-cap").await;
    assert!(err.contains("memory limit of 96 MiB"), "{err}");
    assert!((88..=96).contains(&held(&err)), "{err}");
    // within it, a developer's own
    let (s, _) = patch(dev.clone(), json!(48 << 20)).await;
    assert_eq!(s, 200);
    let err = run("own-cap").await;
    assert!(err.contains("memory limit of 48 MiB"), "{err}");
    assert!((40..=48).contains(&held(&err)), "{err}");
    let (s, e) = patch(dev.clone(), json!(1000)).await;
    assert_eq!(s, 400, "{e}");
    // null: the runner's own cap again
    let (s, p) = patch(dev.clone(), Value::Null).await;
    assert_eq!((s, &p["memory_bytes"]), (200, &Value::Null), "{p}");
    let err = run("back-to-runners").await;
    assert!(err.contains("memory limit of 32 MiB"), "{err}");
    // max_pending: a developer may lower it, only an admin raise it past the default
    let pending = |key: String, max: Value| async move {
        let body = json!({"max_pending": max});
        let url = format!("{base}/v1/plugins/test-alloc");
        req("PATCH", &url, Some(&key), Some(body)).await
    };
    let (s, p) = pending(dev.clone(), json!(500)).await;
    assert_eq!((s, &p["max_pending"]), (200, &json!(500)), "{p}");
    let (s, e) = pending(dev.clone(), json!(2_000_000)).await;
    assert_eq!(s, 400, "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.starts_with("max_pending 2000000 is past"), "{e}");
    let (s, p) = pending(ADMIN.to_owned(), json!(2_000_000)).await;
    assert_eq!((s, &p["max_pending"]), (200, &json!(2_000_000)), "{p}");
}
