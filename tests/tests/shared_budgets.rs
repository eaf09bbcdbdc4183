//! What one team sends can't fill what every team shares, tried as an attacking team would (a
//! key of its own, a real runner, a real redis-server): its failed requests can't push another
//! team's change out of the audit, and what one key publishes is bounded within the retention.
//! (What a team's tasks hold: `shared_task_bytes.rs`.)

use std::time::Duration;

use eggtimer_tests::as_key::{ADMIN, make_key, req};
use eggtimer_tests::events::recorder_runner_with;
use eggtimer_tests::{RedisServer, eventually};
use serde_json::{Value, json};

/// A team's cheap failed requests can't push another team's change out of the audit: 1,000
/// `DELETE /v1/tasks/nope-N` (404s) go to the failed requests' stream, and the stream of changes,
/// capped at 100 entries, still holds the other team's schedule (0.2.0 kept the 404s with the
/// changes, so they pushed it out). Each key's refusals are counted, past the streams' caps.
#[tokio::test]
async fn failed_requests_cant_push_a_change_out_of_the_audit() {
    let redis = RedisServer::start();
    let r = recorder_runner_with(&redis, &["--audit-max-len", "100"]).await;
    let base = r.url.as_str();
    let (_, a) = make_key(base, "team-a", "developer", &["bench-record"]).await;
    let (_, b) = make_key(base, "team-b", "developer", &["other-*"]).await;
    let url = format!("{base}/v1/tasks");
    let (s, t) = req(
        "POST",
        &url,
        Some(&a),
        Some(json!({"id": "kept", "plugin": "bench-record", "payload": 1, "delay_ms": 3_600_000})),
    )
    .await;
    assert_eq!(s, 201, "{t}");
    for i in 0..1000 {
        let (s, _) = req("DELETE", &format!("{url}/nope-{i}"), Some(&b), None).await;
        assert_eq!(s, 404);
    }
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg("{eggtimer}:audit")
        .arg("-")
        .arg("+")
        .query(&mut redis.conn())
        .unwrap();
    let field = |e: &[(String, String)], name: &str| {
        e.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert!(
        entries
            .iter()
            .any(|(_, e)| field(e, "key") == "team-a" && field(e, "method") == "POST"),
        "team A's schedule was pushed out of the audit of changes"
    );
    assert!(
        entries
            .iter()
            .all(|(_, e)| field(e, "status").parse::<u16>().unwrap() < 400),
        "the audit of changes holds a failed request"
    );
    // the failed requests are audited all the same, apart
    let (_, page) = req(
        "GET",
        &format!("{base}/v1/audit?limit=1"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(page["entries"][0]["status"], 404, "{page}");
    // and counted per key, past the refusal stream's own cap: team B's 1,000, none of team A's
    let (_, keys) = req("GET", &format!("{base}/v1/keys"), Some(ADMIN), None).await;
    let refused = |name: &str| {
        keys.as_array()
            .unwrap()
            .iter()
            .find(|k| k["name"] == name)
            .map(|k| k["refused"].clone())
    };
    assert_eq!(
        (refused("team-a"), refused("team-b")),
        (Some(json!(0)), Some(json!(1000))),
        "{keys}"
    );
}

/// Redis's `used_memory`, bytes.
fn used_memory(redis: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query(&mut redis.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO memory")
}

/// Events in are bounded per publishing key: what a key publishes within the event retention
/// (what Redis keeps for tasks' lookback) passes no budget (`--events-max-bytes`, 16 MiB by
/// default). A team that sends four requests of 100 events of 60 KB (24 MB) gets the last ones
/// refused, 429 naming the flag, with nothing of them published, and Redis grows by less than
/// two budgets; another team publishes all the while, and once the retention has passed the
/// first team may publish again. (0.2.0 took four requests of 500 × 60 KB from 14 MB to 145 MB.)
#[tokio::test]
async fn events_published_within_the_retention_are_bounded_per_key() {
    let redis = RedisServer::start();
    let r = eggtimer_tests::RunnerProcess::start(
        &redis.url(),
        &["--token", ADMIN, "--event-retention", "15s"],
    );
    let base = r.url.as_str();
    let key = |name: &'static str| async move {
        let (s, k) = req(
            "POST",
            &format!("{base}/v1/keys"),
            Some(ADMIN),
            Some(
                json!({"name": name, "role": "operator", "plugins": ["none"],
                        "publish": [format!("{name}.*")]}),
            ),
        )
        .await;
        assert_eq!(s, 201, "{k}");
        (
            k["id"].as_str().unwrap().to_owned(),
            k["key"].as_str().unwrap().to_owned(),
        )
    };
    let ((_, a), (id_b, b)) = (key("team-a").await, key("team-b").await);
    let big = "x".repeat(60_000);
    let publish = |bearer: String, topic: &'static str, n: usize, round: usize| {
        let big = big.clone();
        async move {
            let events: Vec<Value> = (0..n)
                .map(|i| json!({"key": format!("k{round}-{i}"), "data": {"blob": big}}))
                .collect();
            req(
                "POST",
                &format!("{base}/v1/events/{topic}"),
                Some(&bearer),
                Some(json!(events)),
            )
            .await
        }
    };
    let before = used_memory(&redis);
    let mut refused = None;
    for round in 0..4 {
        let (s, e) = publish(a.clone(), "team-a.orders", 100, round).await;
        match s {
            200 => assert!(
                refused.is_none(),
                "a publish taken after one was refused: {e}"
            ),
            429 => refused = refused.or(Some((round, e))),
            _ => panic!("{s} {e}"),
        }
    }
    let (round, e) = refused.expect("24 MB of events within 15 s pass a 16 MiB budget");
    assert_eq!(round, 2, "12 MB fit, 18 MB do not");
    assert_eq!(e["error"]["code"], "event_budget", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--events-max-bytes"),
        "{e}"
    );
    let grown = used_memory(&redis).saturating_sub(before);
    assert!(
        grown < 32 << 20,
        "Redis grew by {grown} bytes for one key's events"
    );
    // another team's budget is its own
    let (s, e) = publish(b.clone(), "team-b.orders", 10, 0).await;
    assert_eq!(s, 200, "{e}");
    // an admin gives team B a budget of its own, 1 MiB: it published 600 KB, so 600 KB more is
    // refused (every runner takes a key's change within a second)
    let (s, k) = req(
        "PATCH",
        &format!("{base}/v1/keys/{id_b}"),
        Some(ADMIN),
        Some(json!({"event_bytes": 1_048_576})),
    )
    .await;
    assert_eq!((s, &k["event_bytes"]), (200, &json!(1_048_576)), "{k}");
    let (s, e) = publish(b.clone(), "team-b.orders", 10, 1).await;
    assert_eq!(
        (s, &e["error"]["code"]),
        (429, &json!("event_budget")),
        "{e}"
    );
    // once the retention has passed, the first team publishes again
    eventually(
        Duration::from_secs(60),
        "team A's budget to come back",
        || {
            let a = a.clone();
            let publish = &publish;
            async move { (publish(a, "team-a.orders", 100, 9).await.0 == 200).then_some(()) }
        },
    )
    .await;
}
