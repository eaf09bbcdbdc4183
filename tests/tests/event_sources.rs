//! Events from outside, with a real runner and a real redis-server: a team's own Redis Stream read
//! through a source (a consumer group; an entry acknowledged once its event's effects are
//! recorded), only into a topic the key may publish to and never from eggtimer's own keys; and
//! the CLI's `event send|list` and `source add|list|remove`.

use std::time::Duration;

use eggtimer_tests::as_key::{ADMIN, req, upload_as};
use eggtimer_tests::events::{listening, recorder_runner, runs};
use eggtimer_tests::{RedisServer, eggtimer_bin, eventually, plugin_wasm};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

async fn admin(method: &str, base: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    req(method, &format!("{base}{path}"), Some(ADMIN), body).await
}

fn xadd(redis: &RedisServer, stream: &str, fields: &[(&str, &str)]) {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg("*");
    for (f, v) in fields {
        cmd.arg(f).arg(v);
    }
    let _: String = cmd.query(&mut redis.conn()).unwrap();
}

#[tokio::test]
async fn a_teams_stream_read_through_a_source_reaches_the_tasks_listening() {
    let redis = RedisServer::start();
    let r = recorder_runner(&redis).await;
    let base = r.url.as_str();
    // the payments team's stream, with an entry from before the source: not read
    xadd(&redis, "payments", &[("order_id", "o0"), ("amount", "1")]);
    let (s, k) = admin(
        "POST",
        base,
        "/v1/keys",
        Some(json!({"name": "payments", "role": "developer",
        "plugins": ["payments-*"], "publish": ["payments"], "streams": ["payments*"]})),
    )
    .await;
    assert_eq!(s, 201, "{k}");
    assert_eq!(k["streams"], json!(["payments*"]), "{k}");
    let payments = k["key"].as_str().unwrap().to_owned();
    // a stream the grant covers but that is not there: refused, and nothing is made by asking;
    // a key of another type: refused without Redis's words
    let set = |key: &str| {
        let () = redis::cmd("SET")
            .arg(key)
            .arg("x")
            .query(&mut redis.conn())
            .unwrap();
    };
    set("payments-flag");
    for (stream, says) in [
        ("payments-missing", "there is no stream"),
        ("payments-flag", "is not a stream"),
    ] {
        let (s, e) = req(
            "POST",
            &format!("{base}/v1/sources"),
            Some(&payments),
            Some(json!({"name": "p2", "stream": stream, "key_field": "id", "topic": "payments"})),
        )
        .await;
        assert_eq!(s, 422, "{e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(says) && !message.contains("WRONGTYPE"),
            "{e}"
        );
    }
    let made: u64 = redis::cmd("EXISTS")
        .arg("payments-missing")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(made, 0, "asking made the stream");
    let source = json!({"name": "payments", "stream": "payments", "key_field": "order_id", "topic": "payments"});
    let (s, src) = req(
        "POST",
        &format!("{base}/v1/sources"),
        Some(&payments),
        Some(source),
    )
    .await;
    assert_eq!(s, 201, "{src}");

    for (id, then) in [("o0", "cancel"), ("o1", "cancel"), ("o2", "run")] {
        let (s, e) = admin(
            "POST",
            base,
            "/v1/tasks",
            Some(listening(id, "payments", id, then)),
        )
        .await;
        assert_eq!(s, 201, "{e}");
    }
    xadd(&redis, "payments", &[("order_id", "o1"), ("amount", "5")]);
    xadd(&redis, "payments", &[("order_id", "o2"), ("amount", "7")]);
    xadd(&redis, "payments", &[("amount", "9")]); // no key field: acknowledged, nothing published
    eventually(T, "o1 cancelled by the stream's entry", || async {
        let (s, _) = admin("GET", base, "/v1/tasks/o1", None).await;
        (s == 404).then_some(())
    })
    .await;
    let run = eventually(T, "o2 run by the stream's entry", || async {
        runs(&redis).remove("o2").map(|mut v| v.remove(0))
    })
    .await;
    assert_eq!(
        run["event"]["data"],
        json!({"order_id": "o2", "amount": "7"}),
        "{run}"
    );
    // every entry read is acknowledged (nothing pending in the group)
    eventually(T, "the group to have nothing pending", || async {
        let v: redis::Value = redis::cmd("XPENDING")
            .arg("payments")
            .arg("eggtimer:eggtimer:payments")
            .query(&mut redis.conn())
            .unwrap();
        let redis::Value::Array(v) = v else {
            return None;
        };
        (v.first() == Some(&redis::Value::Int(0))).then_some(())
    })
    .await;
    // the entry from before the source was not read: o0 still waits
    let (s, _) = admin("GET", base, "/v1/tasks/o0", None).await;
    assert_eq!(s, 200);

    // a key may only feed a topic it may publish to, and never from eggtimer's own keys
    let (_, k) = admin(
        "POST",
        base,
        "/v1/keys",
        Some(json!({"name": "coupons", "role": "developer",
        "plugins": ["coupon-*"], "publish": ["coupons"]})),
    )
    .await;
    let coupons = k["key"].as_str().unwrap().to_owned();
    let steal = json!({"name": "steal", "stream": "payments", "key_field": "order_id", "topic": "payments"});
    let (s, e) = req(
        "POST",
        &format!("{base}/v1/sources"),
        Some(&coupons),
        Some(steal),
    )
    .await;
    assert_eq!(s, 403, "{e}");
    // nor read another team's stream into a topic of its own: a stream is read only where an
    // admin granted the key (0.2.0 read any stream, card numbers and all)
    let (s, e) = req(
        "POST",
        &format!("{base}/v1/sources"),
        Some(&coupons),
        Some(json!({"name": "peek", "stream": "payments", "key_field": "order_id", "topic": "coupons"})),
    )
    .await;
    assert_eq!(s, 403, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("may not read stream"),
        "{e}"
    );
    let spy = json!({"name": "spy", "stream": "{eggtimer}:events:bench-record:bench", "key_field": "id", "topic": "coupons"});
    let (s, e) = req(
        "POST",
        &format!("{base}/v1/sources"),
        Some(&coupons),
        Some(spy),
    )
    .await;
    assert_eq!(s, 403, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("eggtimer's own keys"),
        "{e}"
    );
    // nor remove another team's source
    let (s, _) = req(
        "DELETE",
        &format!("{base}/v1/sources/payments"),
        Some(&coupons),
        None,
    )
    .await;
    assert_eq!(s, 403);
    let (_, list) = req("GET", &format!("{base}/v1/sources"), Some(&coupons), None).await;
    assert_eq!(list, json!([]), "another team's sources are not listed");
    let (s, _) = req(
        "DELETE",
        &format!("{base}/v1/sources/payments"),
        Some(&payments),
        None,
    )
    .await;
    assert_eq!(s, 204);
    let (_, list) = admin("GET", base, "/v1/sources", None).await;
    assert_eq!(list, json!([]));
}

/// What a plugin emits drives the tasks listening on a topic, through a source its team adds:
/// only a key that may both act on the plugin and publish to the topic may add it, so no team
/// reads another's plugin into its topic nor feeds a topic it does not own.
#[tokio::test]
async fn a_plugins_emitted_events_drive_tasks_where_its_key_may_publish() {
    let redis = RedisServer::start();
    let r = recorder_runner(&redis).await;
    let base = r.url.as_str();
    let key_of = |name: &str, plugins: &str, publish: &str| json!({"name": name, "role": "developer", "plugins": [plugins], "publish": [publish]});
    let (_, k) = admin(
        "POST",
        base,
        "/v1/keys",
        Some(key_of("orders", "order-*", "orders.*")),
    )
    .await;
    let orders = k["key"].as_str().unwrap().to_owned();
    let (_, k) = admin(
        "POST",
        base,
        "/v1/keys",
        Some(key_of("coupons", "coupon-*", "coupons")),
    )
    .await;
    let coupons = k["key"].as_str().unwrap().to_owned();
    let (s, up) = upload_as(base, &orders, "order-cancel", plugin_wasm("order-cancel")).await;
    assert_eq!(s, 201, "{up}");
    let add = |bearer: &str, body: Value| {
        let (url, bearer) = (format!("{base}/v1/sources"), bearer.to_owned());
        async move { req("POST", &url, Some(&bearer), Some(body)).await }
    };
    let source = |topic: &str| {
        json!({"name": "cancelled", "plugin": "order-cancel", "emitted": "order",
               "key_field": "order_id", "topic": topic})
    };
    // another team can't read the orders team's plugin into a topic of its own
    let (s, e) = add(&coupons, source("coupons")).await;
    assert_eq!(s, 403, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("may not act on plugin"),
        "{e}"
    );
    // nor can the orders team feed a topic it may not publish to
    let (s, e) = add(&orders, source("payments")).await;
    assert_eq!(s, 403, "{e}");
    // a source reads a stream or a plugin's events, one of the two
    let mut both = source("orders.cancelled");
    both["stream"] = json!("orders");
    let (s, e) = add(&orders, both).await;
    assert_eq!(s, 422, "{e}");
    let (s, e) = add(
        &orders,
        json!({"name": "x", "key_field": "id", "topic": "orders.x"}),
    )
    .await;
    assert_eq!(s, 422, "{e}");
    let (s, src) = add(&orders, source("orders.cancelled")).await;
    assert_eq!(s, 201, "{src}");
    assert_eq!(src["plugin"], "order-cancel", "{src}");

    // a task told when its order is cancelled, and the order's timeout, due now
    let (s, e) = admin(
        "POST",
        base,
        "/v1/tasks",
        Some(listening("sorry-o1", "orders.cancelled", "o1", "run")),
    )
    .await;
    assert_eq!(s, 201, "{e}");
    let (s, e) = req(
        "POST",
        &format!("{base}/v1/tasks"),
        Some(&orders),
        Some(json!({"plugin": "order-cancel", "id": "cancel-o1",
                    "payload": {"order_id": "o1", "user_id": "u1"}})),
    )
    .await;
    assert_eq!(s, 201, "{e}");
    let run = eventually(T, "sorry-o1 run by order-cancel's event", || async {
        runs(&redis).remove("sorry-o1").map(|mut v| v.remove(0))
    })
    .await;
    let event = &run["event"];
    assert_eq!(
        (&event["topic"], &event["key"], &event["data"]),
        (
            &json!("orders.cancelled"),
            &json!("o1"),
            &json!({"type": "order_cancelled", "order_id": "o1", "user_id": "u1"})
        ),
        "{run}"
    );
    // the source goes with its plugin: a plugin uploaded again under the name feeds nothing
    let (s, e) = req(
        "DELETE",
        &format!("{base}/v1/plugins/order-cancel?tasks=cancel"),
        Some(&orders),
        None,
    )
    .await;
    assert_eq!(s, 204, "{e}");
    let (_, list) = admin("GET", base, "/v1/sources", None).await;
    assert_eq!(
        list,
        json!([]),
        "the deleted plugin's source is left: {list}"
    );
}

#[tokio::test]
async fn the_cli_sends_events_and_adds_sources() {
    let redis = RedisServer::start();
    let r = recorder_runner(&redis).await;
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(eggtimer_bin())
            .args(args)
            .args(["--url", &r.url, "--token", ADMIN])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {err}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (s, _) = admin(
        "POST",
        &r.url,
        "/v1/tasks",
        Some(listening("t1", "meals", "p1", "cancel")),
    )
    .await;
    assert_eq!(s, 201);
    let out = cli(&["event", "send", "meals", "p1", "--data", r#"{"fed":true}"#]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v, json!({"published": 1, "matched": 1}), "{out}");
    // a source reads a stream that exists
    xadd(&redis, "pet-meals", &[("pet_id", "p0")]);
    let out = cli(&[
        "source",
        "add",
        "meals",
        "--stream",
        "pet-meals",
        "--key-field",
        "pet_id",
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&v["topic"], &v["stream"]),
        (&json!("meals"), &json!("pet-meals")),
        "{out}"
    );
    let out = cli(&["source", "list"]);
    assert!(out.contains("pet-meals"), "{out}");
    cli(&["source", "remove", "meals"]);
    let out = cli(&[
        "source",
        "add",
        "cancelled",
        "--plugin",
        "order-cancel",
        "--emitted",
        "order",
        "--key-field",
        "order_id",
        "--topic",
        "orders.cancelled",
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&v["plugin"], &v["stream"]),
        (
            &json!("order-cancel"),
            &json!("{eggtimer}:events:order-cancel:order")
        ),
        "{out}"
    );
    cli(&["source", "remove", "cancelled"]);
    let out = cli(&["event", "list", "bench", "--plugin", "bench-record"]);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        json!([]),
        "{out}"
    );
}
