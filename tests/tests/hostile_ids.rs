//! A task id belongs to its plugin: what the `orders` team's key tries with the ids of the
//! `coupons` team's tasks (scheduled, dead, running, in a dedup window, a schedule's firings), on a
//! real runner process and a real redis-server. Before, each of these replaced, blocked or
//! revealed the other team's task.

use std::time::Duration;

use eggtimer_tests::as_key::{ADMIN, make_key, req, upload_as, wait_state};
use eggtimer_tests::{RedisServer, RunnerProcess, eventually, now_ms, plugin_wasm, plugins_dir};
use serde_json::{Value, json};

/// A runner with a token loading the Rust plugins, the admin's uploads of two more `coupon-*`
/// plugins (one that panics, one that sleeps), and the two teams' developer keys.
async fn two_teams(redis: &RedisServer) -> (RunnerProcess, String, String) {
    let dir = plugins_dir();
    let r = RunnerProcess::start(
        &redis.url(),
        &[
            "--token",
            ADMIN,
            "--plugins-dir",
            dir.to_str().unwrap(),
            "--retry-base",
            "50ms",
        ],
    );
    for (name, wasm) in [
        ("coupon-panic", "test-panic"),
        ("coupon-sleep", "test-sleep"),
    ] {
        let (s, b) = upload_as(&r.url, ADMIN, name, plugin_wasm(wasm)).await;
        assert_eq!(s, 201, "{b}");
    }
    let (_, orders) = make_key(&r.url, "orders", "developer", &["order-*"]).await;
    let (_, coupons) = make_key(&r.url, "coupons", "developer", &["coupon-*"]).await;
    (r, orders, coupons)
}

fn order(id: &str, run_at: i64) -> Value {
    json!({"plugin": "order-cancel", "id": id, "run_at": run_at,
        "payload": {"order_id": "o1", "user_id": "u1"}})
}

fn coupon(id: &str, run_at: i64) -> Value {
    json!({"plugin": "coupon-expiry", "id": id, "run_at": run_at, "owner": "u7",
        "payload": {"coupon_id": "c1", "user_id": "u7", "expires_at": run_at + 7_200_000}})
}

async fn post(base: &str, key: &str, spec: Value) -> (u16, Value) {
    req("POST", &format!("{base}/v1/tasks"), Some(key), Some(spec)).await
}

#[tokio::test]
async fn another_teams_task_ids_can_be_neither_replaced_nor_blocked_nor_seen() {
    let redis = RedisServer::start();
    let (r, orders, coupons) = two_teams(&redis).await;
    let base = r.url.as_str();
    let far = now_ms() + 3_600_000;

    // a scheduled task: the same id from the other team is a task of its own
    assert_eq!(post(base, &coupons, coupon("c-1", far)).await.0, 201);
    let (s, b) = post(base, &orders, order("c-1", far + 5)).await;
    assert_eq!(s, 201, "{b}");
    let (s, t) = req("GET", &format!("{base}/v1/tasks/c-1"), Some(&coupons), None).await;
    assert_eq!(
        (s, t["plugin"].as_str(), t["run_at"].as_i64()),
        (200, Some("coupon-expiry"), Some(far)),
        "{t}"
    );
    let (s, t) = req("GET", &format!("{base}/v1/tasks/c-1"), Some(&orders), None).await;
    assert_eq!(
        (s, t["plugin"].as_str()),
        (200, Some("order-cancel")),
        "{t}"
    );
    let (s, owned) = req(
        "GET",
        &format!("{base}/v1/owners/u7/tasks"),
        Some(&coupons),
        None,
    )
    .await;
    assert_eq!(
        (s, owned.as_array().map(Vec::len)),
        (200, Some(1)),
        "{owned}"
    );
    // a key that sees both plugins names the one it means
    let (s, e) = req("GET", &format!("{base}/v1/tasks/c-1"), Some(ADMIN), None).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (409, Some("ambiguous_id")),
        "{e}"
    );
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("coupon-expiry, order-cancel"),
        "{e}"
    );
    let (s, t) = req(
        "GET",
        &format!("{base}/v1/tasks/c-1?plugin=coupon-expiry"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(
        (s, t["plugin"].as_str()),
        (200, Some("coupon-expiry")),
        "{t}"
    );
    // naming the other team's plugin is refused whether or not it has the id
    for id in ["c-1", "no-such-id"] {
        for (method, path) in [
            ("GET", format!("/v1/tasks/{id}?plugin=coupon-expiry")),
            ("DELETE", format!("/v1/tasks/{id}?plugin=coupon-expiry")),
            ("POST", format!("/v1/tasks/{id}/run?plugin=coupon-expiry")),
        ] {
            let (s, e) = req(method, &format!("{base}{path}"), Some(&orders), None).await;
            assert_eq!(s, 403, "{method} {path}: {e}");
        }
    }
    // its cancel and run-now reach its own task only
    let (s, e) = req(
        "DELETE",
        &format!("{base}/v1/tasks/c-1"),
        Some(&orders),
        None,
    )
    .await;
    assert_eq!(s, 204, "{e}");
    let (s, e) = req(
        "DELETE",
        &format!("{base}/v1/tasks/c-1"),
        Some(&orders),
        None,
    )
    .await;
    assert_eq!(s, 404, "{e}");
    let (s, t) = req("GET", &format!("{base}/v1/tasks/c-1"), Some(&coupons), None).await;
    assert_eq!((s, t["state"].as_str()), (200, Some("scheduled")), "{t}");

    // a dead letter: the same id from the other team leaves it dead and listed
    let (s, b) = post(
        base,
        &coupons,
        json!({"plugin": "coupon-panic", "id": "d-1", "max_attempts": 1}),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    wait_state(base, "d-1", "dead").await;
    assert_eq!(post(base, &orders, order("d-1", far)).await.0, 201);
    let (s, dead) = req("GET", &format!("{base}/v1/dead"), Some(&coupons), None).await;
    assert_eq!(s, 200, "{dead}");
    let ids: Vec<&str> = dead["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["d-1"], "{dead}");
    // the orders team's drop names its own d-1, which is not dead
    let (s, e) = req(
        "DELETE",
        &format!("{base}/v1/dead/d-1"),
        Some(&orders),
        None,
    )
    .await;
    assert_eq!(s, 409, "{e}");
    let (s, t) = req("GET", &format!("{base}/v1/tasks/d-1"), Some(&coupons), None).await;
    assert_eq!((s, t["state"].as_str()), (200, Some("dead")), "{t}");

    // a dedup window: the other team's id is not squatted
    let (s, b) = post(
        base,
        &orders,
        json!({"plugin": "order-cancel", "id": "u-1", "unique_for_ms": 3_600_000,
            "payload": {"order_id": "o2", "user_id": "u1"}}),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    eventually(
        Duration::from_secs(60),
        "u-1 of orders to be done",
        || async {
            let (s, t) = req("GET", &format!("{base}/v1/tasks/u-1"), Some(&orders), None).await;
            (s == 200 && t["state"] == "done").then_some(())
        },
    )
    .await;
    let (s, b) = post(base, &coupons, coupon("u-1", far)).await;
    assert_eq!(s, 201, "the coupons team's first u-1: {b}");
    let (s, e) = post(
        base,
        &orders,
        json!({"plugin": "order-cancel", "id": "u-1", "payload": {"order_id": "o2", "user_id": "u1"}}),
    )
    .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (409, Some("duplicate")),
        "its own window holds: {e}"
    );

    // a running task: no "is running" answer for the other team's id
    let (s, b) = post(
        base,
        &coupons,
        json!({"plugin": "coupon-sleep", "id": "run-1", "payload": {"ms": 3000, "tag": "x"}}),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    eventually(Duration::from_secs(60), "run-1 to be running", || async {
        let (s, t) = req(
            "GET",
            &format!("{base}/v1/tasks/run-1"),
            Some(&coupons),
            None,
        )
        .await;
        (s == 200 && t["state"] == "running").then_some(())
    })
    .await;
    let (s, b) = post(base, &orders, order("run-1", far)).await;
    assert_eq!(s, 201, "{b}");
}

/// Before, the `orders` team pre-created `<schedule>@<due ms>` ids and the `coupons` team's
/// recurring schedule skipped those firings.
#[tokio::test]
async fn another_teams_ids_do_not_take_a_schedules_firings() {
    let redis = RedisServer::start();
    let (r, orders, coupons) = two_teams(&redis).await;
    let base = r.url.as_str();
    let (s, b) = req(
        "PUT",
        &format!("{base}/v1/schedules/tick"),
        Some(&coupons),
        Some(json!({"plugin": "coupon-expiry", "every_ms": 2000,
            "payload": {"coupon_id": "c1", "user_id": "u7", "expires_at": now_ms() + 86_400_000}})),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    let next = b["next_run_at"].as_i64().unwrap();
    // the next ten firings' ids, taken first
    let specs: Vec<Value> = (0..10)
        .map(|i| order(&format!("tick@{}", next + i * 2000), next + 3_600_000))
        .collect();
    let (s, b) = post(base, &orders, Value::Array(specs)).await;
    assert_eq!(s, 201, "{b}");
    let first = format!("tick@{next}");
    eventually(
        Duration::from_secs(60),
        "the schedule's first firing to be done",
        || async {
            let (s, t) = req(
                "GET",
                &format!("{base}/v1/tasks/{first}"),
                Some(&coupons),
                None,
            )
            .await;
            (s == 200 && t["state"] == "done").then_some(())
        },
    )
    .await;
    let (s, t) = req(
        "GET",
        &format!("{base}/v1/tasks/{first}"),
        Some(&orders),
        None,
    )
    .await;
    assert_eq!((s, t["state"].as_str()), (200, Some("scheduled")), "{t}");
}
