//! One run per claim, whatever the load or the plugin: the executor and the plugin host against
//! hostile plugins and slow handlers, through the real runner binary, a real redis-server and
//! real wasm. Counts come from the plugins' own event streams.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use eggtimer_tests::{
    RedisServer, call, eventually, key, now_ms, plugin_wasm, post_tasks as schedule, read_events,
    read_events_timed, read_stream, rss_bytes, runner_fast_retry as start, runners_holding_shards,
    starts, upload, upload_start_reporter, variant, wait_state,
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);

async fn wait_events(redis: &RedisServer, plugin: &str, topic: &str, n: usize, limit: Duration) {
    let key = eggtimer_tests::events_key(plugin, topic);
    eventually(limit, &format!("{n} events on {topic}"), || async {
        (read_stream(&mut redis.conn(), &key).len() >= n).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_plugin_that_sleeps_fails_alone_and_other_plugins_tasks_stay_on_time() {
    let redis = RedisServer::start();
    let r = start(&redis, &["--plugin-timeout", "1s"]);
    // Eight tasks whose handler sleeps in a blocking WASI call far past the time limit.
    let sleepers: Vec<Value> = (0..8)
        .map(|i| json!({"plugin": "test-sleep", "id": format!("sleeper-{i}"), "payload": {"ms": 600_000}}))
        .collect();
    // 200 quick reminders of another plugin (whose events say when each started) falling due
    // over 2 s beside them.
    upload_start_reporter(&r.url, "reminder").await;
    schedule(&r.url, json!(sleepers)).await;
    let t0 = now_ms() + 500;
    let reminders: Vec<Value> = (0..200)
        .map(|i| {
            json!({"plugin": "reminder", "id": format!("c{i}"), "run_at": t0 + i * 10,
                        "payload": {"ms": 0, "tag": format!("{i}")}})
        })
        .collect();
    schedule(&r.url, json!(reminders)).await;
    wait_events(&redis, "reminder", "sleep", 200, T).await;
    let mut late: Vec<i64> = starts(&mut redis.conn(), "reminder")
        .iter()
        .map(|(i, at)| at - (t0 + i.parse::<i64>().unwrap() * 10))
        .collect();
    late.sort();
    assert_eq!(late.len(), 200, "each reminder once");
    assert!(late[0] >= 0, "a reminder started early: {late:?}");
    assert!(
        late[199] < 1500,
        "reminders were held up by the sleepers: lateness p50 {} ms, max {} ms",
        late[100],
        late[199]
    );
    // the sleepers failed their own attempts, with the reason
    let t = eventually(T, "a sleeper's failed attempt", || async {
        let (_, t) = call("GET", &format!("{}/v1/tasks/sleeper-0", r.url), None).await;
        t["last_error"].is_string().then_some(t)
    })
    .await;
    let err = t["last_error"].as_str().unwrap();
    assert!(
        err.contains("ran longer than its time limit of 1s"),
        "{err}"
    );
}

#[tokio::test]
async fn two_tasks_for_one_order_due_at_one_instant_on_two_runners_cancel_it_once() {
    let redis = RedisServer::start();
    let a = start(&redis, &["--shard-lease", "1s"]);
    let b = start(&redis, &["--shard-lease", "1s"]);
    runners_holding_shards(&a.url, 2).await;
    let orders = 60;
    let due = now_ms() + 700;
    let specs: Vec<Value> = (0..orders)
        .flat_map(|k| {
            ["a", "b"].map(|side| {
                json!({"plugin": "order-cancel", "id": format!("o{k}-{side}"), "run_at": due,
                       "payload": {"order_id": format!("o{k}"), "user_id": "u1"}})
            })
        })
        .collect();
    schedule(&a.url, json!(specs)).await;
    for k in 0..orders {
        for side in ["a", "b"] {
            wait_state(&b.url, &format!("o{k}-{side}"), "done", T).await;
        }
    }
    let events = read_events(&mut redis.conn(), &["order-cancel"], "order");
    let mut per_order: HashMap<String, usize> = HashMap::new();
    for e in &events {
        *per_order
            .entry(e.2["order_id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    let twice: Vec<_> = per_order.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "orders cancelled more than once: {twice:?}"
    );
    assert_eq!(per_order.len(), orders, "every order cancelled");
}

#[tokio::test]
async fn handlers_slower_than_the_lease_run_exactly_once() {
    let redis = RedisServer::start();
    let r = start(
        &redis,
        &[
            "--lease",
            "500ms",
            "--workers",
            "4",
            "--prefetch",
            "4",
            "--plugin-timeout",
            "3s",
        ],
    );
    let n = 24;
    let specs: Vec<Value> = (0..n)
        .map(|i| json!({"plugin": "test-sleep", "id": format!("slow-{i}"), "payload": {"ms": 1200, "tag": format!("{i}")}}))
        .collect();
    schedule(&r.url, json!(specs)).await;
    for i in 0..n {
        let t = wait_state(&r.url, &format!("slow-{i}"), "done", T).await;
        assert_eq!(t["attempts"], 1, "slow-{i} was claimed again: {t}");
    }
    let events = read_events(&mut redis.conn(), &["test-sleep"], "sleep");
    let mut runs: HashMap<String, usize> = HashMap::new();
    for e in &events {
        *runs
            .entry(e.2["tag"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert_eq!(runs.len(), n, "every task ran");
    assert!(runs.values().all(|c| *c == 1), "a task ran twice: {runs:?}");
    let (_, dead) = call("GET", &format!("{}/v1/dead", r.url), None).await;
    assert_eq!(dead["tasks"], json!([]));
}

#[tokio::test]
async fn a_killed_runners_tasks_run_again_within_about_one_lease_with_the_defaults() {
    let redis = RedisServer::start();
    let mut a = start(&redis, &[]);
    let n = 8;
    let specs: Vec<Value> = (0..n)
        .map(|i| json!({"plugin": "test-sleep", "id": format!("k{i}"), "payload": {"ms": 700, "tag": format!("{i}")}}))
        .collect();
    // long enough that they are in flight on `a` when it dies (the time limit is 1 s)
    schedule(&a.url, json!(specs)).await;
    for i in 0..n {
        wait_state(&a.url, &format!("k{i}"), "running", T).await;
    }
    let b = start(&redis, &[]);
    a.kill();
    let killed = Instant::now();
    let killed_ms = now_ms();
    for i in 0..n {
        wait_state(&b.url, &format!("k{i}"), "done", Duration::from_secs(40)).await;
    }
    let took = killed.elapsed();
    let events = read_events_timed(&mut redis.conn(), &["test-sleep"], "sleep");
    let mut per_tag: HashMap<String, Vec<i64>> = HashMap::new();
    for (at, _, d) in &events {
        per_tag
            .entry(d["tag"].as_str().unwrap().to_owned())
            .or_default()
            .push(*at);
    }
    assert_eq!(per_tag.len(), n);
    // Each ran to completion once, on `b` (the killed runner never finished one).
    for (tag, ats) in &per_tag {
        assert_eq!(ats.len(), 1, "task {tag} completed {} times", ats.len());
        // rerun start = event − 700 ms of sleep; it must come about one lease (5 s by default)
        // plus a membership tick after the kill, not the old 30 s.
        let rerun_after = ats[0] - 700 - killed_ms;
        assert!(
            rerun_after < 9_000,
            "task {tag} ran again {rerun_after} ms after the kill"
        );
    }
    eprintln!("takeover: every task done {took:?} after the kill -9");
}

#[tokio::test]
async fn a_plugin_that_floods_effects_fails_alone_with_none_of_them_applied() {
    let redis = RedisServer::start();
    let r = start(&redis, &["--plugin-timeout", "5s"]);
    let kinds = ["kv", "kv-reads", "events", "logs", "follow-ups", "cancels"];
    let specs: Vec<Value> = kinds
        .iter()
        .map(|k| json!({"plugin": "test-flood", "id": format!("flood-{k}"), "max_attempts": 1, "payload": {"what": k}}))
        .collect();
    schedule(&r.url, json!(specs)).await;
    for k in kinds {
        let t = wait_state(&r.url, &format!("flood-{k}"), "dead", T).await;
        let err = t["last_error"].as_str().unwrap_or_default();
        assert!(
            err.contains("went over its effects budget"),
            "flood of {k}: {err}"
        );
    }
    let mut c = redis.conn();
    let kv: Vec<String> = redis::cmd("KEYS")
        .arg("{eggtimer}:kv:test-flood:*")
        .query(&mut c)
        .unwrap();
    assert!(kv.is_empty(), "kv writes of a failed run applied: {kv:?}");
    assert!(read_events(&mut c, &["test-flood"], "flood").is_empty());
    let (_, listed) = call("GET", &format!("{}/v1/dead", r.url), None).await;
    assert_eq!(listed["tasks"].as_array().unwrap().len(), kinds.len());
    let tasks: usize = (0..16)
        .map(|s| {
            redis::cmd("HLEN")
                .arg(format!("{{eggtimer:{s}}}:tasks"))
                .query::<usize>(&mut c)
                .unwrap()
        })
        .sum();
    assert_eq!(
        tasks,
        kinds.len(),
        "no follow-up of a failed run was created"
    );
    // the runner is fine: small, and another plugin's task still runs
    let rss = rss_bytes(r.pid());
    assert!(rss < 512 << 20, "the runner grew to {} MiB", rss >> 20);
    schedule(&r.url, json!({"plugin": "order-cancel", "id": "after", "payload": {"order_id": "x", "user_id": "u"}})).await;
    wait_state(&r.url, "after", "done", T).await;
}

#[tokio::test]
async fn what_a_plugin_prints_is_logged_once_per_run_and_a_flood_of_it_fails_alone() {
    let redis = RedisServer::start();
    // one worker: the printing runs share one warm instance, whose output is taken after each
    let mut r = start(&redis, &["--plugin-timeout", "5s", "--workers", "1"]);
    let n = 40;
    let specs: Vec<Value> = (0..n)
        .map(|i| json!({"plugin": "test-flood", "id": format!("print-{i}"), "payload": {"what": "print"}}))
        .collect();
    schedule(&r.url, json!(specs)).await;
    for i in 0..n {
        wait_state(&r.url, &format!("print-{i}"), "done", T).await;
    }
    let lines: Vec<String> = (0..n)
        .flat_map(|i| {
            [
                format!("plugin stdout: printed by print-{i}"),
                format!("plugin stderr: warned by print-{i}"),
            ]
        })
        .collect();
    // how many log lines hold `line` (the message, then the event's fields or nothing)
    let times = |log: &str, line: &str| {
        log.lines()
            .filter(|l| l.ends_with(line) || l.contains(&format!("{line} ")))
            .count()
    };
    // the runner's log is read on another thread: wait until every line has arrived
    let log = eventually(T, "every printed line in the runner's log", || {
        let log = r.log_text();
        let all = lines.iter().all(|l| times(&log, l) > 0);
        async move { all.then_some(log) }
    })
    .await;
    for line in &lines {
        let k = times(&log, line);
        assert_eq!(k, 1, "{line:?} logged {k} times:\n{log}");
    }
    // printing without end: the call traps at the output limit, naming it; the runner is fine
    schedule(&r.url, json!({"plugin": "test-flood", "id": "flood-stdout", "max_attempts": 1, "payload": {"what": "stdout"}})).await;
    let t = wait_state(&r.url, "flood-stdout", "dead", T).await;
    let err = t["last_error"].as_str().unwrap_or_default();
    assert!(
        err.contains("wrote more than 1048576 bytes to stdout or stderr"),
        "{err}"
    );
    r.assert_alive();
    let rss = rss_bytes(r.pid());
    assert!(rss < 512 << 20, "the runner grew to {} MiB", rss >> 20);
    schedule(
        &r.url,
        json!({"plugin": "test-flood", "id": "print-after", "payload": {"what": "print"}}),
    )
    .await;
    wait_state(&r.url, "print-after", "done", T).await;
}

#[tokio::test]
async fn a_bad_ttl_fails_the_run_and_nothing_of_it_is_written() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    schedule(&r.url, json!({"plugin": "test-flood", "id": "bad-ttl", "max_attempts": 1, "payload": {"what": "one-of-each"}})).await;
    let t = wait_state(&r.url, "bad-ttl", "dead", T).await;
    let err = t["last_error"].as_str().unwrap();
    assert!(
        err.contains("the bad TTL was refused") && err.contains("a kv TTL is at most"),
        "{err}"
    );
    let mut c = redis.conn();
    let written: Option<String> = redis::cmd("GET")
        .arg("{eggtimer}:kv:test-flood:written")
        .query(&mut c)
        .unwrap();
    assert_eq!(written, None, "a write of the failed run was applied");
    assert!(read_events(&mut c, &["test-flood"], "flood").is_empty());
}

#[tokio::test]
async fn a_plugin_cancels_only_its_own_plugins_tasks() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    let far = now_ms() + 3_600_000;
    schedule(
        &r.url,
        json!([
            {"plugin": "coupon-expiry", "id": "other-team", "run_at": far,
             "payload": {"coupon_id": "c", "user_id": "u", "expires_at": far}},
            {"plugin": "test-flood", "id": "own", "run_at": far, "payload": {"what": "noop"}},
        ]),
    )
    .await;
    schedule(&r.url, json!([
        {"plugin": "test-flood", "id": "cancel-other", "payload": {"what": "cancel", "id": "other-team"}},
        {"plugin": "test-flood", "id": "cancel-own", "payload": {"what": "cancel", "id": "own"}},
    ]))
    .await;
    wait_state(&r.url, "cancel-other", "done", T).await;
    wait_state(&r.url, "cancel-own", "done", T).await;
    let (s, t) = call("GET", &format!("{}/v1/tasks/other-team", r.url), None).await;
    assert_eq!((s, &t["state"]), (200, &json!("scheduled")), "{t}");
    let (s, _) = call("GET", &format!("{}/v1/tasks/own", r.url), None).await;
    assert_eq!(s, 404, "the plugin's own task was cancelled");
}

#[tokio::test]
async fn many_plugins_share_a_small_instance_pool_without_exhausting_it() {
    let redis = RedisServer::start();
    let r = start(
        &redis,
        &["--workers", "4", "--prefetch", "4", "--warm-instances", "4"],
    );
    let noop = plugin_wasm("noop");
    let plugins = 24;
    for p in 0..plugins {
        let (s, b) = upload(&r.url, &format!("v{p}"), variant(&noop, p)).await;
        assert_eq!(s, 201, "{b}");
    }
    let specs: Vec<Value> = (0..plugins * 10)
        .map(|i| json!({"plugin": format!("v{}", i % plugins), "id": format!("t{i}"), "payload": null}))
        .collect();
    schedule(&r.url, json!(specs)).await;
    for i in 0..plugins * 10 {
        let t = wait_state(&r.url, &format!("t{i}"), "done", T).await;
        assert_eq!(t["attempts"], 1, "t{i} failed an attempt: {t}");
    }
}

/// A handler that panics for tasks whose id starts with "boom" and is done at once otherwise.
struct Panicky;

impl eggtimer::Handler for Panicky {
    fn handle(
        self: std::sync::Arc<Self>,
        task: eggtimer::store::Claimed,
        _host: std::sync::Arc<dyn eggtimer::TaskHost>,
    ) -> futures::future::BoxFuture<'static, eggtimer::Run> {
        Box::pin(async move {
            assert!(
                !task.task_id().starts_with("boom"),
                "the handler's host has a bug"
            );
            eggtimer::Run::outcome(eggtimer::Outcome::Done)
        })
    }
}

/// A panic inside a run fails that attempt (retried, then dead, with the panic's message) instead
/// of leaving its claim held and renewed for good; the runner goes on with other tasks.
#[tokio::test]
async fn a_run_that_panics_fails_its_attempt_and_nothing_else() {
    let redis = RedisServer::start();
    let store = eggtimer_tests::store_on(&redis, 4).await;
    let mut opts = eggtimer::RunnerOptions::default();
    opts.exec.retry_base_ms = 20;
    let runner = eggtimer::Runner::start(
        store.clone(),
        std::sync::Arc::new(Panicky),
        opts,
        std::sync::Arc::new(eggtimer::metrics::Metrics::default()),
    );
    let mut boom = eggtimer_tests::noop_task("boom-1", 0);
    boom.max_attempts = 2;
    let tasks = [boom, eggtimer_tests::noop_task("fine-1", 0)];
    store
        .schedule(&tasks, eggtimer::store::ScheduleMode::Upsert)
        .await
        .unwrap();
    let dead = eventually(Duration::from_secs(30), "boom-1 to be dead", || async {
        let t = store.get(&key("boom-1")).await.unwrap()?;
        (t.state == eggtimer::store::TaskState::Dead).then_some(t)
    })
    .await;
    assert_eq!(dead.attempts, 2);
    let error = dead.last_error.unwrap_or_default();
    assert!(
        error.contains("panicked") && error.contains("has a bug"),
        "{error}"
    );
    eventually(Duration::from_secs(30), "fine-1 to be done", || async {
        let t = store.get(&key("fine-1")).await.unwrap()?;
        (t.state == eggtimer::store::TaskState::Done).then_some(())
    })
    .await;
    assert!(
        runner.shutdown(Duration::from_secs(5)).await,
        "nothing left held"
    );
}
