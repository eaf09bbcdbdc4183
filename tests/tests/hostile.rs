//! Teams that don't trust each other: what a team's key tries against another team's plugin, or
//! against what an admin set (limits, origins, deletes, quotas), on real runner processes and a
//! real redis-server. Each test is a finding that worked before it was mended; those at the
//! runner's edges (Host, metrics, the audit, compiles) are in `hostile_edges.rs`.

use std::time::Duration;

use eggtimer_tests::as_key::{ADMIN, make_key, req, upload_as, wait_state};
use eggtimer_tests::{
    RedisServer, RunnerProcess, events_key, eventually, everything_in_redis, plugin_wasm,
    plugins_dir,
};
use serde_json::{Value, json};

fn message(e: &Value) -> &str {
    e["error"]["message"].as_str().unwrap_or("")
}

/// A runner with a token that loads the Rust plugins, and the `orders` team's developer key.
async fn runner_and_orders(redis: &RedisServer) -> (RunnerProcess, String) {
    let dir = plugins_dir();
    let key = eggtimer_tests::secrets_key_file();
    let r = RunnerProcess::start(
        &redis.url(),
        &[
            "--token",
            ADMIN,
            "--plugins-dir",
            dir.to_str().unwrap(),
            "--secrets-key-file",
            key.to_str().unwrap(),
        ],
    );
    let (_, orders) = make_key(&r.url, "orders", "developer", &["order-*"]).await;
    (r, orders)
}

/// An admin's ceilings hold against the team's developer key: values above them are 403, a
/// ceiling can't be cleared by the team, what applies stays under it even after the team puts a
/// value back to its default. Before, the team PATCHed the admin's limits away (200).
#[tokio::test]
async fn a_team_cannot_loosen_what_an_admin_capped() {
    let redis = RedisServer::start();
    let (r, orders) = runner_and_orders(&redis).await;
    let url = format!("{}/v1/plugins/order-cancel", r.url);
    let (s, b) = req(
        "PATCH",
        &url,
        Some(ADMIN),
        Some(json!({"ceilings": {"max_pending": 5, "max_concurrency": 1,
            "rate_limit": {"max": 50, "per_ms": 1000}}})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["ceilings"]["max_pending"], 5, "{b}");
    assert_eq!(b["max_pending"], 5, "what applies: {b}");
    assert_eq!(b["max_concurrency"], 1, "{b}");
    for (patch, says) in [
        (
            json!({"max_concurrency": 100_000}),
            "above the admin's ceiling of 1",
        ),
        (json!({"max_pending": 6}), "above the admin's ceiling of 5"),
        (
            json!({"rate_limit": {"max": 1000, "per_ms": 1000}}),
            "above the admin's ceiling",
        ),
        (
            json!({"ceilings": null}),
            "only an admin sets a plugin's ceilings",
        ),
        (json!({"ceilings": {"max_pending": 100}}), "only an admin"),
        (json!({"weight": 1000}), "weight 1000 is above"),
    ] {
        let (s, e) = req("PATCH", &url, Some(&orders), Some(patch.clone())).await;
        assert_eq!(s, 403, "{patch}: {e}");
        assert!(message(&e).contains(says), "{patch}: {e}");
    }
    // null is the team's to give, and the ceiling still applies
    let (s, b) = req(
        "PATCH",
        &url,
        Some(&orders),
        Some(json!({"max_pending": null, "max_concurrency": null, "rate_limit": null})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        (
            &b["max_pending"],
            &b["max_concurrency"],
            &b["rate_limit"]["max"]
        ),
        (&json!(5), &json!(1), &json!(50)),
        "{b}"
    );
    let far = eggtimer_tests::now_ms() + 3_600_000;
    let spec = |i: usize| {
        json!({"plugin": "order-cancel", "id": format!("o-{i}"), "run_at": far,
            "payload": {"order_id": format!("o-{i}"), "user_id": "u1"}})
    };
    for i in 0..5 {
        let (s, e) = req(
            "POST",
            &format!("{}/v1/tasks", r.url),
            Some(&orders),
            Some(spec(i)),
        )
        .await;
        assert_eq!(s, 201, "{e}");
    }
    let (s, e) = req(
        "POST",
        &format!("{}/v1/tasks", r.url),
        Some(&orders),
        Some(spec(5)),
    )
    .await;
    assert_eq!(s, 429, "the sixth under a ceiling of 5: {e}");
}

/// A team can't let its plugin call what is not a public address (the metadata service, a
/// private network, this runner's own API, IPv4 inside IPv6); an admin can. Before: 200.
#[tokio::test]
async fn only_an_admin_lets_a_plugin_call_inside_the_network() {
    let redis = RedisServer::start();
    let (r, orders) = runner_and_orders(&redis).await;
    let url = format!("{}/v1/plugins/order-cancel", r.url);
    for origin in [
        "http://169.254.169.254".to_owned(),
        "http://10.0.0.1".to_owned(),
        format!("http://127.0.0.1:{}", r.port),
        format!("http://127.0.0.1:{}", redis.port),
        "http://localhost:8080".to_owned(),
        "http://[64:ff9b::a9fe:a9fe]".to_owned(),
    ] {
        let patch = json!({"allowed_hosts": ["https://api.example.com", origin]});
        let (s, e) = req("PATCH", &url, Some(&orders), Some(patch.clone())).await;
        assert_eq!(s, 403, "{origin}: {e}");
        assert!(message(&e).contains("not a public address"), "{e}");
        let (s, b) = req("PATCH", &url, Some(ADMIN), Some(patch)).await;
        assert_eq!(s, 200, "the admin may: {b}");
    }
    let (s, b) = req(
        "PATCH",
        &url,
        Some(&orders),
        Some(json!({"allowed_hosts": ["https://api.example.com"]})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
}

/// Deleting a plugin deletes what is its; a team that uploads the name again starts clean, and a
/// plugin with tasks is not deleted unless they go with it. Before, the next owner of the name
/// inherited the secrets (its webhook signatures made with the old team's key), allowed hosts,
/// config, may_schedule, quotas and kv, and the delete left the tasks behind.
#[tokio::test]
async fn a_deleted_plugins_secrets_settings_and_kv_do_not_pass_to_its_next_owner() {
    let redis = RedisServer::start();
    let (r, orders) = runner_and_orders(&redis).await;
    let base = r.url.as_str();
    let url = format!("{base}/v1/plugins/order-cancel");
    // (an empty secret is a mistake, not a secret)
    let (s, e) = req(
        "PUT",
        &format!("{url}/secrets/signing_key"),
        Some(&orders),
        Some(json!({"value": ""})),
    )
    .await;
    assert_eq!(s, 400, "{e}");
    assert!(message(&e).contains("value is empty"), "{e}");
    let (s, b) = req(
        "PUT",
        &format!("{url}/secrets/signing_key"),
        Some(&orders),
        Some(json!({"value": "the-orders-teams-key"})),
    )
    .await;
    assert_eq!(s, 204, "{b}");
    let (s, b) = req(
        "PATCH",
        &url,
        Some(ADMIN),
        Some(json!({"allowed_hosts": ["https://pay.example.com"], "config": {"mode": "mode-live-7f3a"},
            "may_schedule": ["order-*"], "max_pending": 77, "max_concurrency": 3,
            "rate_limit": {"max": 5, "per_ms": 1000}, "ceilings": {"weight": 2}})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    // what a plugin's runs leave in Redis: kv, an owner's concurrency slots
    let mut c = redis.conn();
    let _: () = redis::cmd("SET")
        .arg("{eggtimer}:kv:order-cancel:last-order")
        .arg("o-9")
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("{eggtimer}:plugin:owner-slots:order-cancel:u1")
        .arg("run-1")
        .arg(1)
        .query(&mut c)
        .unwrap();
    let far = eggtimer_tests::now_ms() + 3_600_000;
    let (s, e) = req(
        "POST",
        &format!("{base}/v1/tasks"),
        Some(&orders),
        Some(
            json!({"plugin": "order-cancel", "id": "order-task-o1", "owner": "u1", "run_at": far,
                "payload": {"order_id": "o1", "user_id": "u1"}}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{e}");

    let (s, e) = req("DELETE", &url, Some(&orders), None).await;
    assert_eq!(s, 409, "{e}");
    assert!(message(&e).contains("1 scheduled and 0 dead"), "{e}");
    assert!(message(&e).contains("?tasks=cancel"), "{e}");
    let (s, e) = req(
        "DELETE",
        &format!("{url}?tasks=cancel"),
        Some(&orders),
        None,
    )
    .await;
    assert_eq!(s, 204, "{e}");
    let left = everything_in_redis(&redis);
    for gone in [
        "the-orders-teams-key",
        "pay.example.com",
        "mode-live-7f3a",
        "{eggtimer}:kv:order-cancel",
        "owner-slots:order-cancel",
        "plugin:secrets:order-cancel",
        "order-task-o1",
    ] {
        assert!(!left.contains(gone), "{gone} is still in Redis");
    }

    // another team's key uploads the name again: defaults everywhere, no secret, no kv
    let (_, other) = make_key(base, "newcomers", "developer", &["order-cancel"]).await;
    let (s, b) = upload_as(base, &other, "order-cancel", plugin_wasm("noop")).await;
    assert_eq!(s, 201, "{b}");
    let (s, b) = req("GET", &url, Some(&other), None).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["allowed_hosts"], json!([]), "{b}");
    assert_eq!(b["config"], json!({}), "{b}");
    assert_eq!(b["may_schedule"], json!([]), "{b}");
    assert_eq!(b["max_pending"], 1_000_000, "{b}");
    assert_eq!(b["max_concurrency"], Value::Null, "{b}");
    assert_eq!(b["rate_limit"], Value::Null, "{b}");
    assert_eq!(b["ceilings"], json!({}), "{b}");
    let (s, list) = req("GET", &format!("{url}/secrets"), Some(&other), None).await;
    assert_eq!((s, &list), (200, &json!([])), "{list}");
    let kv: Option<String> = redis::cmd("GET")
        .arg("{eggtimer}:kv:order-cancel:last-order")
        .query(&mut c)
        .unwrap();
    assert_eq!(kv, None);
    let (s, _) = req(
        "GET",
        &format!("{base}/v1/tasks/order-task-o1"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(s, 404);
}

/// Dead letters count against `max_pending`, and a retry of them is admitted (it moves a task from
/// dead to scheduled). Before, three rounds of three failing tasks under `max_pending 3` were all
/// 201, and a retry of them all made nine scheduled.
#[tokio::test]
async fn dead_letters_count_against_max_pending_and_their_retry_is_admitted() {
    let redis = RedisServer::start();
    let r = RunnerProcess::with_plugins(&redis, &[]);
    let base = r.url.as_str();
    let (s, b) = req(
        "PATCH",
        &format!("{base}/v1/plugins/test-panic"),
        None,
        Some(json!({"max_pending": 3})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let failing =
        |i: usize| json!({"plugin": "test-panic", "id": format!("f-{i}"), "max_attempts": 1});
    let (s, b) = req(
        "POST",
        &format!("{base}/v1/tasks"),
        None,
        Some(json!([failing(0), failing(1), failing(2)])),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    for i in 0..3 {
        eggtimer_tests::wait_state(base, &format!("f-{i}"), "dead", Duration::from_secs(60)).await;
    }
    let (s, e) = req("POST", &format!("{base}/v1/tasks"), None, Some(failing(3))).await;
    assert_eq!(s, 429, "three dead letters fill a max_pending of 3: {e}");
    assert!(
        message(&e).contains("has 3 scheduled, running and dead tasks"),
        "{e}"
    );
    let (s, b) = req(
        "POST",
        &format!("{base}/v1/dead/retry"),
        None,
        Some(json!({"plugin": "test-panic"})),
    )
    .await;
    assert_eq!(
        (s, &b["retried"]),
        (200, &json!(3)),
        "the retry is admitted: {b}"
    );
}

/// A plugin's events are its own: the `orders` team's plugin emitting 250 events on `push` (with
/// `--events-max-len 10`: Redis trims whole nodes of 100) neither trims nor joins the `coupons` team's 3 events on that topic, each
/// team reads only its own plugins' events, and a deleted plugin's streams go with it. Before, a
/// topic was one stream for every plugin (`coupons` read 0 of its 3).
#[tokio::test]
async fn a_teams_events_can_be_neither_trimmed_nor_joined_by_another_team() {
    let redis = RedisServer::start();
    let dir = plugins_dir();
    let r = RunnerProcess::start(
        &redis.url(),
        &[
            "--token",
            ADMIN,
            "--plugins-dir",
            dir.to_str().unwrap(),
            "--events-max-len",
            "10",
        ],
    );
    let base = r.url.as_str();
    // the reminder's code (it emits on `push`) as a plugin of the orders team
    let (s, b) = upload_as(base, ADMIN, "order-push", plugin_wasm("coupon-expiry")).await;
    assert_eq!(s, 201, "{b}");
    let (_, orders) = make_key(base, "orders", "developer", &["order-*"]).await;
    let (_, coupons) = make_key(base, "coupons", "developer", &["coupon-*"]).await;
    let spec = |plugin: &str, id: String| {
        json!({"plugin": plugin, "id": id,
            "payload": {"coupon_id": "c1", "user_id": "u7", "expires_at": 0}})
    };
    let tasks = format!("{base}/v1/tasks");
    // `n` tasks of `plugin` with ids `<prefix>-<i>`, posted with `key`
    let post = |key: String, plugin: &'static str, prefix: &'static str, n: usize| {
        let specs: Vec<Value> = (0..n)
            .map(|i| spec(plugin, format!("{prefix}-{i}")))
            .collect();
        let tasks = tasks.clone();
        async move { req("POST", &tasks, Some(&key), Some(json!(specs))).await.0 }
    };
    assert_eq!(post(coupons.clone(), "coupon-expiry", "c", 3).await, 201);
    wait_state(base, "c-2", "done").await;
    assert_eq!(post(orders.clone(), "order-push", "o", 250).await, 201);
    for i in 0..250 {
        wait_state(base, &format!("o-{i}"), "done").await;
    }

    let events = format!("{base}/v1/events/push?limit=100");
    let (s, seen) = req("GET", &events, Some(&coupons), None).await;
    assert_eq!(s, 200, "{seen}");
    let of = |seen: &Value, field: &str| -> Vec<String> {
        let mut v: Vec<String> = seen
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e[field].as_str().unwrap().to_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(of(&seen, "task_id"), ["c-0", "c-1", "c-2"], "{seen}");
    let (s, seen) = req("GET", &events, Some(&orders), None).await;
    assert_eq!(s, 200, "{seen}");
    let plugins = of(&seen, "plugin");
    assert!(
        !plugins.is_empty() && plugins.iter().all(|p| p == "order-push"),
        "the orders key reads only its own events: {seen}"
    );
    let (s, b) = req(
        "GET",
        &format!("{events}&plugin=coupon-expiry"),
        Some(&orders),
        None,
    )
    .await;
    assert_eq!(s, 403, "{b}");
    let xlen = |key: &str| -> usize {
        redis::cmd("XLEN")
            .arg(key)
            .query(&mut redis.conn())
            .unwrap()
    };
    assert_eq!(xlen(&events_key("coupon-expiry", "push")), 3);
    let flooded = xlen(&events_key("order-push", "push"));
    assert!((10..250).contains(&flooded), "trimmed to {flooded}");
    // a deleted plugin's streams are deleted with it
    let (s, b) = req(
        "DELETE",
        &format!("{base}/v1/plugins/order-push"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(s, 204, "{b}");
    eventually(
        Duration::from_secs(10),
        "the deleted plugin's stream gone",
        || std::future::ready((xlen(&events_key("order-push", "push")) == 0).then_some(())),
    )
    .await;
    assert_eq!(xlen(&events_key("coupon-expiry", "push")), 3);
}

/// max_pending holds across runners to within 1%: a plugin whose every run schedules 50 runs of
/// itself, on two runners, under max_pending 10,000. Before, each runner admitted against its
/// own count and what it admitted itself, and the two together passed the quota by a fifth.
#[tokio::test]
async fn max_pending_holds_across_two_runners_against_a_plugin_that_forks() {
    let redis = RedisServer::start();
    let r = eggtimer_tests::runner_fast_retry(&redis, &[]);
    let _second = eggtimer_tests::runner_fast_retry(&redis, &[]);
    let base = r.url.as_str();
    let max = 10_000;
    let plugin = format!("{base}/v1/plugins/test-flood");
    let (s, p) = req("PATCH", &plugin, None, Some(json!({"max_pending": max}))).await;
    assert_eq!((s, &p["max_pending"]), (200, &json!(max)), "{p}");
    // every runner applies a setting within a second
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let fork = json!({"plugin": "test-flood", "id": "fork-0", "payload": {"what": "fork"}});
    let (s, b) = req("POST", &format!("{base}/v1/tasks"), None, Some(fork)).await;
    assert_eq!(s, 201, "{b}");
    // its pending tasks (scheduled and dead), read every 50 ms for 3 s once they near the quota
    let pending = || async {
        let (_, stats) = req("GET", &format!("{base}/v1/stats"), None, None).await;
        let mine = stats["plugins"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["plugin"] == "test-flood").cloned());
        mine.map_or(0, |p| {
            p["scheduled"].as_u64().unwrap() + p["dead"].as_u64().unwrap()
        })
    };
    let mut most = eventually(
        Duration::from_secs(60),
        "the forks near the quota",
        || async {
            let n = pending().await;
            (n >= max * 9 / 10).then_some(n)
        },
    )
    .await;
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < until {
        most = most.max(pending().await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("test-flood's most pending tasks: {most} (max_pending {max})");
    assert!(most <= max + max / 100, "{most} pending, max_pending {max}");
}
