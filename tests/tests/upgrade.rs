//! Upgrades lose nothing: what the last release wrote keeps working with this build, and data of
//! the builds before 0.1.0 is refused with what to do.
//!
//! The last release's runner is built from git history (`released_eggtimer`), writes tasks in
//! every state, an owner's tasks, a recurring schedule, plugin settings, plugin versions and kv
//! data; it is killed -9 with a task running; this build's runner then takes the namespace over.

use std::time::Duration;

use eggtimer::store::{RedisTarget, StoreOptions};
use eggtimer_tests::{
    RedisServer, RunnerProcess, call, eventually, now_ms, plugin_wasm, plugins_dir, post_tasks,
    read_events, released_eggtimer, upload, wait_state,
};
use serde_json::json;

const MINUTE: Duration = Duration::from_secs(60);

/// The flags both builds run with: quick retries, done tasks kept an hour, time for a slow run.
const FLAGS: [&str; 6] = [
    "--retry-base",
    "50ms",
    "--keep-done",
    "1h",
    "--plugin-timeout",
    "20s",
];

/// The ids of one page of `GET /v1/tasks?{query}`.
async fn found(base: &str, query: &str) -> Vec<String> {
    let (s, b) = call("GET", &format!("{base}/v1/tasks?{query}"), None).await;
    assert_eq!(s, 200, "{b}");
    b["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Writes with the last release: returns the time a far task is due.
async fn write_with_the_release(base: &str) -> i64 {
    let far = now_ms() + 3_600_000;
    // scheduled, two of them one owner's
    post_tasks(
        base,
        json!([
            {"plugin": "coupon-expiry", "id": "later", "owner": "u1", "run_at": far,
             "payload": {"coupon_id": "c1", "user_id": "u1", "expires_at": far + 7_200_000}},
            {"plugin": "auto-feed", "id": "meal", "owner": "u1", "run_at": far + 1000,
             "payload": {"pet_id": "p1", "user_id": "u1"}},
            {"plugin": "noop", "id": "plain-later", "run_at": far + 2000},
        ]),
    )
    .await;
    // done, dead, and a finished task inside its dedup window
    post_tasks(base, json!({"plugin": "noop", "id": "done-1"})).await;
    post_tasks(
        base,
        json!({"plugin": "test-panic", "id": "dead-1", "max_attempts": 1}),
    )
    .await;
    post_tasks(
        base,
        json!({"plugin": "noop", "id": "once", "unique_for_ms": 3_600_000}),
    )
    .await;
    // kv data: an order cancelled once
    post_tasks(
        base,
        json!({"plugin": "order-cancel", "id": "cancel-o1", "payload": {"order_id": "o1", "user_id": "u1"}}),
    )
    .await;
    for (id, state) in [
        ("done-1", "done"),
        ("dead-1", "dead"),
        ("once", "done"),
        ("cancel-o1", "done"),
    ] {
        wait_state(base, id, state, MINUTE).await;
    }
    // plugin settings: a paused plugin with a parked task, a concurrency limit
    let (s, b) = call("POST", &format!("{base}/v1/plugins/test-sleep/pause"), None).await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = call(
        "PATCH",
        &format!("{base}/v1/plugins/noop"),
        Some(json!({"max_concurrency": 3})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    post_tasks(
        base,
        json!({"plugin": "test-sleep", "id": "parked", "payload": {"ms": 1, "tag": "parked"}}),
    )
    .await;
    // a recurring schedule
    let (s, b) = call(
        "PUT",
        &format!("{base}/v1/schedules/tick"),
        Some(json!({"plugin": "noop", "every_ms": 1000})),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    // two versions of one plugin
    assert_eq!(upload(base, "twin", plugin_wasm("noop")).await.0, 201);
    assert_eq!(
        upload(base, "twin", plugin_wasm("coupon-expiry")).await.0,
        201
    );
    // a plugin without a payload check, as every plugin built for the release is
    assert_eq!(
        upload(base, "plain", plugin_wasm("noop-plain")).await.0,
        201
    );
    // a task running when the release's runner dies
    assert_eq!(upload(base, "slow", plugin_wasm("test-sleep")).await.0, 201);
    post_tasks(
        base,
        json!({"plugin": "slow", "id": "running", "payload": {"ms": 3000, "tag": "running"}}),
    )
    .await;
    wait_state(base, "running", "running", MINUTE).await;
    far
}

#[tokio::test]
async fn what_the_last_release_wrote_keeps_working() {
    let (release, bin) = released_eggtimer();
    let redis = RedisServer::start();
    // the plugins every release can host (0.1.0 could not host webhook, which calls http-send and
    // secret, nor bench-record, which calls event and batch; 0.2.0 can't host one that imports
    // schedule-with-priority: every Python and TypeScript plugin built now, and test-flood)
    let dir = eggtimer_tests::temp_dir("release-plugins");
    let newer = b"schedule-with-priority";
    for e in std::fs::read_dir(plugins_dir()).unwrap() {
        let e = e.unwrap();
        let bytes = std::fs::read(e.path()).unwrap();
        let imports_newer = bytes.windows(newer.len()).any(|w| w == newer);
        if e.file_name() != "webhook.wasm" && e.file_name() != "bench-record.wasm" && !imports_newer
        {
            std::os::unix::fs::symlink(e.path(), dir.join(e.file_name())).unwrap();
        }
    }
    let mut args = vec!["--plugins-dir", dir.to_str().unwrap()];
    args.extend(FLAGS);
    let mut old = RunnerProcess::start_build(&bin, &redis.url(), &args);
    let far = write_with_the_release(&old.url).await;
    old.kill();
    let upgraded_at = now_ms();

    // this build with its far tier on: what the release wrote stays live
    let mut flags = FLAGS.to_vec();
    flags.extend(["--far-horizon", "10m"]);
    let new = RunnerProcess::start(&redis.url(), &flags);
    let base = &new.url;
    // the task that was running is run again (its claim's lease ends) and finishes once
    wait_state(base, "running", "done", MINUTE).await;
    let mut c = redis.conn();
    let slept = read_events(&mut c, &["slow"], "sleep");
    assert_eq!(slept.len(), 1, "{release}: {slept:?}");
    // scheduled tasks keep their time and owner
    let t = call("GET", &format!("{base}/v1/tasks/later"), None).await.1;
    assert_eq!(
        (t["state"].as_str(), t["run_at"].as_i64()),
        (Some("scheduled"), Some(far))
    );
    // scheduling its id again for its plugin replaces it, as before (ids now belong to their
    // plugin; the release stored them bare)
    post_tasks(
        base,
        json!({"plugin": "coupon-expiry", "id": "later", "owner": "u1", "run_at": far + 5,
            "payload": {"coupon_id": "c1", "user_id": "u1", "expires_at": far + 7_200_000}}),
    )
    .await;
    let t = call("GET", &format!("{base}/v1/tasks/later"), None).await.1;
    assert_eq!(
        (t["state"].as_str(), t["run_at"].as_i64()),
        (Some("scheduled"), Some(far + 5)),
        "{t}"
    );
    // a plain task the release wrote an hour ahead stays live; scheduled again, it goes far, and
    // reads as before
    let far_slots = |c: &mut redis::Connection| -> usize {
        let k: Vec<String> = redis::cmd("KEYS").arg("*:tasks:f:*").query(c).unwrap();
        k.len()
    };
    assert_eq!(
        far_slots(&mut c),
        0,
        "{release}: nothing the release wrote moved far"
    );
    let t = call("GET", &format!("{base}/v1/tasks/plain-later"), None)
        .await
        .1;
    assert_eq!(t["run_at"].as_i64(), Some(far + 2000), "{release}: {t}");
    post_tasks(
        base,
        json!({"plugin": "noop", "id": "plain-later", "run_at": far + 3000}),
    )
    .await;
    assert_eq!(
        far_slots(&mut c),
        1,
        "{release}: scheduled again, it went far"
    );
    let t = call("GET", &format!("{base}/v1/tasks/plain-later"), None)
        .await
        .1;
    assert_eq!(
        (t["state"].as_str(), t["run_at"].as_i64()),
        (Some("scheduled"), Some(far + 3000)),
        "{release}: {t}"
    );
    let (s, b) = call("GET", &format!("{base}/v1/owners/u1/tasks"), None).await;
    assert_eq!(s, 200, "{b}");
    let ids: Vec<&str> = b
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["later", "meal"]);
    // the owner's counts per plugin, the release's task among them (tasks the release wrote are
    // not in max_pending_per_owner's count, `pending`: it counts records as they are created)
    let (s, b) = call("GET", &format!("{base}/v1/owners/u1/stats"), None).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        b["plugins"],
        json!([
            {"plugin": "auto-feed", "scheduled": 1, "running": 0, "dead": 0, "pending": 0},
            {"plugin": "coupon-expiry", "scheduled": 1, "running": 0, "dead": 0, "pending": 0}
        ]),
        "{release}: {b}"
    );
    // the release's owned task that nothing rescheduled gets its owner's head, in the
    // background, so owners take turns over it as over new ones
    eventually(
        MINUTE,
        "the release's owned task has its owner's head",
        || async {
            let mut c = redis.conn();
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("*:byowner:due")
                .query(&mut c)
                .unwrap();
            let mut heads: Vec<String> = Vec::new();
            for k in keys {
                heads.extend(
                    redis::cmd("ZRANGE")
                        .arg(&k)
                        .arg(0)
                        .arg(-1)
                        .query::<Vec<String>>(&mut c)
                        .unwrap(),
                );
            }
            heads.iter().any(|h| h == "auto-feed\0u1").then_some(())
        },
    )
    .await;
    assert_eq!(
        found(base, "state=scheduled&plugin=coupon-expiry").await,
        ["later"]
    );
    // an owner-wide shift moves both, and the one brought forward runs
    let (s, b) = call(
        "POST",
        &format!("{base}/v1/owners/u1/shift"),
        Some(json!({"shift_ms": -(far - now_ms()) - 1000})),
    )
    .await;
    assert_eq!((s, &b["shifted"]), (200, &json!(2)), "{b}");
    wait_state(base, "later", "done", MINUTE).await;
    wait_state(base, "meal", "done", MINUTE).await;
    // done and dead tasks are still there
    wait_state(base, "done-1", "done", MINUTE).await;
    let dead = wait_state(base, "dead-1", "dead", MINUTE).await;
    assert!(
        dead["last_error"].as_str().unwrap().contains("panic"),
        "{dead}"
    );
    assert_eq!(found(base, "state=dead").await, ["dead-1"]);
    let (s, _) = call("DELETE", &format!("{base}/v1/dead/dead-1"), None).await;
    assert_eq!(s, 204);
    // the dedup window holds
    let (s, b) = call(
        "POST",
        &format!("{base}/v1/tasks"),
        Some(json!({"plugin": "noop", "id": "once", "unique_for_ms": 3_600_000})),
    )
    .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (409, Some("duplicate")),
        "{b}"
    );
    // kv: the order cancelled before is not cancelled again
    post_tasks(
        base,
        json!({"plugin": "order-cancel", "id": "cancel-o1-again", "payload": {"order_id": "o1", "user_id": "u1"}}),
    )
    .await;
    wait_state(base, "cancel-o1-again", "done", MINUTE).await;
    // the event the release emitted, read through the API (0.1.0 emitted into the topic's
    // shared stream, later builds into the plugin's own: the API reads both)
    let (s, ev) = call("GET", &format!("{base}/v1/events/order"), None).await;
    assert_eq!(
        (s, ev[0]["plugin"].as_str(), ev.as_array().map(Vec::len)),
        (200, Some("order-cancel"), Some(1)),
        "{release}: the event it emitted, read through the API: {ev}"
    );
    // settings: still paused (its task parked, no attempt used) and limited; resume runs it
    let p = call("GET", &format!("{base}/v1/plugins/test-sleep"), None)
        .await
        .1;
    assert_eq!(p["paused"], true, "{p}");
    let parked = call("GET", &format!("{base}/v1/tasks/parked"), None)
        .await
        .1;
    assert_eq!(
        (parked["state"].as_str(), parked["attempts"].as_i64()),
        (Some("scheduled"), Some(0))
    );
    let p = call("GET", &format!("{base}/v1/plugins/noop"), None)
        .await
        .1;
    assert_eq!(p["max_concurrency"], 3, "{p}");
    let (s, b) = call(
        "POST",
        &format!("{base}/v1/plugins/test-sleep/resume"),
        None,
    )
    .await;
    assert_eq!(s, 200, "{b}");
    wait_state(base, "parked", "done", MINUTE).await;
    // the recurring schedule fires on
    eventually(MINUTE, "a firing of tick after the upgrade", || async {
        let (_, b) = call(
            "GET",
            &format!("{base}/v1/tasks?plugin=noop&state=done&limit=1000"),
            None,
        )
        .await;
        b["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| {
                t["id"].as_str().unwrap().starts_with("tick@")
                    && t["run_at"].as_i64().unwrap() > upgraded_at
            })
            .then_some(())
    })
    .await;
    // plugin versions and their history: a rollback goes to the first
    let twin = call("GET", &format!("{base}/v1/plugins/twin"), None)
        .await
        .1;
    assert_eq!(twin["version"], 2, "{twin}");
    let (s, b) = call("POST", &format!("{base}/v1/plugins/twin/rollback"), None).await;
    assert_eq!((s, &b["version"]), (200, &json!(1)), "{b}");
    // the plugin the release stored without a check takes any payload, as it did
    eventually(MINUTE, "plain to be loaded, without a check", || async {
        let (_, p) = call("GET", &format!("{base}/v1/plugins/plain"), None).await;
        (p["check"] == false).then_some(())
    })
    .await;
    let (s, b) = call(
        "POST",
        &format!("{base}/v1/tasks"),
        Some(json!({"plugin": "plain", "delay_ms": 3_600_000, "payload": {"anything": [1]}})),
    )
    .await;
    assert_eq!(s, 201, "{b}");
}

#[tokio::test]
async fn data_of_a_build_before_the_release_is_refused_naming_what_to_do() {
    let redis = RedisServer::start();
    // a shard as builds before 0.1.0 left it: a task record, the one `due` ZSET, no layout
    let mut c = redis.conn();
    let _: () = redis::pipe()
        .cmd("HSET")
        .arg("{eggtimer}:meta")
        .arg("shards")
        .arg(16)
        .cmd("HSET")
        .arg("{eggtimer:3}:tasks")
        .arg("t1")
        .arg("s\t1\t0\t5\t1\t\tnoop\t\t\t{}")
        .cmd("ZADD")
        .arg("{eggtimer:3}:due")
        .arg(1)
        .arg("t1")
        .query(&mut c)
        .unwrap();
    let opts = StoreOptions::default();
    let err = eggtimer::Store::open(RedisTarget::parse(&redis.url()).unwrap(), opts)
        .await
        .err()
        .expect("the store refuses the namespace");
    let text = format!("{err:#}");
    assert!(text.contains("shard 3"), "{text}");
    assert!(text.contains("start eggtimer 0.1.0 on it once"), "{text}");
    // the runner says the same and exits
    let mut child = std::process::Command::new(eggtimer_tests::eggtimer_bin())
        .args([
            "serve",
            "--redis",
            &redis.url(),
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(eggtimer_tests::temp_dir("refused"))
        .env_remove("EGGTIMER_TOKEN")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = eventually(MINUTE, "the runner to exit", || {
        let s = child.try_wait().unwrap();
        async move { s }
    })
    .await;
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("start eggtimer 0.1.0 on it once"), "{err}");
    // nothing was written to it
    let layout: Option<String> = redis::cmd("HGET")
        .arg("{eggtimer:3}:meta")
        .arg("layout")
        .query(&mut c)
        .unwrap();
    assert_eq!(layout, None);
}
