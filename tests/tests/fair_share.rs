//! Fair share between plugins: one plugin's backlog of slow runs never holds up another
//! plugin's tasks. A real runner process, real plugins, a real redis-server; lateness comes from
//! the plugins' own events (the Redis time of each XADD).

use std::time::Duration;

use eggtimer_tests::{
    RedisServer, call, eventually, now_ms, plugin_wasm, post_tasks as schedule, read_stream,
    read_stream_timed, runner_fast_retry as start, upload, wait_state,
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_plugins_backlog_of_slow_runs_does_not_hold_up_another_plugins_tasks() {
    let redis = RedisServer::start();
    let workers = 8;
    let r = start(&redis, &["--workers", &workers.to_string()]);
    // 64 runs of 0.8 s (under the 1 s time limit): 8 rounds of the 8 workers, 6.4 s of backlog
    let slow = 64;
    let sleepers: Vec<Value> = (0..slow)
        .map(|i| json!({"plugin": "test-sleep", "id": format!("slow-{i}"), "payload": {"ms": 800, "tag": format!("{i}")}}))
        .collect();
    schedule(&r.url, json!(sleepers)).await;
    // 60 coupon reminders falling due behind it, from 1.5 s on, one every 10 ms
    let t0 = now_ms() + 1_500;
    let reminders: Vec<Value> = (0..60)
        .map(|i| {
            let due = t0 + i * 10;
            json!({"plugin": "coupon-expiry", "id": format!("c{i}"), "run_at": due,
                   "payload": {"coupon_id": format!("c{i}"), "user_id": "u1", "expires_at": due + 2 * 3600 * 1000}})
        })
        .collect();
    schedule(&r.url, json!(reminders)).await;
    eventually(T, "60 reminders", || async {
        (read_stream(&mut redis.conn(), "{eggtimer}:events:push").len() >= 60).then_some(())
    })
    .await;
    let mut late: Vec<i64> = read_stream_timed(&mut redis.conn(), "{eggtimer}:events:push")
        .iter()
        .map(|(at, id, _)| at - (t0 + id.trim_start_matches('c').parse::<i64>().unwrap() * 10))
        .collect();
    late.sort();
    eprintln!(
        "reminders' lateness: p50 {} ms, max {} ms",
        late[late.len() / 2],
        late[late.len() - 1]
    );
    assert_eq!(late.len(), 60, "each reminder once");
    assert!(late[0] >= 0, "a reminder fired early: {late:?}");
    // Waiting for the backlog, the last would start ~5 s late. Each waits at most for one run
    // of 0.8 s to end; the rest is generous for a loaded 2-core machine (W6 measures the target).
    assert!(
        late[59] < 2_000,
        "the reminders waited for the other plugin's backlog: lateness p50 {} ms, max {} ms",
        late[30],
        late[59]
    );
    // the slow plugin was not starved: every run done, once, using one attempt
    let started = std::time::Instant::now();
    for i in 0..slow {
        let t = wait_state(&r.url, &format!("slow-{i}"), "done", T).await;
        assert_eq!(t["attempts"], 1, "slow-{i} used more than one attempt: {t}");
    }
    eprintln!(
        "the slow runs were done {:?} after the reminders",
        started.elapsed()
    );
    let runs = read_stream(&mut redis.conn(), "{eggtimer}:events:sleep");
    assert_eq!(runs.len(), slow, "every slow run once");
    // the tasks that waited for their plugin's share show in the metrics
    let metrics = reqwest::get(format!("{}/metrics", r.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let waits: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("eggtimer_fair_share_waits_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no eggtimer_fair_share_waits_total in\n{metrics}"));
    assert!(waits > 0.0, "no task waited for its share");
    let (_, dead) = call("GET", &format!("{}/v1/dead", r.url), None).await;
    assert_eq!(dead["tasks"], json!([]));
}

#[tokio::test]
async fn workers_are_shared_by_weight_between_plugins_that_compete() {
    let redis = RedisServer::start();
    let r = start(&redis, &["--workers", "8"]);
    // a second plugin of the same code: both sleep and emit on `sleep`
    let (s, b) = upload(&r.url, "sleep-b", plugin_wasm("test-sleep")).await;
    assert_eq!(s, 201, "{b}");
    let (s, b) = call(
        "PATCH",
        &format!("{}/v1/plugins/test-sleep", r.url),
        Some(json!({"weight": 3})),
    )
    .await;
    assert_eq!((s, &b["weight"]), (200, &json!(3)), "{b}");
    let (_, b) = call("GET", &format!("{}/v1/plugins", r.url), None).await;
    let weight_of = |name: &str| {
        b.as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["weight"]
            .clone()
    };
    assert_eq!(
        (weight_of("test-sleep"), weight_of("sleep-b")),
        (json!(3), json!(1))
    );
    // each has a backlog of 40 runs of 500 ms, all due at once
    let t0 = now_ms() + 300;
    let specs: Vec<Value> = (0..40)
        .flat_map(|i| {
            [
                json!({"plugin": "test-sleep", "id": format!("a{i}"), "run_at": t0, "payload": {"ms": 500, "tag": format!("a{i}")}}),
                json!({"plugin": "sleep-b", "id": format!("b{i}"), "run_at": t0, "payload": {"ms": 500, "tag": format!("b{i}")}}),
            ]
        })
        .collect();
    schedule(&r.url, json!(specs)).await;
    // three rounds of the 8 workers
    eventually(T, "24 runs", || async {
        (read_stream(&mut redis.conn(), "{eggtimer}:events:sleep").len() >= 24).then_some(())
    })
    .await;
    let started: Vec<(String, i64)> = read_stream(&mut redis.conn(), "{eggtimer}:events:sleep")
        .into_iter()
        .map(|(_, plugin, data)| (plugin, data["started_at"].as_i64().unwrap()))
        .collect();
    let first = started.iter().map(|(_, at)| *at).min().unwrap();
    // the runs that started in the first three rounds (1.2 s: each round is 0.5 s)
    let count = |p: &str| {
        started
            .iter()
            .filter(|(plugin, at)| plugin == p && *at < first + 1_200)
            .count()
    };
    let (a, b) = (count("test-sleep"), count("sleep-b"));
    eprintln!("started in the first three rounds: test-sleep {a}, sleep-b {b}");
    // 6 and 2 of the 8 workers: 3 to 1 (generous: at least 2 to 1, and sleep-b not starved)
    assert!(
        a >= 2 * b && b >= 3,
        "test-sleep {a}, sleep-b {b}: not 3 to 1"
    );
}
