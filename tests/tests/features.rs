//! What job-runner users ask for most: recurring schedules, pausing a plugin, finding tasks,
//! bulk actions, a per-plugin concurrency limit, a dedup window. Real runner processes, a real
//! redis-server, real wasm plugins; counts come from the plugins' event streams.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use eggtimer_tests::{
    RedisServer, RunnerProcess, call, eventually, now_ms, read_stream, read_stream_timed,
    wait_state,
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);

fn start(redis: &RedisServer, extra: &[&str]) -> RunnerProcess {
    let mut args = vec!["--retry-base", "50ms"];
    args.extend_from_slice(extra);
    RunnerProcess::with_plugins(redis, &args)
}

fn coupon(id: &str, due: i64) -> Value {
    json!({"plugin": "coupon-expiry", "id": id, "run_at": due,
           "payload": {"coupon_id": id, "user_id": "u", "expires_at": due + 7_200_000}})
}

async fn post_tasks(base: &str, specs: Value) {
    let (s, b) = call("POST", &format!("{base}/v1/tasks"), Some(specs)).await;
    assert_eq!(s, 201, "{b}");
}

/// The shards a runner owns, from the namespace's runner list.
async fn shards_of(r: &RunnerProcess) -> Vec<u64> {
    let (s, list) = call("GET", &format!("{}/v1/runners", r.url), None).await;
    assert_eq!(s, 200, "{list}");
    list.as_array()
        .unwrap()
        .iter()
        .find(|x| x["address"] == format!("http://127.0.0.1:{}", r.port))
        .map(|x| {
            x["shards"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_u64().unwrap())
                .collect()
        })
        .unwrap_or_default()
}

/// The index of the runner that owns the home shard of schedule `id` (and so drives it).
async fn driver(id: &str, rs: &[RunnerProcess]) -> usize {
    let home = u64::from(eggtimer::store::shard_of(id, 16));
    for (i, r) in rs.iter().enumerate() {
        if shards_of(r).await.contains(&home) {
            return i;
        }
    }
    panic!("nobody drives {id}")
}

/// Every-second schedules on three runners, over a graceful restart of one runner and a kill -9
/// of another (each the driver of a schedule): every firing between the first and the last is
/// created and run exactly once.
#[tokio::test]
async fn schedules_fire_every_firing_once_over_a_restart_and_a_kill() {
    let redis = RedisServer::start();
    let mut runners: Vec<RunnerProcess> = (0..3).map(|_| start(&redis, &[])).collect();
    let base = runners[0].url.clone();
    let ids = ["every-a", "every-b", "every-c"];
    for id in ids {
        let (s, b) = call(
            "PUT",
            &format!("{base}/v1/schedules/{id}"),
            Some(
                json!({"plugin": "coupon-expiry", "every_ms": 1000, "overlap": "allow",
                        "payload": {"coupon_id": id, "user_id": "u", "expires_at": 0}}),
            ),
        )
        .await;
        assert_eq!(s, 201, "{b}");
        // the same definition again changes nothing
        let (s2, b2) = call(
            "PUT",
            &format!("{base}/v1/schedules/{id}"),
            Some(
                json!({"plugin": "coupon-expiry", "every_ms": 1000, "overlap": "allow",
                        "payload": {"coupon_id": id, "user_id": "u", "expires_at": 0}}),
            ),
        )
        .await;
        assert_eq!((s2, &b2["next_run_at"]), (200, &b["next_run_at"]), "{b2}");
    }
    // membership settles: every shard owned
    eventually(T, "all shards owned", || async {
        let mut n = 0;
        for r in &runners {
            n += shards_of(r).await.len();
        }
        (n == 16).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    // restart (SIGTERM) the runner driving every-a, kill -9 the one driving every-b
    let a = driver("every-a", &runners).await;
    assert!(
        runners[a].terminate().is_some(),
        "the runner stopped on SIGTERM"
    );
    runners[a] = start(&redis, &[]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let b = driver("every-b", &runners).await;
    runners[b].kill();
    tokio::time::sleep(Duration::from_secs(12)).await;
    for id in ids {
        let (s, _) = call(
            "DELETE",
            &format!("{}/v1/schedules/{id}", runners[(b + 1) % 3].url),
            None,
        )
        .await;
        assert_eq!(s, 204);
    }
    let live = runners[(b + 1) % 3].url.clone();
    // every firing created runs (the killed runner's tasks after their leases)
    eventually(T, "every firing done", || async {
        let (_, page) = call(
            "GET",
            &format!("{live}/v1/tasks?plugin=coupon-expiry&state=scheduled&limit=1000"),
            None,
        )
        .await;
        let (_, running) = call(
            "GET",
            &format!("{live}/v1/tasks?plugin=coupon-expiry&state=running&limit=1000"),
            None,
        )
        .await;
        (page["tasks"].as_array().unwrap().is_empty()
            && running["tasks"].as_array().unwrap().is_empty())
        .then_some(())
    })
    .await;
    let events = read_stream(&mut redis.conn(), "{eggtimer}:events:push");
    let mut runs: HashMap<String, usize> = HashMap::new();
    for (task, _, _) in &events {
        *runs.entry(task.clone()).or_default() += 1;
    }
    let doubled: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "firings that ran twice: {doubled:?}");
    for id in ids {
        let mut times: Vec<i64> = runs
            .keys()
            .filter_map(|t| t.strip_prefix(&format!("{id}@")))
            .map(|t| t.parse().unwrap())
            .collect();
        times.sort();
        assert!(
            times.len() >= 20,
            "{id} fired {} times: {times:?}",
            times.len()
        );
        let missing: Vec<i64> = times
            .windows(2)
            .filter(|w| w[1] - w[0] != 1000)
            .map(|w| w[0] + 1000)
            .collect();
        assert!(
            missing.is_empty(),
            "{id}: firings lost after {missing:?} (of {times:?})"
        );
        assert!(
            times.iter().all(|t| t % 1000 == 0),
            "{id}: off its every_ms grid"
        );
    }
}

/// Cron in a time zone with daylight saving time, as the API reports the next fire times.
#[tokio::test]
async fn cron_schedules_follow_dst_in_their_time_zone() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    let ny = |y: i32, mo: u32, d: u32, h: u32, mi: u32| -> i64 {
        use chrono::TimeZone;
        chrono_tz::America::New_York
            .with_ymd_and_hms(y, mo, d, h, mi, 0)
            .earliest()
            .unwrap()
            .timestamp_millis()
    };
    // 2027-03-14: clocks jump from 02:00 to 03:00 in New York
    let (s, b) = call(
        "PUT",
        &format!("{}/v1/schedules/spring", r.url),
        Some(
            json!({"plugin": "coupon-expiry", "cron": "30 2 * * *", "tz": "America/New_York",
                    "start_at": ny(2027, 3, 13, 0, 0)}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(b["next_run_at"], ny(2027, 3, 13, 2, 30));
    let (_, g) = call("GET", &format!("{}/v1/schedules/spring", r.url), None).await;
    let up: Vec<i64> = g["upcoming"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(up.len(), 5, "{g}");
    assert_eq!(
        &up[..3],
        &[
            ny(2027, 3, 13, 2, 30),
            ny(2027, 3, 14, 3, 0),
            ny(2027, 3, 15, 2, 30)
        ],
        "the 02:30 that does not exist fires once, at 03:00"
    );
    // 2027-11-07: clocks go back from 02:00 to 01:00; 01:30 happens twice
    let (s, _) = call(
        "PUT",
        &format!("{}/v1/schedules/fall", r.url),
        Some(
            json!({"plugin": "coupon-expiry", "cron": "30 1 * * *", "tz": "America/New_York",
                    "start_at": ny(2027, 11, 6, 0, 0)}),
        ),
    )
    .await;
    assert_eq!(s, 201);
    let (_, g) = call("GET", &format!("{}/v1/schedules/fall", r.url), None).await;
    let up: Vec<i64> = g["upcoming"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(up[1], ny(2027, 11, 7, 1, 30), "the first 01:30");
    assert_eq!(
        up[2] - up[1],
        25 * 3_600_000,
        "no second firing in the repeated hour: {up:?}"
    );
    // the list, pause and resume
    let (_, list) = call("GET", &format!("{}/v1/schedules", r.url), None).await;
    assert_eq!(list.as_array().unwrap().len(), 2, "{list}");
    let (s, p) = call("POST", &format!("{}/v1/schedules/fall/pause", r.url), None).await;
    assert_eq!(
        (s, &p["paused"], &p["next_run_at"]),
        (200, &json!(true), &Value::Null)
    );
    let (s, p) = call("POST", &format!("{}/v1/schedules/fall/resume", r.url), None).await;
    assert_eq!((s, &p["paused"]), (200, &json!(false)));
    assert_eq!(p["next_run_at"], ny(2027, 11, 6, 1, 30));
    // bad input names the field: 400 malformed, 422 a cron or time zone that does not exist
    for (body, field, status) in [
        (
            json!({"plugin": "coupon-expiry", "cron": "61 * * * *"}),
            "cron",
            422,
        ),
        (
            json!({"plugin": "coupon-expiry", "cron": "* * * * *", "tz": "Mars/Base"}),
            "tz",
            422,
        ),
        (
            json!({"plugin": "coupon-expiry", "cron": "* * * * *", "every_ms": 1000}),
            "exactly one",
            400,
        ),
        (
            json!({"plugin": "coupon-expiry", "every_ms": 5}),
            "every_ms",
            400,
        ),
    ] {
        let (s, e) = call("PUT", &format!("{}/v1/schedules/bad", r.url), Some(body)).await;
        assert_eq!(s, status, "{e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(field),
            "{e}"
        );
    }
}

/// A paused plugin's tasks wait without using attempts and without the pollers spinning; resume
/// runs every overdue one, in due order.
#[tokio::test]
async fn pause_holds_a_plugins_tasks_and_resume_runs_them_in_due_order() {
    let redis = RedisServer::start();
    let r = start(&redis, &["--shards", "1", "--workers", "1"]);
    let (s, p) = call(
        "POST",
        &format!("{}/v1/plugins/coupon-expiry/pause", r.url),
        None,
    )
    .await;
    assert_eq!((s, &p["paused"]), (200, &json!(true)), "{p}");
    let t0 = now_ms();
    // 30 overdue tasks, scheduled in shuffled order, and another plugin's task
    let mut specs: Vec<Value> = (0..30)
        .map(|i| coupon(&format!("p{i:02}"), t0 - 3000 + i * 50))
        .collect();
    specs.reverse();
    specs.swap(3, 17);
    post_tasks(&r.url, json!(specs)).await;
    post_tasks(
        &r.url,
        json!({"plugin": "order-cancel", "id": "other", "payload": {"order_id": "o1", "user_id": "u"}}),
    )
    .await;
    wait_state(&r.url, "other", "done", T).await;
    // paused: nothing ran, nothing used an attempt, and Redis is left alone
    let calls = |c: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("stats").query(c).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let mut c = redis.conn();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = calls(&mut c);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = calls(&mut c) - before;
    assert!(
        during < 60,
        "{during} Redis commands in 2 s while the only due tasks are paused: the pollers spin"
    );
    assert!(read_stream(&mut c, "{eggtimer}:events:push").is_empty());
    let (_, t) = call("GET", &format!("{}/v1/tasks/p00", r.url), None).await;
    assert_eq!(
        (&t["state"], &t["attempts"]),
        (&json!("scheduled"), &json!(0)),
        "{t}"
    );
    let (_, list) = call("GET", &format!("{}/v1/plugins", r.url), None).await;
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "coupon-expiry" && p["paused"] == true),
        "{list}"
    );
    // scheduling still works while paused
    post_tasks(&r.url, json!([coupon("p30", t0 - 3000 + 30 * 50)])).await;
    let (s, _) = call(
        "POST",
        &format!("{}/v1/plugins/coupon-expiry/resume", r.url),
        None,
    )
    .await;
    assert_eq!(s, 200);
    eventually(T, "31 reminders", || async {
        (read_stream(&mut redis.conn(), "{eggtimer}:events:push").len() >= 31).then_some(())
    })
    .await;
    let order: Vec<String> = read_stream(&mut c, "{eggtimer}:events:push")
        .into_iter()
        .map(|(id, _, _)| id)
        .collect();
    let want: Vec<String> = (0..31).map(|i| format!("p{i:02}")).collect();
    assert_eq!(order, want, "overdue tasks run once each, in due order");
}

/// 10,000 tasks, paged through with filters: each seen exactly once, in order.
#[tokio::test]
async fn find_pages_through_ten_thousand_tasks_with_filters() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    let t0 = now_ms() + 3_600_000;
    let specs: Vec<Value> = (0..10_000)
        .map(|i| {
            let plugin = if i % 5 < 3 {
                "coupon-expiry"
            } else {
                "order-cancel"
            };
            // many share a due time, so the cursor must page within ties
            json!({"plugin": plugin, "id": format!("t{i}"), "run_at": t0 + (i / 7) * 1000,
                   "owner": format!("u{}", i % 10), "payload": {}})
        })
        .collect();
    post_tasks(&r.url, json!(specs)).await;
    async fn walk(base: &str, query: &str) -> Vec<Value> {
        let mut seen = Vec::new();
        let mut cursor = String::new();
        for _ in 0..1000 {
            let url = format!("{base}/v1/tasks?{query}&limit=700&cursor={cursor}");
            let (s, page) = call("GET", &url, None).await;
            assert_eq!(s, 200, "{page}");
            seen.extend(page["tasks"].as_array().unwrap().iter().cloned());
            match page["next_cursor"].as_str() {
                Some(c) => cursor = c.to_owned(),
                None => return seen,
            }
        }
        panic!("the walk did not end");
    }
    let check = |seen: &[Value], want: usize, what: &str| {
        let ids: HashSet<&str> = seen.iter().map(|t| t["id"].as_str().unwrap()).collect();
        assert_eq!(seen.len(), want, "{what}: tasks seen");
        assert_eq!(ids.len(), want, "{what}: each exactly once");
        let dues: Vec<i64> = seen.iter().map(|t| t["run_at"].as_i64().unwrap()).collect();
        assert!(
            dues.windows(2).all(|w| w[0] <= w[1]),
            "{what}: soonest first"
        );
    };
    let all = walk(&r.url, "state=scheduled").await;
    check(&all, 10_000, "all scheduled");
    let coupons = walk(&r.url, "plugin=coupon-expiry&state=scheduled").await;
    check(&coupons, 6_000, "by plugin");
    assert!(coupons.iter().all(|t| t["plugin"] == "coupon-expiry"));
    let owner = walk(&r.url, "owner=u3&state=scheduled").await;
    check(&owner, 1_000, "by owner");
    let both = walk(&r.url, "owner=u3&plugin=order-cancel").await;
    assert!(
        both.iter()
            .all(|t| t["plugin"] == "order-cancel" && t["owner"] == "u3")
    );
    // u3: i % 10 == 3, so i % 5 == 3: all order-cancel
    check(&both, 1_000, "by owner and plugin");
    let (lo, hi) = (t0 + 100_000, t0 + 199_999);
    let ranged = walk(
        &r.url,
        &format!("plugin=coupon-expiry&state=scheduled&due_after={lo}&due_before={hi}"),
    )
    .await;
    let want = (0..10_000)
        .filter(|i| i % 5 < 3 && (t0 + (i / 7) * 1000) >= lo && (t0 + (i / 7) * 1000) <= hi)
        .count();
    check(&ranged, want, "by due range");
    // bad filters name the field
    for (q, field) in [
        ("state=later", "state"),
        ("due_after=x", "due_after"),
        ("cursor=zz", "cursor"),
        ("limit=0", "limit"),
    ] {
        let (s, e) = call("GET", &format!("{}/v1/tasks?{q}", r.url), None).await;
        assert_eq!(s, 400, "{e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(field),
            "{e}"
        );
    }
    // bulk: cancel an owner's tasks of one plugin, then all of another owner's
    let (s, b) = call(
        "DELETE",
        &format!("{}/v1/owners/u1/tasks?plugin=order-cancel", r.url),
        None,
    )
    .await;
    assert_eq!(
        (s, &b["cancelled"]),
        (200, &json!(0)),
        "u1 has only coupon-expiry tasks"
    );
    let (s, b) = call("DELETE", &format!("{}/v1/owners/u1/tasks", r.url), None).await;
    assert_eq!((s, &b["cancelled"]), (200, &json!(1000)));
    let left = walk(&r.url, "owner=u1").await;
    assert!(left.is_empty(), "{} of u1's tasks left", left.len());
}

/// Dead letters replayed or dropped all at once, with the counts.
#[tokio::test]
async fn dead_letters_are_retried_and_dropped_in_bulk() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    let specs: Vec<Value> = (0..25)
        .map(|i| json!({"plugin": "test-panic", "id": format!("x{i}"), "max_attempts": 1}))
        .collect();
    post_tasks(&r.url, json!(specs)).await;
    let dead = eventually(T, "25 dead letters", || async {
        let (_, p) = call(
            "GET",
            &format!("{}/v1/tasks?state=dead&plugin=test-panic&limit=100", r.url),
            None,
        )
        .await;
        let n = p["tasks"].as_array().unwrap().len();
        (n == 25).then_some(p)
    })
    .await;
    let times: Vec<i64> = dead["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["finished_at"].as_i64().unwrap())
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] >= w[1]),
        "dead: most recent first"
    );
    let (s, b) = call(
        "POST",
        &format!("{}/v1/dead/retry", r.url),
        Some(json!({"plugin": "test-panic"})),
    )
    .await;
    assert_eq!((s, &b["retried"]), (200, &json!(25)), "{b}");
    eventually(T, "25 dead again", || async {
        let (_, p) = call(
            "GET",
            &format!("{}/v1/tasks?state=dead&limit=100", r.url),
            None,
        )
        .await;
        (p["tasks"].as_array().unwrap().len() == 25
            && p["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .all(|t| t["attempts"] == 1))
        .then_some(())
    })
    .await;
    let (s, b) = call(
        "DELETE",
        &format!("{}/v1/dead?plugin=order-cancel", r.url),
        None,
    )
    .await;
    assert_eq!((s, &b["dropped"]), (200, &json!(0)));
    let (s, b) = call("DELETE", &format!("{}/v1/dead", r.url), None).await;
    assert_eq!((s, &b["dropped"]), (200, &json!(25)));
    let (s, _) = call("GET", &format!("{}/v1/tasks/x0", r.url), None).await;
    assert_eq!(s, 404);
}

/// max_concurrency 2 holds across two runners under a burst of 16 tasks, and other plugins'
/// tasks are not held up by it.
#[tokio::test]
async fn max_concurrency_holds_across_two_runners() {
    let redis = RedisServer::start();
    let r1 = start(&redis, &[]);
    let r2 = start(&redis, &[]);
    let (s, p) = call(
        "PATCH",
        &format!("{}/v1/plugins/test-sleep", r1.url),
        Some(json!({"max_concurrency": 2})),
    )
    .await;
    assert_eq!((s, &p["max_concurrency"]), (200, &json!(2)), "{p}");
    // every runner has heard of the limit
    eventually(T, "the limit on both runners", || async {
        let (_, a) = call("GET", &format!("{}/v1/plugins/test-sleep", r2.url), None).await;
        (a["max_concurrency"] == 2).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let specs: Vec<Value> = (0..16)
        .map(|i| json!({"plugin": "test-sleep", "id": format!("s{i}"), "payload": {"ms": 300, "tag": format!("s{i}")}}))
        .collect();
    post_tasks(&r1.url, json!(specs)).await;
    post_tasks(&r2.url, json!([coupon("beside", now_ms() + 200)])).await;
    eventually(Duration::from_secs(60), "16 sleeps", || async {
        (read_stream(&mut redis.conn(), "{eggtimer}:events:sleep").len() >= 16).then_some(())
    })
    .await;
    let ev = read_stream_timed(&mut redis.conn(), "{eggtimer}:events:sleep");
    assert_eq!(ev.len(), 16, "each ran once");
    // the most runs at once: each run lies within [started_at, its event's time]
    let mut points = Vec::new();
    for (at, _, data) in &ev {
        let start = data["started_at"].as_i64().unwrap();
        points.push((start, 1));
        points.push((*at, -1));
    }
    points.sort_by_key(|&(t, d)| (t, d));
    let (mut now, mut most) = (0, 0);
    for (t, d) in points {
        now += d;
        most = most.max(now);
        let _ = t;
    }
    assert_eq!(
        most, 2,
        "at most 2 runs at once across the runners, and the limit was reached"
    );
    let (_, c) = call("GET", &format!("{}/v1/tasks/beside", r1.url), None).await;
    assert_eq!(
        c["state"], "done",
        "another plugin's task ran meanwhile: {c}"
    );
    let sleeps: Vec<Value> = (0..16)
        .map(|i| {
            let id = format!("s{i}");
            let url = r1.url.clone();
            async move { call("GET", &format!("{url}/v1/tasks/{id}"), None).await.1 }
        })
        .collect::<futures::future::JoinAll<_>>()
        .await;
    assert!(
        sleeps.iter().all(|t| t["attempts"] == 1),
        "waiting for a slot used no attempt"
    );
}

/// unique_for_ms: after a task finished, scheduling its id again inside the window is 409
/// duplicate and changes nothing; after the window it is scheduled again.
#[tokio::test]
async fn a_dedup_window_refuses_the_same_id_after_it_ran() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    let spec = |window: i64| {
        let mut s = coupon("once", now_ms());
        s["unique_for_ms"] = json!(window);
        s
    };
    post_tasks(&r.url, spec(2000)).await;
    wait_state(&r.url, "once", "done", T).await;
    let (s, e) = call("POST", &format!("{}/v1/tasks", r.url), Some(spec(2000))).await;
    assert_eq!((s, &e["error"]["code"]), (409, &json!("duplicate")), "{e}");
    // in a batch over several shards, nothing is written
    let (s, _) = call(
        "POST",
        &format!("{}/v1/tasks", r.url),
        Some(json!([coupon("fresh-1", now_ms() + 60_000), spec(2000)])),
    )
    .await;
    assert_eq!(s, 409);
    let (s, _) = call("GET", &format!("{}/v1/tasks/fresh-1", r.url), None).await;
    assert_eq!(s, 404, "a refused batch wrote nothing");
    assert_eq!(
        read_stream(&mut redis.conn(), "{eggtimer}:events:push").len(),
        1
    );
    // after the window
    let (s, b) = eventually(T, "the window to end", || async {
        let (s, b) = call("POST", &format!("{}/v1/tasks", r.url), Some(spec(2000))).await;
        (s != 409).then_some((s, b))
    })
    .await;
    assert_eq!(s, 201, "{b}");
    wait_state(&r.url, "once", "done", T).await;
    assert_eq!(
        read_stream(&mut redis.conn(), "{eggtimer}:events:push").len(),
        2
    );
}
