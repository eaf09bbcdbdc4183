//! Tasks that react to events, with real runners, a real redis-server and a real plugin
//! (`bench-record`, which emits what it was handed: its event and batch): an event cancels or
//! starts the tasks listening for it, one that came up to `lookback_ms` before a task was
//! scheduled still reaches it, only a topic's publishers reach its listeners, a debounced task
//! runs once per quiet period with every payload, and none of it is lost or done twice when
//! events and tasks race (a runner killed -9 or aborted mid-way: events_durability.rs).

use std::time::Duration;

use eggtimer_tests::as_key::{ADMIN, req};
use eggtimer_tests::events::{forget_runs, listening, recorder_runner as runner, runs};
use eggtimer_tests::{RedisServer, eventually};
use futures::StreamExt;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

async fn admin(method: &str, base: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    req(method, &format!("{base}{path}"), Some(ADMIN), body).await
}

#[tokio::test]
async fn an_event_cancels_or_starts_its_listeners_even_one_scheduled_just_after_it() {
    let redis = RedisServer::start();
    let r = runner(&redis).await;
    let base = r.url.as_str();

    // a payment cancels the order's timeout
    let (s, t) = admin(
        "POST",
        base,
        "/v1/tasks",
        Some(listening("cancel-o1", "payments", "o1", "cancel")),
    )
    .await;
    assert_eq!(s, 201, "{t}");
    let (s, t) = admin("GET", base, "/v1/tasks/cancel-o1", None).await;
    assert_eq!(
        t["on"],
        json!([{"topic": "payments", "key": "o1", "then": "cancel"}]),
        "{s} {t}"
    );
    let (s, p) = admin(
        "POST",
        base,
        "/v1/events/payments",
        Some(json!({"key": "o1", "data": {"amount": 5}})),
    )
    .await;
    assert_eq!(
        (s, &p),
        (200, &json!({"published": 1, "matched": 1})),
        "{p}"
    );
    let (s, _) = admin("GET", base, "/v1/tasks/cancel-o1", None).await;
    assert_eq!(s, 404, "the payment cancelled it");
    // the same event again reaches nothing
    let (_, p) = admin(
        "POST",
        base,
        "/v1/events/payments",
        Some(json!({"key": "o1"})),
    )
    .await;
    assert_eq!(p["matched"], 0, "{p}");

    // the race the others lose: the payment lands before the timeout is scheduled
    let (_, p) = admin(
        "POST",
        base,
        "/v1/events/payments",
        Some(json!({"key": "o2"})),
    )
    .await;
    assert_eq!(p, json!({"published": 1, "matched": 0}));
    let (s, t) = admin(
        "POST",
        base,
        "/v1/tasks",
        Some(listening("cancel-o2", "payments", "o2", "cancel")),
    )
    .await;
    assert_eq!(s, 201);
    assert_eq!(
        t["met"],
        json!({"topic": "payments", "key": "o2", "then": "cancel"}),
        "the answer says the task was cancelled at once: {t}"
    );
    let (s, _) = admin("GET", base, "/v1/tasks/cancel-o2", None).await;
    assert_eq!(
        s, 404,
        "an event within the lookback cancels a task scheduled after it"
    );
    // ... unless the task's lookback is shorter than that
    admin(
        "POST",
        base,
        "/v1/events/payments",
        Some(json!({"key": "o3"})),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut spec = listening("cancel-o3", "payments", "o3", "cancel");
    spec["lookback_ms"] = json!(5);
    let (s, t) = admin("POST", base, "/v1/tasks", Some(spec)).await;
    assert_eq!(s, 201);
    assert!(t.get("met").is_none(), "no event met: {t}");
    let (s, t) = admin("GET", base, "/v1/tasks/cancel-o3", None).await;
    assert_eq!((s, t["state"].as_str()), (200, Some("scheduled")), "{t}");
    // a lookback past the runner's retention is refused
    let mut spec = listening("x", "payments", "o4", "cancel");
    spec["lookback_ms"] = json!(3_600_000);
    let (s, e) = admin("POST", base, "/v1/tasks", Some(spec)).await;
    assert_eq!(s, 422, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--event-retention"),
        "{e}"
    );

    // `run`: thank the user when paid, at once, with the event
    let (s, _) = admin(
        "POST",
        base,
        "/v1/tasks",
        Some(listening("thanks-o5", "payments", "o5", "run")),
    )
    .await;
    assert_eq!(s, 201);
    let (_, p) = admin(
        "POST",
        base,
        "/v1/events/payments",
        Some(json!({"key": "o5", "data": {"amount": 7}})),
    )
    .await;
    assert_eq!(p["matched"], 1, "{p}");
    let run = eventually(T, "thanks-o5 to run", || async {
        runs(&redis).remove("thanks-o5").map(|mut v| v.remove(0))
    })
    .await;
    let ev = &run["event"];
    assert_eq!(
        (ev["topic"].as_str(), ev["key"].as_str()),
        (Some("payments"), Some("o5")),
        "{run}"
    );
    assert_eq!(ev["data"], json!({"amount": 7}), "{run}");
    let t = eggtimer_tests::as_key::wait_state(base, "thanks-o5", "done").await;
    assert_eq!(
        t["event"]["data"],
        json!({"amount": 7}),
        "the task shows the event that reached it: {t}"
    );
    // a listener whose event never comes runs at its due time, without one
    let mut spec = listening("thanks-o6", "payments", "o6", "run");
    spec["delay_ms"] = json!(200);
    admin("POST", base, "/v1/tasks", Some(spec)).await;
    let run = eventually(T, "thanks-o6 to run", || async {
        runs(&redis).remove("thanks-o6").map(|mut v| v.remove(0))
    })
    .await;
    assert_eq!(run["event"], Value::Null, "{run}");
    // and, done, it listens no more: its listener was let go
    eggtimer_tests::as_key::wait_state(base, "thanks-o6", "done").await;
    eventually(T, "the listener of thanks-o6 to be let go", || async {
        let mut conn = redis.conn();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("{eggtimer:*}:listeners")
            .query(&mut conn)
            .unwrap();
        let mut left = 0;
        for k in keys {
            let fields: Vec<String> = redis::cmd("HKEYS").arg(&k).query(&mut conn).unwrap();
            left += fields.iter().filter(|f| f.ends_with("o6")).count();
        }
        (left == 0).then_some(())
    })
    .await;
    let (_, p) = admin(
        "POST",
        base,
        "/v1/events/payments",
        Some(json!({"key": "o6"})),
    )
    .await;
    assert_eq!(p["matched"], 0, "{p}");
}

#[tokio::test]
async fn only_a_topics_publishers_reach_its_listeners() {
    let redis = RedisServer::start();
    let r = runner(&redis).await;
    let base = r.url.as_str();
    let key = |name: &str, publish: Value, listen: Value| {
        let body = json!({"name": name, "role": "operator", "plugins": ["bench-*"],
                          "publish": publish, "listen": listen});
        async move {
            let (s, k) = admin("POST", base, "/v1/keys", Some(body)).await;
            assert_eq!(s, 201, "{k}");
            k["key"].as_str().unwrap().to_owned()
        }
    };
    let orders = key("orders", json!([]), json!(["payments"])).await;
    let payments = key("payments", json!(["payments", "refunds.*"]), json!([])).await;
    let coupons = key("coupons", json!(["coupons"]), json!(["coupons"])).await;
    let url = |p: &str| format!("{base}{p}");

    let (s, _) = req(
        "POST",
        &url("/v1/tasks"),
        Some(&orders),
        Some(listening("o1", "payments", "o1", "cancel")),
    )
    .await;
    assert_eq!(s, 201);
    // another team can't cancel the orders team's task by publishing to its topic
    let (s, e) = req(
        "POST",
        &url("/v1/events/payments"),
        Some(&coupons),
        Some(json!({"key": "o1"})),
    )
    .await;
    assert_eq!(s, 403, "{e}");
    let m = e["error"]["message"].as_str().unwrap();
    assert!(m.contains("may not publish to topic \"payments\""), "{m}");
    // nor the orders team itself, which may only listen
    let (s, _) = req(
        "POST",
        &url("/v1/events/payments"),
        Some(&orders),
        Some(json!({"key": "o1"})),
    )
    .await;
    assert_eq!(s, 403);
    // nor listen on a topic it has no right to (it would see another team's events)
    let (s, e) = req(
        "POST",
        &url("/v1/tasks"),
        Some(&coupons),
        Some(listening("c1", "payments", "o1", "run")),
    )
    .await;
    assert_eq!(s, 403, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("may not listen on topic \"payments\""),
        "{e}"
    );
    let (s, _) = admin("GET", base, "/v1/tasks/o1?plugin=bench-record", None).await;
    assert_eq!(s, 200, "still there");
    // the topic's publisher can; a pattern covers its topics
    let (s, p) = req(
        "POST",
        &url("/v1/events/payments"),
        Some(&payments),
        Some(json!([{"key": "o1"}, {"key": "o9"}])),
    )
    .await;
    assert_eq!(
        (s, &p),
        (200, &json!({"published": 2, "matched": 1})),
        "{p}"
    );
    let (s, _) = req(
        "POST",
        &url("/v1/events/refunds.eu"),
        Some(&payments),
        Some(json!({"key": "r1"})),
    )
    .await;
    assert_eq!(s, 200);
    // hostile input: a bad topic, a key with a control character, an empty batch
    for (topic, body) in [
        ("Payments!", json!({"key": "o1"})),
        ("payments", json!({"key": "o\u{1}"})),
        ("payments", json!([])),
    ] {
        let path = url(&format!("/v1/events/{topic}"));
        let (s, e) = req("POST", &path, Some(&payments), Some(body)).await;
        assert_eq!(s, 400, "{topic}: {e}");
    }
    // keys say what they may do with topics
    let (_, keys) = admin("GET", base, "/v1/keys", None).await;
    let p = keys
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "payments")
        .unwrap();
    assert_eq!(p["publish"], json!(["payments", "refunds.*"]), "{p}");
}

/// 1,000 pairs of a listening task and its event, each pair's two requests sent 0-5 ms apart in
/// either order: every task runs exactly once, with its event. `EGGTIMER_RACE_PAIRS=100000`
/// runs more (1,000 pairs at a time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_racing_their_tasks_are_never_missed_nor_delivered_twice() {
    let redis = RedisServer::start();
    let r = runner(&redis).await;
    let base = r.url.clone();
    let n: usize = std::env::var("EGGTIMER_RACE_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let t = T + Duration::from_millis(n as u64);
    let pairs = (0..n).map(|i| {
        let base = base.clone();
        async move {
            let id = format!("race-{i}");
            let gap = Duration::from_micros((i * 5_077 % 5_000) as u64);
            let task = listening(&id, "race", &id, "run");
            let event = json!({"key": id, "data": {"i": i}});
            let (a, b) = if i % 2 == 0 {
                let t = admin("POST", &base, "/v1/tasks", Some(task));
                let e = async {
                    tokio::time::sleep(gap).await;
                    admin("POST", &base, "/v1/events/race", Some(event)).await
                };
                tokio::join!(t, e)
            } else {
                let e = admin("POST", &base, "/v1/events/race", Some(event));
                let t = async {
                    tokio::time::sleep(gap).await;
                    admin("POST", &base, "/v1/tasks", Some(task)).await
                };
                let (e, t) = tokio::join!(e, t);
                (t, e)
            };
            assert_eq!((a.0, b.0), (201, 200), "{} {}", a.1, b.1);
        }
    });
    futures::stream::iter(pairs)
        .buffer_unordered(1000)
        .collect::<Vec<()>>()
        .await;
    eventually(t, "every racing task to run", || async {
        (runs(&redis).len() == n).then_some(())
    })
    .await;
    // nothing is left to run, so nothing can run again
    eventually(t, "nothing scheduled or running", || async {
        let (_, s) = admin("GET", &base, "/v1/stats", None).await;
        (s["scheduled"] == 0 && s["running"] == 0).then_some(())
    })
    .await;
    let all = runs(&redis);
    let twice: Vec<&String> = all
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(k, _)| k)
        .collect();
    let without: Vec<&String> = all
        .iter()
        .filter(|(_, v)| v[0]["event"].is_null())
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        (all.len(), twice.len(), without.len()),
        (n, 0, 0),
        "twice: {twice:?}, without an event: {without:?}"
    );
}

/// A debounced task: 40 keys, 25 payloads each, 20 ms apart: one run per key, with all 25
/// payloads in order; max_wait_ms bounds how long a busy key waits. `EGGTIMER_DEBOUNCE_KEYS`
/// and `EGGTIMER_DEBOUNCE_PAYLOADS` run more (the quiet period grows with the keys, so a key
/// stays in one window while the batches of all keys are sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debounced_task_runs_once_per_quiet_period_with_every_payload() {
    let redis = RedisServer::start();
    let r = runner(&redis).await;
    let base = r.url.clone();
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let keys = env("EGGTIMER_DEBOUNCE_KEYS", 40);
    let per = env("EGGTIMER_DEBOUNCE_PAYLOADS", 25);
    let quiet_ms = 400 + keys;
    for j in 0..per {
        let specs: Vec<Value> = (0..keys)
            .map(|k| json!({"plugin": "bench-record", "payload": {"j": j},
                            "debounce": {"key": format!("feed-{k}"), "quiet_ms": quiet_ms, "max_wait_ms": 3_600_000}}))
            .collect();
        let (s, reply) = admin("POST", &base, "/v1/tasks", Some(Value::Array(specs))).await;
        assert_eq!(s, 201, "{reply}");
        let want = if j == 0 { "new" } else { "merged" };
        assert_eq!(reply[0]["debounced"], want, "{reply}");
        assert_eq!(reply[0]["id"], "feed-0", "{reply}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, t) = admin("GET", &base, "/v1/tasks/feed-3", None).await;
    assert_eq!(t["batch"].as_array().map(Vec::len), Some(per), "{t}");
    let t_keys = T + Duration::from_millis(keys as u64 * 10);
    eventually(t_keys, "every key to run", || async {
        (runs(&redis).len() == keys).then_some(())
    })
    .await;
    eventually(T, "nothing scheduled or running", || async {
        let (_, s) = admin("GET", &base, "/v1/stats", None).await;
        (s["scheduled"] == 0 && s["running"] == 0).then_some(())
    })
    .await;
    let want: Vec<Value> = (0..per).map(|j| json!({"j": j})).collect();
    for (id, v) in runs(&redis) {
        assert_eq!(v.len(), 1, "{id} ran {} times", v.len());
        assert_eq!(v[0]["batch"], Value::Array(want.clone()), "{id}");
        assert_eq!(
            v[0]["payload"],
            json!({"j": per - 1}),
            "{id}: the latest payload"
        );
    }

    // max_wait_ms: a key that never goes quiet still runs by its first payload + max_wait_ms
    // (the runs so far forgotten: reading them each round would slow the rounds down)
    forget_runs(&redis);
    let started = eggtimer_tests::now_ms();
    let spec = |j: usize| {
        json!({"plugin": "bench-record", "payload": {"j": j},
                                 "debounce": {"key": "busy", "quiet_ms": 300, "max_wait_ms": 700}})
    };
    let mut j = 0;
    // the first payload's time is at most when its request came back (one clock: this host's)
    let mut first_back = None;
    while !runs(&redis).contains_key("busy") {
        assert!(
            eggtimer_tests::now_ms() - started < 30_000,
            "busy never ran"
        );
        admin("POST", &base, "/v1/tasks", Some(spec(j))).await;
        first_back.get_or_insert_with(eggtimer_tests::now_ms);
        j += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let first_back = first_back.expect("a payload was sent");
    let run = &runs(&redis)["busy"][0];
    assert!(
        run["due"].as_i64().unwrap() <= first_back + 700,
        "due {} past first + max_wait (at most {first_back} + 700)",
        run["due"]
    );
    assert!(run["batch"].as_array().unwrap().len() >= 5, "{run}");
}

/// Payloads that come while a debounced task runs are its next window: they run once it is
/// done, together, and none is lost.
#[tokio::test]
async fn payloads_that_come_while_a_debounced_task_runs_make_its_next_window() {
    let redis = RedisServer::start();
    let r = runner(&redis).await;
    let base = r.url.as_str();
    let (s, up) = eggtimer_tests::as_key::upload_as(
        base,
        ADMIN,
        "test-sleep",
        eggtimer_tests::plugin_wasm("test-sleep"),
    )
    .await;
    assert_eq!(s, 201, "{up}");
    let spec = |tag: &str, ms: u64| {
        json!({"plugin": "test-sleep", "payload": {"ms": ms, "tag": tag},
               "debounce": {"key": "feed-p1", "quiet_ms": 50, "max_wait_ms": 1000}})
    };
    let (_, d) = admin("POST", base, "/v1/tasks", Some(spec("a", 700))).await;
    assert_eq!(d["debounced"], "new", "{d}");
    eggtimer_tests::as_key::wait_state(base, "feed-p1", "running").await;
    for tag in ["b", "c"] {
        let (_, d) = admin("POST", base, "/v1/tasks", Some(spec(tag, 10))).await;
        assert_eq!(d["debounced"], "queued", "{d}");
    }
    let (_, t) = admin("GET", base, "/v1/tasks/feed-p1", None).await;
    assert_eq!(
        (&t["state"], &t["next_batch"]),
        (&json!("running"), &json!(2)),
        "{t}"
    );
    // the first window done, the second runs with b and c
    let t = eventually(T, "the second window to run", || async {
        let (_, t) = admin("GET", base, "/v1/tasks/feed-p1", None).await;
        (t["state"] == "done" && t["batch"].as_array().map(Vec::len) == Some(2)).then_some(t)
    })
    .await;
    assert_eq!(
        t["batch"],
        json!([{"ms": 10, "tag": "b"}, {"ms": 10, "tag": "c"}]),
        "{t}"
    );
    let mut conn = redis.conn();
    let slept: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg("{eggtimer}:events:test-sleep:sleep")
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap();
    let tags: Vec<String> = slept
        .iter()
        .flat_map(|(_, f)| f.iter().filter(|(k, _)| k == "data"))
        .map(|(_, v)| {
            serde_json::from_str::<Value>(v).unwrap()["tag"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        tags,
        ["a", "c"],
        "one run per window, each with its latest payload"
    );
}
