//! Many runners and faults, with real processes: runner binaries and redis-server. Every task is
//! a `coupon-expiry` run that appends one event per execution, so the counts (missing,
//! duplicates) come from the plugin's own records, not from the runners' logs.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use eggtimer::store::{NewTask, ScheduleMode, StoreOptions};
use eggtimer::{RedisTarget, Store};
use eggtimer_tests::{
    RedisServer, RunnerProcess, call, events_key, eventually, now_ms, plugins_dir, read_events,
};
use serde_json::Value;

/// Task lease 2 s, shard lease 1 s: fast takeovers for the tests.
fn runner(redis: &RedisServer) -> RunnerProcess {
    let dir = plugins_dir();
    RunnerProcess::start(
        &redis.url(),
        &[
            "--plugins-dir",
            dir.to_str().unwrap(),
            "--lease",
            "2s",
            "--shard-lease",
            "1s",
            "--retry-base",
            "50ms",
        ],
    )
}

/// Schedules `per_tick` tasks every 20 ms (each due 0–500 ms later) until stopped; returns the ids.
fn load(
    store: Store,
    per_tick: usize,
    stop: Arc<AtomicBool>,
    failures: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut ids = Vec::new();
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            let batch: Vec<NewTask> = (0..per_tick)
                .map(|k| NewTask {
                    id: format!("t{}", n + k),
                    plugin: "coupon-expiry".into(),
                    payload: format!(
                        r#"{{"coupon_id":"c{}","user_id":"u","expires_at":0}}"#,
                        n + k
                    ),
                    run_at: now_ms() + ((n + k) % 500) as i64,
                    owner: None,
                    max_attempts: 20,
                    unique_for_ms: 0,
                    traceparent: None,
                    start_by: None,
                    ..Default::default()
                })
                .collect();
            match store.schedule(&batch, ScheduleMode::Upsert).await {
                Ok(_) => {
                    ids.extend(batch.into_iter().map(|t| t.id));
                    n += per_tick;
                }
                // Redis away: the caller would retry; nothing was acknowledged, so nothing is owed
                Err(_) => {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        ids
    })
}

/// (missing, duplicates) among `ids`, from the event stream, once nothing is pending.
async fn settle(
    redis: &RedisServer,
    store: &Store,
    ids: &[String],
    limit: Duration,
) -> (Vec<String>, usize) {
    eventually(limit, "every task to run", || async {
        let pending = store.shard_counts().await.ok()?;
        let busy = pending.iter().any(|c| c.scheduled + c.inflight > 0);
        let n = read_events(&mut redis.conn(), &["coupon-expiry"], "push").len();
        (!busy && n >= ids.len()).then_some(())
    })
    .await;
    let mut runs: HashMap<String, usize> = HashMap::new();
    for (task, _, _) in read_events(&mut redis.conn(), &["coupon-expiry"], "push") {
        *runs.entry(task).or_default() += 1;
    }
    let missing: Vec<String> = ids
        .iter()
        .filter(|id| !runs.contains_key(*id))
        .cloned()
        .collect();
    let duplicates = runs.values().map(|n| n - 1).sum();
    (missing, duplicates)
}

async fn store_for(redis: &RedisServer) -> Store {
    Store::open(RedisTarget::Single(redis.url()), StoreOptions::default())
        .await
        .unwrap()
}

async fn shards_of(url: &str) -> HashMap<String, Vec<u64>> {
    let (_, v) = call("GET", &format!("{url}/v1/runners"), None).await;
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|r| {
                    let shards = r["shards"]
                        .as_array()
                        .map(|s| s.iter().filter_map(Value::as_u64).collect())
                        .unwrap_or_default();
                    (r["address"].as_str().unwrap_or("").to_owned(), shards)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_runners_share_the_shards_and_survive_a_kill_9() {
    let redis = RedisServer::start();
    let mut runners = vec![runner(&redis), runner(&redis), runner(&redis)];
    // they split the 16 shards: 6 + 5 + 5, no shard twice
    let split = eventually(
        Duration::from_secs(10),
        "the shards to be split",
        || async {
            let m = shards_of(&runners[0].url).await;
            let mut all: Vec<u64> = m.values().flatten().copied().collect();
            all.sort();
            let mut sizes: Vec<usize> = m.values().map(Vec::len).collect();
            sizes.sort();
            (m.len() == 3 && sizes == [5, 5, 6] && all == (0..16).collect::<Vec<u64>>())
                .then_some(m)
        },
    )
    .await;
    let store = store_for(&redis).await;
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let generator = load(store.clone(), 20, stop.clone(), failures.clone());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // kill -9 one runner mid-stream
    let victim = runners.remove(1);
    let victim_shards = split[&victim.url].clone();
    let mut victim = victim;
    victim.kill();
    let killed_at = Instant::now();
    let takeover = eventually(
        Duration::from_secs(15),
        "the others to take the dead runner's shards over",
        || async {
            let m = shards_of(&runners[0].url).await;
            let mut all: Vec<u64> = m
                .iter()
                .filter(|(a, _)| *a != &victim.url)
                .flat_map(|(_, s)| s.clone())
                .collect();
            all.sort();
            (all == (0..16).collect::<Vec<u64>>()).then(|| killed_at.elapsed())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let ids = generator.await.unwrap();
    let (missing, duplicates) = settle(&redis, &store, &ids, Duration::from_secs(30)).await;
    eprintln!(
        "kill -9: {} tasks, shards {victim_shards:?} taken over after {takeover:?}, missing {}, duplicates {duplicates}",
        ids.len(),
        missing.len()
    );
    assert!(missing.is_empty(), "missing: {missing:?}");
    // the victim's runs that committed their event and not their outcome run again, but their
    // events count as committed: none twice
    assert_eq!(duplicates, 0, "events committed twice");
    assert_eq!(failures.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_loses_nothing_and_runs_nothing_twice() {
    let redis = RedisServer::start();
    let mut runners = [runner(&redis), runner(&redis), runner(&redis)];
    let store = store_for(&redis).await;
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let generator = load(store.clone(), 20, stop.clone(), failures.clone());
    for slot in runners.iter_mut() {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let code = slot.terminate();
        assert_eq!(
            code,
            Some(0),
            "a SIGTERM'd runner exits 0:\n{}",
            slot.log_text()
        );
        *slot = runner(&redis);
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::Relaxed);
    let ids = generator.await.unwrap();
    let (missing, duplicates) = settle(&redis, &store, &ids, Duration::from_secs(30)).await;
    // A second run of a task would write no second event (its effects are committed once), but
    // every claim counts an attempt, and these tasks never fail: more than one is a second run.
    let mut reruns = Vec::new();
    for id in &ids {
        let key = eggtimer::store::task_key("coupon-expiry", id);
        let t = store.get(&key).await.unwrap();
        let attempts = t.as_ref().map_or(0, |t| t.attempts);
        if attempts != 1 {
            reruns.push((id.clone(), attempts));
        }
    }
    eprintln!(
        "rolling restart: {} tasks, missing {}, duplicate events {duplicates}, run other than once {}",
        ids.len(),
        missing.len(),
        reruns.len()
    );
    assert!(missing.is_empty(), "missing: {missing:?}");
    assert_eq!(duplicates, 0);
    assert!(
        reruns.is_empty(),
        "(task, attempts) not run once: {reruns:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_for_ten_seconds_and_restarted_with_its_aof_loses_nothing() {
    let mut redis = RedisServer::start();
    let mut runners = [runner(&redis), runner(&redis)];
    let store = store_for(&redis).await;
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let generator = load(store.clone(), 20, stop.clone(), failures.clone());
    tokio::time::sleep(Duration::from_millis(1000)).await;
    redis.stop();
    tokio::time::sleep(Duration::from_secs(10)).await;
    redis.start_again();
    for r in &mut runners {
        r.assert_alive();
    }
    eventually(
        Duration::from_secs(20),
        "the runners to be ready again",
        || async {
            for r in &runners {
                let ok = eggtimer_tests::http()
                    .get(format!("{}/readyz", r.url))
                    .send()
                    .await
                    .is_ok_and(|resp| resp.status() == 200);
                if !ok {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    for r in &mut runners {
        r.assert_alive();
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Relaxed);
    let ids = generator.await.unwrap();
    let (missing, duplicates) = settle(&redis, &store, &ids, Duration::from_secs(40)).await;
    eprintln!(
        "redis down 10 s: {} tasks acknowledged, {} schedule calls refused while down, missing {}, duplicates {duplicates}",
        ids.len(),
        failures.load(Ordering::Relaxed),
        missing.len()
    );
    assert!(missing.is_empty(), "missing: {missing:?}");
    assert!(
        failures.load(Ordering::Relaxed) > 0,
        "the load generator saw Redis go away"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runners_whose_clocks_are_an_hour_off_split_the_shards_and_fire_on_time() {
    let redis = RedisServer::start();
    let dir = plugins_dir();
    let args = [
        "--plugins-dir",
        dir.to_str().unwrap(),
        "--shard-lease",
        "1s",
    ];
    let fast = RunnerProcess::start_with_env(
        &redis.url(),
        &args,
        &[("EGGTIMER_TEST_CLOCK_SKEW_MS", "3600000")],
    );
    let _slow = RunnerProcess::start_with_env(
        &redis.url(),
        &args,
        &[("EGGTIMER_TEST_CLOCK_SKEW_MS", "-3600000")],
    );
    eventually(
        Duration::from_secs(10),
        "the skewed runners to split the shards 8/8",
        || async {
            let m = shards_of(&fast.url).await;
            let sizes: Vec<usize> = m.values().map(Vec::len).collect();
            (m.len() == 2 && sizes == [8, 8]).then_some(())
        },
    )
    .await;
    let store = store_for(&redis).await;
    let base = now_ms();
    let tasks: Vec<NewTask> = (0..200)
        .map(|i| NewTask {
            id: format!("k{i}"),
            plugin: "coupon-expiry".into(),
            payload: r#"{"coupon_id":"c","user_id":"u","expires_at":0}"#.into(),
            run_at: base + 500 + i as i64 * 5,
            owner: None,
            max_attempts: 5,
            unique_for_ms: 0,
            traceparent: None,
            start_by: None,
            ..Default::default()
        })
        .collect();
    store.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    let due: HashMap<String, i64> = tasks.iter().map(|t| (t.id.clone(), t.run_at)).collect();
    eventually(Duration::from_secs(20), "all tasks to run", || async {
        (read_events(&mut redis.conn(), &["coupon-expiry"], "push").len() >= 200).then_some(())
    })
    .await;
    // each event's stream id is the Redis time of its XADD, after its handler started
    let v: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(events_key("coupon-expiry", "push"))
        .arg("-")
        .arg("+")
        .query(&mut redis.conn())
        .unwrap();
    // the skew really applies: each runner's heartbeat says how far its own clock is off
    // Redis's (its `last_seen` follows Redis's clock)
    let (_, listed) = call("GET", &format!("{}/v1/runners", fast.url), None).await;
    let mut offsets: Vec<i64> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["clock_ahead_ms"].as_i64().unwrap() + 1_800_000).div_euclid(3_600_000))
        .collect();
    offsets.sort();
    assert_eq!(
        offsets,
        [-1, 1],
        "the runners' clocks are an hour off each way: {listed}"
    );
    for (entry, fields) in v {
        let at: i64 = entry.split('-').next().unwrap().parse().unwrap();
        let id = &fields.iter().find(|(k, _)| k == "task_id").unwrap().1;
        let d = due[id];
        assert!(at >= d, "{id} ran {} ms early", d - at);
        assert!(at <= d + 2000, "{id} ran {} ms late", at - d);
    }
}

/// A runner started while Redis is down waits for it (both of its connections: the engine's and
/// the API's), then serves: a task scheduled through its API runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_started_before_redis_waits_for_it_then_serves() {
    let mut redis = RedisServer::start();
    eggtimer_tests::eggtimer_bin(); // built before the clock starts
    redis.stop();
    // Redis's port first accepts and closes a connection: the runner is seen trying
    let port = std::net::TcpListener::bind(("127.0.0.1", redis.port)).unwrap();
    let url = redis.url();
    // the start returns once the runner listens, which it does only after Redis is back
    let starting = tokio::task::spawn_blocking(move || {
        let dir = plugins_dir();
        RunnerProcess::start(&url, &["--plugins-dir", dir.to_str().unwrap()])
    });
    let tried = tokio::task::spawn_blocking(move || port.accept().map(drop));
    tokio::time::timeout(Duration::from_secs(30), tried)
        .await
        .expect("the runner to try Redis's port within 30 s")
        .unwrap()
        .unwrap();
    // the port closed (the listener is gone): refused for a while, as a Redis that is down
    tokio::time::sleep(Duration::from_secs(3)).await;
    redis.start_again();
    let mut r = starting.await.unwrap();
    r.assert_alive();
    assert!(
        r.log_text().contains("Redis is not reachable yet"),
        "the runner tried Redis while it was down:\n{}",
        r.log_text()
    );
    eggtimer_tests::post_tasks(
        &r.url,
        serde_json::json!({"plugin": "noop", "id": "after-redis", "delay_ms": 0}),
    )
    .await;
    eggtimer_tests::wait_state(&r.url, "after-redis", "done", Duration::from_secs(20)).await;
}

/// A runner whose own clock is two minutes ahead computes a new recurring schedule's first firing
/// and drives it by Redis's clock: the first firing comes within seconds, not two minutes late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_with_a_clock_off_fires_recurring_schedules_on_time() {
    let redis = RedisServer::start();
    let dir = plugins_dir();
    let r = RunnerProcess::start_with_env(
        &redis.url(),
        &["--plugins-dir", dir.to_str().unwrap()],
        &[("EGGTIMER_TEST_CLOCK_SKEW_MS", "120000")],
    );
    let put_at = now_ms();
    let (s, b) = call(
        "PUT",
        &format!("{}/v1/schedules/tick", r.url),
        Some(serde_json::json!({"plugin": "noop", "every_ms": 1000})),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    let next = b["next_run_at"].as_i64().unwrap();
    assert!(
        (put_at..=put_at + 2_000).contains(&next),
        "the first firing at {next}, {} ms from now",
        next - put_at
    );
    eventually(
        Duration::from_secs(10),
        "a firing of tick to run",
        || async {
            let (_, page) = call(
                "GET",
                &format!("{}/v1/tasks?plugin=noop&state=done", r.url),
                None,
            )
            .await;
            page["tasks"]
                .as_array()
                .is_some_and(|t| {
                    t.iter()
                        .any(|t| t["id"].as_str().unwrap_or("").starts_with("tick@"))
                })
                .then_some(())
        },
    )
    .await;
    // a task scheduled with delay_ms is due that long after now by Redis's clock
    let (s, b) = call(
        "POST",
        &format!("{}/v1/tasks", r.url),
        Some(serde_json::json!({"plugin": "noop", "delay_ms": 5000})),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    // (the runner's clock follows Redis's to within its reading's error: half the reading's round
    // trip, a few ms; a clock not followed would be 120 s off)
    let due = b["run_at"].as_i64().unwrap() - now_ms();
    assert!((3_000..=5_050).contains(&due), "due in {due} ms");
}
