//! What job-runner users ask for most (schedules are in `schedules.rs`): pausing a plugin,
//! finding tasks, bulk actions, a per-plugin concurrency limit, a dedup window. Real runner processes, a real
//! redis-server, real wasm plugins; counts come from the plugins' event streams.

use std::collections::HashSet;
use std::time::Duration;

use eggtimer_tests::{
    RedisServer, both_ran, call, eventually, now_ms, post_tasks, read_events, read_events_timed,
    runner_fast_retry as start, runners_holding_shards, wait_state,
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);

fn coupon(id: &str, due: i64) -> Value {
    json!({"plugin": "coupon-expiry", "id": id, "run_at": due,
           "payload": {"coupon_id": id, "user_id": "u", "expires_at": due + 7_200_000}})
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
    // the fewest commands of three windows of 2 s: a spinning poller spins in every one, while a
    // runner's one-off work (loading a script's function into Redis at its first call, which a
    // slow machine reaches late) falls in one
    let mut during = u64::MAX;
    for _ in 0..3 {
        let before = calls(&mut c);
        tokio::time::sleep(Duration::from_secs(2)).await;
        during = during.min(calls(&mut c) - before);
    }
    assert!(
        during < 60,
        "{during} Redis commands in 2 s (the fewest of three windows) while the only due tasks are paused: the pollers spin"
    );
    assert!(read_events(&mut c, &["coupon-expiry"], "push").is_empty());
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
        (read_events(&mut redis.conn(), &["coupon-expiry"], "push").len() >= 31).then_some(())
    })
    .await;
    let order: Vec<String> = read_events(&mut c, &["coupon-expiry"], "push")
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
            let (plugin, payload) = if i % 5 < 3 {
                (
                    "coupon-expiry",
                    json!({"coupon_id": format!("c{i}"), "user_id": "u", "expires_at": t0}),
                )
            } else {
                (
                    "order-cancel",
                    json!({"order_id": format!("o{i}"), "user_id": "u"}),
                )
            };
            // many share a due time, so the cursor must page within ties
            json!({"plugin": plugin, "id": format!("t{i}"), "run_at": t0 + (i / 7) * 1000,
                   "owner": format!("u{}", i % 10), "payload": payload})
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
    // a cursor is sealed: one made up, or one of another route, is refused, not a place
    let (_, page) = call(
        "GET",
        &format!("{}/v1/tasks?state=scheduled&limit=5", r.url),
        None,
    )
    .await;
    let real = page["next_cursor"].as_str().unwrap().to_owned();
    // one character in the middle changed (the last may carry only padding bits, and may be the
    // character it would be changed to: the cursor was then the real one, 1 time in 64)
    let mid = real.len() / 2;
    let other = if &real[mid..=mid] == "A" { "B" } else { "A" };
    let tampered = format!("{}{other}{}", &real[..mid], &real[mid + 1..]);
    for (cursor, status) in [
        ("s.-9999999999999999999.61".to_owned(), 400),
        ("A".repeat(60), 422),
        (tampered, 422),
    ] {
        let url = format!("{}/v1/tasks?state=scheduled&cursor={cursor}", r.url);
        let (s, e) = call("GET", &url, None).await;
        assert_eq!(s, status, "{cursor}: {e}");
    }
    let (s, e) = call("GET", &format!("{}/v1/dead?cursor={real}", r.url), None).await;
    assert_eq!(s, 422, "a cursor of another route: {e}");
    // one task of a plugin due after all 10,000: scheduled tasks of one plugin are read from the
    // due order with the plugin as a filter; the API reads on past the 10,000 to fill its page,
    // and so does the CLI
    post_tasks(
        &r.url,
        json!([{"plugin": "noop", "id": "last", "run_at": t0 + 2_000_000}]),
    )
    .await;
    let query = format!("{}/v1/tasks?plugin=noop&state=scheduled", r.url);
    let (_, first) = call("GET", &query, None).await;
    assert_eq!(first["tasks"][0]["id"], "last", "{first}");
    assert_eq!(first["next_cursor"], Value::Null, "{first}");
    let out = std::process::Command::new(eggtimer_tests::eggtimer_bin())
        .args(["task", "find", "--plugin", "noop", "--state", "scheduled"])
        .args(["--json", "--url", &r.url])
        .output()
        .unwrap();
    let found: Value = serde_json::from_slice(&out.stdout).expect("task find --json");
    assert_eq!(found["tasks"][0]["id"], "last", "{found}");
    assert_eq!(found["next_cursor"], Value::Null, "{found}");
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
    // both claim: one runner alone would hold the limit without any agreement between them
    runners_holding_shards(&r1.url, 2).await;
    let specs: Vec<Value> = (0..16)
        .map(|i| json!({"plugin": "test-sleep", "id": format!("s{i}"), "payload": {"ms": 300, "tag": format!("s{i}")}}))
        .collect();
    post_tasks(&r1.url, json!(specs)).await;
    post_tasks(&r2.url, json!([coupon("beside", now_ms() + 200)])).await;
    eventually(Duration::from_secs(60), "16 sleeps", || async {
        (read_events(&mut redis.conn(), &["test-sleep"], "sleep").len() >= 16).then_some(())
    })
    .await;
    let ev = read_events_timed(&mut redis.conn(), &["test-sleep"], "sleep");
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
    both_ran(&r1.url, &r2.url, "test-sleep", 16).await;
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
        read_events(&mut redis.conn(), &["coupon-expiry"], "push").len(),
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
        read_events(&mut redis.conn(), &["coupon-expiry"], "push").len(),
        2
    );
}
