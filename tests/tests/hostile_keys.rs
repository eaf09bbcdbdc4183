//! Teams that don't trust each other: what one key's plugins may hold together. An admin gives a
//! key `max_plugins` (it uploads no new plugin past it) and `max_pending` (the tasks its plugins
//! hold together: each plugin it uploads gets its share as the ceiling of its own `max_pending`).
//! Before, a prefix key could create any number of plugins, each with the default quota, and
//! fill Redis for every team. A real runner process and a real redis-server.

use eggtimer_tests::as_key::{ADMIN, make_key, req, upload_as};
use eggtimer_tests::{RedisServer, RunnerProcess, plugin_wasm};
use serde_json::{Value, json};

/// GET /v1/plugins/{name} as the admin.
async fn plugin(base: &str, name: &str) -> Value {
    let (s, p) = req(
        "GET",
        &format!("{base}/v1/plugins/{name}"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(s, 200, "{p}");
    p
}

#[tokio::test]
async fn a_keys_plugins_hold_no_more_than_its_max_plugins_and_max_pending() {
    let redis = RedisServer::start();
    let r = RunnerProcess::start(&redis.url(), &["--token", ADMIN]);
    let base = r.url.as_str();
    let noop = plugin_wasm("noop");
    let (s, k) = req(
        "POST",
        &format!("{base}/v1/keys"),
        Some(ADMIN),
        Some(
            json!({"name": "orders", "role": "developer", "plugins": ["order-*"],
            "max_plugins": 2, "max_pending": 30}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{k}");
    assert_eq!(
        (k["max_plugins"].as_u64(), k["max_pending"].as_u64()),
        (Some(2), Some(30))
    );
    let (orders_id, orders) = (k["id"].as_str().unwrap(), k["key"].as_str().unwrap());

    // each of its two plugins gets half of its 30 as the ceiling of its max_pending
    for name in ["order-a", "order-b"] {
        let (s, up) = upload_as(base, orders, name, noop.clone()).await;
        assert_eq!(s, 201, "{up}");
        let p = plugin(base, name).await;
        assert_eq!(p["ceilings"]["max_pending"], 15, "{p}");
        assert_eq!(p["max_pending"], 15, "{p}");
        // whose upload it was: its compiles take that key's turns
        assert_eq!(p["uploaded_by"], orders_id, "{p}");
    }
    // the ceiling holds for the tasks: 15 of order-a's, not 16
    let tasks: Vec<Value> = (0..16)
        .map(|i| json!({"plugin": "order-a", "id": format!("t{i}"), "delay_ms": 600_000}))
        .collect();
    let (s, e) = req(
        "POST",
        &format!("{base}/v1/tasks"),
        Some(orders),
        Some(json!(tasks)),
    )
    .await;
    assert_eq!(s, 429, "{e}");
    // and the developer can't raise it past the ceiling
    let (s, p) = req(
        "PATCH",
        &format!("{base}/v1/plugins/order-a"),
        Some(orders),
        Some(json!({"max_pending": 1000})),
    )
    .await;
    assert_eq!(s, 403, "{p}");
    assert_eq!(plugin(base, "order-a").await["max_pending"], 15);

    // a third plugin: refused, naming the key's max_plugins; a new version of one it has is not
    let (s, e) = upload_as(base, orders, "order-c", noop.clone()).await;
    assert_eq!(s, 403, "{e}");
    assert_eq!(e["error"]["code"], "key_limit", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_plugins"),
        "{e}"
    );
    let (s, _) = req(
        "GET",
        &format!("{base}/v1/plugins/order-c"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(s, 404);
    let (s, up) = upload_as(base, orders, "order-a", plugin_wasm("test-sleep")).await;
    assert_eq!(s, 201, "a new version: {up}");
    // a delete makes room
    let (s, e) = req(
        "DELETE",
        &format!("{base}/v1/plugins/order-b"),
        Some(orders),
        None,
    )
    .await;
    assert!(s == 200 || s == 204, "{s} {e}");
    let (s, up) = upload_as(base, orders, "order-c", noop.clone()).await;
    assert_eq!(s, 201, "{up}");

    // a key with a max_pending and no max_plugins: its first plugin takes what is left, the next
    // is refused until the first's max_pending is lowered (which lowers its ceiling: the share
    // goes back to the key)
    let (s, k) = req(
        "POST",
        &format!("{base}/v1/keys"),
        Some(ADMIN),
        Some(json!({"name": "coupons", "role": "developer", "plugins": ["coupon-*"], "max_pending": 10})),
    )
    .await;
    assert_eq!(s, 201, "{k}");
    let coupons = k["key"].as_str().unwrap();
    let (s, up) = upload_as(base, coupons, "coupon-a", noop.clone()).await;
    assert_eq!(s, 201, "{up}");
    assert_eq!(plugin(base, "coupon-a").await["max_pending"], 10);
    let (s, e) = upload_as(base, coupons, "coupon-b", noop.clone()).await;
    assert_eq!(s, 403, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_pending"),
        "{e}"
    );
    let (s, p) = req(
        "PATCH",
        &format!("{base}/v1/plugins/coupon-a"),
        Some(coupons),
        Some(json!({"max_pending": 4})),
    )
    .await;
    assert_eq!(s, 200, "{p}");
    let (s, up) = upload_as(base, coupons, "coupon-b", noop.clone()).await;
    assert_eq!(s, 201, "{up}");
    assert_eq!(plugin(base, "coupon-b").await["ceilings"]["max_pending"], 6);
    // lowering gave the share back: set back to its default, coupon-a holds what it kept (4),
    // not the 10 it was lent first (0.2.0 charged the key the current value, so lowering,
    // uploading and setting back lent the same budget out twice)
    let (s, p) = req(
        "PATCH",
        &format!("{base}/v1/plugins/coupon-a"),
        Some(coupons),
        Some(json!({"max_pending": null})),
    )
    .await;
    assert_eq!(s, 200, "{p}");
    assert_eq!(
        (&p["max_pending"], &p["ceilings"]["max_pending"]),
        (&json!(4), &json!(4)),
        "{p}"
    );

    // a key without ceilings of its own uploads as before: no ceiling given
    let (_, plain) = make_key(base, "prints", "developer", &["print-*"]).await;
    let (s, up) = upload_as(base, &plain, "print-a", noop).await;
    assert_eq!(s, 201, "{up}");
    assert_eq!(plugin(base, "print-a").await["ceilings"], json!({}));
}
