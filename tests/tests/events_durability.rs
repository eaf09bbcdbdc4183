//! Events and their tasks when a runner dies mid-way, with real runners and a real redis-server:
//! killed -9 while events flow, or aborted (a failpoint) at each place between the scripts of one
//! event's way to its task. What a runner acknowledged is done once; what it left owed between
//! shards is finished by the next runner's outbox sweeper.

use std::time::Duration;

use eggtimer_tests::as_key::{ADMIN, req, upload_as};
use eggtimer_tests::events::{listening, outboxes_empty, recorder_runner as runner, runs};
use eggtimer_tests::{RedisServer, RunnerProcess, eventually, plugin_wasm};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

async fn admin(method: &str, base: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    req(method, &format!("{base}{path}"), Some(ADMIN), body).await
}

/// A runner killed -9 while events flow: what it acknowledged and did not deliver is delivered
/// by the next runner's outbox sweeper; every task runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_while_events_flow_loses_none_and_doubles_none() {
    let redis = RedisServer::start();
    let mut r = runner(&redis).await;
    let base = r.url.clone();
    let n = 600;
    for chunk in (0..n).collect::<Vec<_>>().chunks(200) {
        let specs: Vec<Value> = chunk
            .iter()
            .map(|i| listening(&format!("k-{i}"), "kill", &format!("k-{i}"), "run"))
            .collect();
        let (s, e) = admin("POST", &base, "/v1/tasks", Some(Value::Array(specs))).await;
        assert_eq!(s, 201, "{e}");
    }
    // publish in batches of 10, killing the runner once a third is acknowledged
    let mut acked = 0;
    let mut sent = 0;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    while sent < n {
        let batch: Vec<Value> = (sent..(sent + 10).min(n))
            .map(|i| json!({"key": format!("k-{i}")}))
            .collect();
        let res = client
            .post(format!("{base}/v1/events/kill"))
            .bearer_auth(ADMIN)
            .json(&batch)
            .send()
            .await;
        if res.is_ok_and(|r| r.status() == 200) {
            acked = sent + batch.len();
        } else {
            break;
        }
        sent += batch.len();
        if sent == n / 3 {
            // the next request is in flight when the runner dies
            let c = client.clone();
            let b = base.clone();
            let pending = tokio::spawn(async move {
                let batch: Vec<Value> = (n / 3..n / 3 + 10)
                    .map(|i| json!({"key": format!("k-{i}")}))
                    .collect();
                let _ = c
                    .post(format!("{b}/v1/events/kill"))
                    .bearer_auth(ADMIN)
                    .json(&batch)
                    .send()
                    .await;
            });
            tokio::time::sleep(Duration::from_millis(1)).await;
            r.kill();
            let _ = pending.await;
            break;
        }
    }
    assert!(acked >= n / 3, "acknowledged {acked}");
    // a new runner; the publisher sends again what it does not know was taken, then the rest
    let r2 = RunnerProcess::start(&redis.url(), &["--token", ADMIN]);
    let base2 = r2.url.clone();
    for chunk in (acked..n).collect::<Vec<_>>().chunks(50) {
        let batch: Vec<Value> = chunk
            .iter()
            .map(|i| json!({"key": format!("k-{i}")}))
            .collect();
        let (s, e) = admin("POST", &base2, "/v1/events/kill", Some(Value::Array(batch))).await;
        assert_eq!(s, 200, "{e}");
    }
    eventually(T, "every task to run", || async {
        (runs(&redis).len() == n).then_some(())
    })
    .await;
    eventually(T, "nothing scheduled or running", || async {
        let (_, s) = admin("GET", &base2, "/v1/stats", None).await;
        (s["scheduled"] == 0 && s["running"] == 0).then_some(())
    })
    .await;
    let all = runs(&redis);
    let twice = all.values().filter(|v| v.len() > 1).count();
    let without = all.values().filter(|v| v[0]["event"].is_null()).count();
    assert_eq!((all.len(), twice, without), (n, 0, 0));
}

/// A runner aborted (as by kill -9) at each place between the scripts of one event's way to a
/// task: after the task's script wrote it and its listen message, before the listener was
/// registered; after the event's script recorded it and its deliveries, before they were
/// delivered; after a delivery acted, before it was struck from the outbox. The next runner's
/// outbox sweeper finishes what was left: the task runs once, with its event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_aborted_between_the_scripts_of_an_event_leaves_nothing_undone_or_doubled() {
    for point in ["listeners-written", "events-recorded", "events-delivered"] {
        let redis = RedisServer::start();
        let mut a = RunnerProcess::start_with_env(
            &redis.url(),
            &["--token", ADMIN],
            &[("EGGTIMER_FAILPOINT", point)],
        );
        let (s, up) = upload_as(&a.url, ADMIN, "bench-record", plugin_wasm("bench-record")).await;
        assert_eq!(s, 201, "{up}");
        let client = reqwest::Client::new();
        let send = |path: &str, body: Value| {
            client
                .post(format!("{}{path}", a.url))
                .bearer_auth(ADMIN)
                .json(&body)
                .send()
        };
        let scheduled = send("/v1/tasks", listening("fp-1", "fp", "k1", "run")).await;
        if point == "listeners-written" {
            assert!(
                scheduled.is_err(),
                "{point}: the runner should have died scheduling"
            );
        } else {
            assert_eq!(scheduled.unwrap().status(), 201, "{point}");
            let published = send("/v1/events/fp", json!({"key": "k1", "data": {"p": point}})).await;
            assert!(
                published.is_err(),
                "{point}: the runner should have died publishing"
            );
        }
        let died = std::time::Instant::now() + T;
        while !a.child_exited() {
            assert!(
                std::time::Instant::now() < died,
                "{point}: the runner did not die"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let b = RunnerProcess::start(&redis.url(), &["--token", ADMIN]);
        if point == "listeners-written" {
            // the task was written; the event may come before or after its listener is
            let (s, p) = admin(
                "POST",
                &b.url,
                "/v1/events/fp",
                Some(json!({"key": "k1", "data": {"p": point}})),
            )
            .await;
            assert_eq!(s, 200, "{p}");
        }
        let run = eventually(T, &format!("{point}: fp-1 to run"), || async {
            runs(&redis).remove("fp-1").map(|mut v| v.remove(0))
        })
        .await;
        assert_eq!(run["event"]["data"], json!({"p": point}), "{point}: {run}");
        eventually(
            T,
            &format!("{point}: the outboxes to be delivered"),
            || async { outboxes_empty(&redis).then_some(()) },
        )
        .await;
        eggtimer_tests::as_key::wait_state(&b.url, "fp-1", "done").await;
        assert_eq!(runs(&redis)["fp-1"].len(), 1, "{point}: ran twice");
    }
}

/// A runner aborted (as by kill -9) while it hands one event to 1,200 listeners, after the first
/// call of at most 500 of them was delivered: the next runner's sweeper hands the event to the
/// rest; every task runs once, with the event, and no listener or message is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_aborted_midway_through_an_events_listeners_leaves_the_rest_to_the_next() {
    let redis = RedisServer::start();
    let mut a = RunnerProcess::start_with_env(
        &redis.url(),
        &["--token", ADMIN],
        &[("EGGTIMER_FAILPOINT", "events-drained")],
    );
    let (s, up) = upload_as(&a.url, ADMIN, "bench-record", plugin_wasm("bench-record")).await;
    assert_eq!(s, 201, "{up}");
    let n = 1_200;
    for from in (0..n).step_by(400) {
        let specs: Vec<Value> = (from..from + 400)
            .map(|i| listening(&format!("d-{i}"), "drain", "all", "run"))
            .collect();
        let (s, e) = admin("POST", &a.url, "/v1/tasks", Some(Value::Array(specs))).await;
        assert_eq!(s, 201, "{e}");
    }
    let published = reqwest::Client::new()
        .post(format!("{}/v1/events/drain", a.url))
        .bearer_auth(ADMIN)
        .json(&json!({"key": "all", "data": {"to": "all"}}))
        .send()
        .await;
    assert!(
        published.is_err(),
        "the runner should have died handing it over"
    );
    let died = std::time::Instant::now() + T;
    while !a.child_exited() {
        assert!(std::time::Instant::now() < died, "the runner did not die");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ran_before = runs(&redis).len();
    assert!(ran_before <= 500, "{ran_before} ran before the abort");
    let _b = RunnerProcess::start(&redis.url(), &["--token", ADMIN]);
    let all = eventually(T, "every listener to run", || async {
        let all = runs(&redis);
        (all.len() == n).then_some(all)
    })
    .await;
    let twice = all.values().filter(|v| v.len() > 1).count();
    let without = all
        .values()
        .filter(|v| v[0]["event"]["data"] != json!({"to": "all"}))
        .count();
    assert_eq!((twice, without), (0, 0), "ran twice, ran without the event");
    eventually(T, "no drain, listener or message left", || async {
        let drains: Vec<String> = redis::cmd("KEYS")
            .arg("{eggtimer:*}:listeners:*")
            .query(&mut redis.conn())
            .unwrap();
        (drains.is_empty() && outboxes_empty(&redis)).then_some(())
    })
    .await;
}

/// Redis killed -9 while events flow (every write fsynced: `appendfsync always`) and started
/// again from its append-only file, the runner living on: what it acknowledged survived, the
/// publisher sends again what was not acknowledged, and every task runs once with its event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_while_events_flow_and_started_from_its_aof_loses_none_and_doubles_none() {
    let mut redis = RedisServer::start();
    let r = runner(&redis).await;
    let base = r.url.clone();
    let n = 400;
    let specs: Vec<Value> = (0..n)
        .map(|i| listening(&format!("a-{i}"), "aof", &format!("a-{i}"), "run"))
        .collect();
    let (s, e) = admin("POST", &base, "/v1/tasks", Some(Value::Array(specs))).await;
    assert_eq!(s, 201, "{e}");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let publish = |from: usize| {
        let batch: Vec<Value> = (from..(from + 10).min(n))
            .map(|i| json!({"key": format!("a-{i}"), "data": {"i": i}}))
            .collect();
        client
            .post(format!("{base}/v1/events/aof"))
            .bearer_auth(ADMIN)
            .json(&batch)
            .send()
    };
    // a third acknowledged, then Redis dies with the next batch in flight
    let mut acked = 0;
    while acked < n / 3 {
        let res = publish(acked).await.unwrap();
        assert_eq!(res.status(), 200);
        acked += 10;
    }
    let in_flight = tokio::spawn(publish(acked));
    tokio::time::sleep(Duration::from_millis(2)).await;
    redis.kill();
    let _ = in_flight.await;
    redis.start_again();
    // the publisher goes on from the first batch it does not know was taken, retrying while the
    // runner reconnects
    while acked < n {
        let at = acked;
        eventually(T, "the runner to take events again", || async {
            publish(at)
                .await
                .is_ok_and(|r| r.status() == 200)
                .then_some(())
        })
        .await;
        acked += 10;
    }
    eventually(T, "every task to run", || async {
        (runs(&redis).len() == n).then_some(())
    })
    .await;
    eventually(T, "every outbox empty", || async {
        outboxes_empty(&redis).then_some(())
    })
    .await;
    let (_, stats) = admin("GET", &base, "/v1/stats", None).await;
    let all = runs(&redis);
    let twice = all.values().filter(|v| v.len() > 1).count();
    let without = all.values().filter(|v| v[0]["event"].is_null()).count();
    assert_eq!((all.len(), twice, without), (n, 0, 0), "{stats}");
}
