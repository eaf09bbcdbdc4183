//! Teams: API keys with roles and plugin scopes, the audit, plugins kept in their lane, and the
//! Host and Origin checks of a runner without a token. Real runner processes (two, to see a
//! revocation spread), real plugins, a real redis-server.

use std::time::{Duration, Instant};

use eggtimer_tests::as_key::{ADMIN, make_key, req, upload_as, wait_state};
use eggtimer_tests::{RedisServer, RunnerProcess, eventually, everything_in_redis, plugin_wasm};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

/// The `key` field of each element of an array.
fn strings<'a>(v: &'a Value, key: &str) -> Vec<&'a str> {
    let items = v.as_array().unwrap_or_else(|| panic!("not an array: {v}"));
    items.iter().map(|e| e[key].as_str().unwrap()).collect()
}

#[tokio::test]
async fn two_teams_deploy_schedule_and_read_only_their_own() {
    let redis = RedisServer::start();
    let r = RunnerProcess::start(&redis.url(), &["--token", ADMIN]);
    let base = r.url.as_str();
    let (_, orders) = make_key(base, "team-orders", "developer", &["order-*"]).await;
    let (_, coupons) = make_key(base, "team-coupons", "developer", &["coupon-*"]).await;
    let (_, reader) = make_key(base, "orders-dashboard", "reader", &["order-*"]).await;

    // each team deploys its own plugin; a deploy into the other's is refused, naming it
    let (s, _) = upload_as(base, &orders, "order-cancel", plugin_wasm("order-cancel")).await;
    assert_eq!(s, 201);
    let (s, e) = upload_as(base, &orders, "coupon-expiry", plugin_wasm("coupon-expiry")).await;
    assert_eq!(s, 403, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"coupon-expiry\""),
        "{e}"
    );
    let (s, _) = upload_as(
        base,
        &coupons,
        "coupon-expiry",
        plugin_wasm("coupon-expiry"),
    )
    .await;
    assert_eq!(s, 201);

    // each schedules its own, for one owner with tasks of both
    let far = eggtimer_tests::now_ms() + 3_600_000;
    let (s, e) = req(
        "POST",
        &format!("{base}/v1/tasks"),
        Some(&orders),
        Some(json!({"plugin": "order-cancel", "id": "o-1", "owner": "u1", "run_at": far, "payload": {"order_id": "1", "user_id": "u1"}})),
    )
    .await;
    assert_eq!(s, 201, "{e}");
    let (s, e) = req(
        "POST",
        &format!("{base}/v1/tasks"),
        Some(&coupons),
        Some(json!({"plugin": "coupon-expiry", "id": "c-1", "owner": "u1", "run_at": far, "payload": {"coupon_id": "1", "user_id": "u1", "expires_at": 0}})),
    )
    .await;
    assert_eq!(s, 201, "{e}");
    // a batch with one spec of the other team's plugin: 403 naming it, nothing scheduled
    let (s, e) = req(
        "POST",
        &format!("{base}/v1/tasks"),
        Some(&orders),
        Some(json!([
            {"plugin": "order-cancel", "id": "o-2", "run_at": far},
            {"plugin": "coupon-expiry", "id": "c-2", "run_at": far}
        ])),
    )
    .await;
    assert_eq!(s, 403, "{e}");
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("[1] ") && msg.contains("\"coupon-expiry\""),
        "{msg}"
    );
    let (s, _) = req("GET", &format!("{base}/v1/tasks/o-2"), Some(ADMIN), None).await;
    assert_eq!(s, 404, "all or nothing");

    // the other team's task is 404, as if it did not exist; their own is there
    for (key, mine, theirs) in [(&orders, "o-1", "c-1"), (&coupons, "c-1", "o-1")] {
        let (s, _) = req("GET", &format!("{base}/v1/tasks/{mine}"), Some(key), None).await;
        assert_eq!(s, 200);
        for (m, path) in [
            ("GET", format!("/v1/tasks/{theirs}")),
            ("DELETE", format!("/v1/tasks/{theirs}")),
            ("POST", format!("/v1/tasks/{theirs}/run")),
        ] {
            let (s, e) = req(m, &format!("{base}{path}"), Some(key), None).await;
            assert_eq!(s, 404, "{m} {path}: {e}");
        }
    }
    // lists show only the team's own
    let (_, list) = req("GET", &format!("{base}/v1/plugins"), Some(&orders), None).await;
    let names = strings(&list, "name");
    assert_eq!(names, ["order-cancel"]);
    let (_, page) = req(
        "GET",
        &format!("{base}/v1/owners/u1/tasks"),
        Some(&coupons),
        None,
    )
    .await;
    let ids = strings(&page, "id");
    assert_eq!(ids, ["c-1"]);
    // an owner's counts: the team's own plugins only (the admin sees both)
    for (key, want) in [
        (coupons.as_str(), vec!["coupon-expiry"]),
        (reader.as_str(), vec!["order-cancel"]),
        (ADMIN, vec!["coupon-expiry", "order-cancel"]),
    ] {
        let (s, st) = req(
            "GET",
            &format!("{base}/v1/owners/u1/stats"),
            Some(key),
            None,
        )
        .await;
        assert_eq!(s, 200, "{st}");
        assert_eq!(strings(&st["plugins"], "plugin"), want, "{st}");
        assert_eq!(st["scheduled"], want.len(), "{st}");
    }
    let (_, found) = req(
        "GET",
        &format!("{base}/v1/tasks?state=scheduled"),
        Some(&orders),
        None,
    )
    .await;
    let ids = strings(&found["tasks"], "id");
    assert_eq!(ids, ["o-1"]);
    let (s, _) = req(
        "GET",
        &format!("{base}/v1/tasks?plugin=coupon-expiry"),
        Some(&orders),
        None,
    )
    .await;
    assert_eq!(s, 403);
    let (_, stats) = req("GET", &format!("{base}/v1/stats"), Some(&orders), None).await;
    let names = strings(&stats["plugins"], "plugin");
    assert_eq!(names, ["order-cancel"]);

    // a reader reads but does not change
    let (s, _) = req("GET", &format!("{base}/v1/tasks/o-1"), Some(&reader), None).await;
    assert_eq!(s, 200);
    let (s, e) = req(
        "DELETE",
        &format!("{base}/v1/tasks/o-1"),
        Some(&reader),
        None,
    )
    .await;
    assert_eq!(s, 403, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("needs operator"),
        "{e}"
    );

    // an owner-wide cancel touches only the team's tasks
    let (s, n) = req(
        "DELETE",
        &format!("{base}/v1/owners/u1/tasks"),
        Some(&orders),
        None,
    )
    .await;
    assert_eq!((s, &n["cancelled"]), (200, &json!(1)), "{n}");
    let (s, _) = req("GET", &format!("{base}/v1/tasks/c-1"), Some(ADMIN), None).await;
    assert_eq!(s, 200, "the other team's task of the same owner stays");

    // keys are the admin's: a developer can't make one; unknown keys are 401
    let (s, _) = req(
        "POST",
        &format!("{base}/v1/keys"),
        Some(&orders),
        Some(json!({"name": "x", "role": "admin", "plugins": ["*"]})),
    )
    .await;
    assert_eq!(s, 403);
    let (s, _) = req(
        "GET",
        &format!("{base}/v1/plugins"),
        Some("et_0000000000000000_00"),
        None,
    )
    .await;
    assert_eq!(s, 401);
    let (s, _) = req("GET", &format!("{base}/v1/plugins"), None, None).await;
    assert_eq!(s, 401);

    // the audit names the refused deploy; a team sees its own entries only
    let (s, audit) = req(
        "GET",
        &format!("{base}/v1/audit?key=team-orders"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(s, 200);
    let refused_deploy = audit["entries"].as_array().unwrap().iter().find(|e| {
        e["method"] == "PUT" && e["path"] == "/v1/plugins/coupon-expiry" && e["status"] == 403
    });
    let entry = refused_deploy.unwrap_or_else(|| panic!("no refused deploy in {audit}"));
    assert_eq!(entry["plugin"], "coupon-expiry");
    let scheduled = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["method"] == "POST" && e["path"] == "/v1/tasks" && e["status"] == 201);
    let entry = scheduled.unwrap_or_else(|| panic!("no schedule in {audit}"));
    assert_eq!(entry["plugin"], "order-cancel", "the plugin it concerned");
    let (_, own) = req("GET", &format!("{base}/v1/audit"), Some(&coupons), None).await;
    let own = own["entries"].as_array().unwrap();
    assert!(!own.is_empty());
    assert!(own.iter().all(|e| e["key"] == "team-coupons"), "{own:?}");
    let (_, all) = req(
        "GET",
        &format!("{base}/v1/audit?limit=1000"),
        Some(ADMIN),
        None,
    )
    .await;
    assert!(
        all["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["status"] == 401)
    );

    // no key secret anywhere in Redis, in clear
    let stored = everything_in_redis(&redis);
    for secret in [&orders, &coupons, &reader] {
        assert!(
            !stored.contains(secret.as_str()),
            "a key's secret is in Redis"
        );
        assert!(
            !stored.contains(&secret[20..]),
            "a key's secret is in Redis"
        );
    }
}

#[tokio::test]
async fn a_revoked_key_is_refused_by_every_runner_within_a_second() {
    let redis = RedisServer::start();
    let a = RunnerProcess::start(&redis.url(), &["--token", ADMIN]);
    let b = RunnerProcess::start(&redis.url(), &["--token", ADMIN]);
    let (id, key) = make_key(&a.url, "team-pets", "operator", &["pet-*", "auto-feed"]).await;
    let (s, _) = req("GET", &format!("{}/v1/plugins", b.url), Some(&key), None).await;
    assert_eq!(s, 200, "the other runner takes the new key");
    let keys = eventually(T, "last_used_at to be recorded", || async {
        let (_, keys) = req("GET", &format!("{}/v1/keys", a.url), Some(ADMIN), None).await;
        keys[0]["last_used_at"].is_i64().then_some(keys)
    })
    .await;
    assert_eq!(keys[0]["name"], "team-pets");
    assert!(keys[0].get("key").is_none(), "a listed key shows no secret");

    let (s, _) = req(
        "DELETE",
        &format!("{}/v1/keys/{id}", a.url),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(s, 204);
    let revoked = Instant::now();
    let (s, _) = req("GET", &format!("{}/v1/plugins", a.url), Some(&key), None).await;
    assert_eq!(s, 401, "the runner that revoked it refuses it at once");
    loop {
        let (s, _) = req("GET", &format!("{}/v1/plugins", b.url), Some(&key), None).await;
        if s == 401 {
            break;
        }
        assert_eq!(s, 200);
        assert!(
            revoked.elapsed() < Duration::from_secs(1),
            "the other runner still takes the revoked key after {:?}",
            revoked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = revoked.elapsed();
    assert!(took < Duration::from_secs(1), "refused after {took:?}");
}

#[tokio::test]
async fn a_plugin_schedules_only_its_own_tasks_unless_may_schedule_says_more() {
    let redis = RedisServer::start();
    let r = RunnerProcess::start(&redis.url(), &["--token", ADMIN, "--retry-base", "10ms"]);
    let base = r.url.as_str();
    for name in ["test-flood", "order-cancel"] {
        let (s, _) = upload_as(base, ADMIN, name, plugin_wasm(name)).await;
        assert_eq!(s, 201);
    }
    let later = eggtimer_tests::now_ms() + 3_600_000;
    let spec = json!({"plugin": "order-cancel", "id": "o-later", "run_at": later,
        "payload": {"order_id": "later", "user_id": "u1"}});
    let (s, _) = req("POST", &format!("{base}/v1/tasks"), Some(ADMIN), Some(spec)).await;
    assert_eq!(s, 201);
    // another team's plugin schedules `order-cancel` for an order it names: refused
    flood(base, "f-1", "schedule", "order-cancel").await;
    let t = wait_state(base, "f-1", "dead").await;
    let err = t["last_error"].as_str().unwrap();
    assert!(
        err.contains("may not schedule tasks of plugin \"order-cancel\""),
        "{err}"
    );
    assert_eq!(order_cancel_tasks(base).await, 1, "no order was cancelled");
    // nor can it cancel one
    flood(base, "fc-1", "cancel", "o-later").await;
    wait_state(base, "fc-1", "done").await;
    wait_state(base, "o-later", "scheduled").await;

    // a developer of other plugins may not widen it; the admin may
    let (_, dev) = make_key(base, "team-flood", "developer", &["test-*"]).await;
    let (s, e) = req(
        "PATCH",
        &format!("{base}/v1/plugins/test-flood"),
        Some(&dev),
        Some(json!({"may_schedule": ["order-*"]})),
    )
    .await;
    assert_eq!(s, 403, "{e}");
    let (s, p) = req(
        "PATCH",
        &format!("{base}/v1/plugins/test-flood"),
        Some(ADMIN),
        Some(json!({"may_schedule": ["order-*"]})),
    )
    .await;
    assert_eq!(s, 200, "{p}");
    assert_eq!(p["may_schedule"], json!(["order-*"]));
    flood(base, "f-2", "schedule", "order-cancel").await;
    wait_state(base, "f-2", "done").await;
    assert_eq!(order_cancel_tasks(base).await, 2, "the follow-up is in");
    flood(base, "fc-2", "cancel", "o-later").await;
    wait_state(base, "fc-2", "done").await;
    let (s, _) = req(
        "GET",
        &format!("{base}/v1/tasks/o-later"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(s, 404, "cancelled");
}

/// Schedules a `test-flood` task (one attempt) that does `what` (`schedule`: a task of the
/// plugin `id`; `cancel`: the task `id`).
async fn flood(base: &str, task: &str, what: &str, id: &str) {
    let spec = json!({"plugin": "test-flood", "id": task, "max_attempts": 1,
        "payload": {"what": what, "id": id}});
    let (s, e) = req("POST", &format!("{base}/v1/tasks"), Some(ADMIN), Some(spec)).await;
    assert_eq!(s, 201, "{e}");
}

/// How many tasks of `order-cancel` there are, in any state (every page of the find).
/// How many distinct tasks of `order-cancel` there are in any state. A find walks the states one
/// after another, so a task that changes state meanwhile can be on two pages: counted once.
async fn order_cancel_tasks(base: &str) -> usize {
    let (mut ids, mut cursor) = (std::collections::HashSet::new(), String::new());
    loop {
        let url = format!("{base}/v1/tasks?plugin=order-cancel&cursor={cursor}");
        let (s, page) = req("GET", &url, Some(ADMIN), None).await;
        assert_eq!(s, 200, "{page}");
        for t in page["tasks"].as_array().unwrap() {
            ids.insert(t["id"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = c.to_owned(),
            None => return ids.len(),
        }
    }
}

#[tokio::test]
async fn without_a_token_other_hosts_and_other_sites_are_refused() {
    let redis = RedisServer::start();
    let r = RunnerProcess::start(&redis.url(), &[]);
    let base = r.url.as_str();
    let http = reqwest::Client::new();
    let port = r.port;
    // DNS rebinding: a name that resolves here, but is not this runner's
    let s = http
        .get(format!("{base}/v1/plugins"))
        .header("host", format!("attacker.example:{port}"))
        .send()
        .await
        .unwrap();
    assert_eq!(s.status().as_u16(), 403);
    assert!(s.text().await.unwrap().contains("attacker.example"));
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let s = http
            .get(format!("{base}/v1/plugins"))
            .header("host", host)
            .send()
            .await
            .unwrap();
        assert_eq!(s.status().as_u16(), 200);
    }
    // a page on another site posting a bodyless "simple" request, as a browser sends it
    let s = http
        .post(format!("{base}/v1/dead/retry"))
        .header("origin", "https://attacker.example")
        .header("sec-fetch-site", "cross-site")
        .header("content-type", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(s.status().as_u16(), 403);
    let s = http
        .post(format!("{base}/v1/dead/retry"))
        .header("origin", "https://attacker.example")
        .send()
        .await
        .unwrap();
    assert_eq!(s.status().as_u16(), 403);
    // the dashboard's own requests (same origin) pass
    let s = http
        .post(format!("{base}/v1/dead/retry"))
        .header("origin", format!("http://127.0.0.1:{port}"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(s.status().as_u16(), 200);
    let (_, audit) = req("GET", &format!("{base}/v1/audit"), None, None).await;
    let refused = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["status"] == 403)
        .count();
    assert_eq!(refused, 3, "{audit}");
}

#[tokio::test]
async fn metrics_read_redis_at_most_once_a_second_and_can_ask_for_a_token() {
    let redis = RedisServer::start();
    let shards = 4;
    let r = RunnerProcess::start(
        &redis.url(),
        &[
            "--metrics-token",
            "scrape-me",
            "--shards",
            &shards.to_string(),
        ],
    );
    let (s, _) = req("GET", &format!("{}/metrics", r.url), None, None).await;
    assert_eq!(s, 401);
    // every shard's counts are read with one HVALS (nothing else sends it): count them over a
    // burst of scrapes
    let mut c = redis.conn();
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut c).unwrap();
    let started = Instant::now();
    let scrapes = 30;
    for _ in 0..scrapes {
        let (s, text) = req(
            "GET",
            &format!("{}/metrics", r.url),
            Some("scrape-me"),
            None,
        )
        .await;
        assert_eq!(s, 200);
        assert!(text.as_str().unwrap().contains("eggtimer_"), "{text}");
    }
    let seconds = started.elapsed().as_secs() + 1;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .unwrap();
    // no HVALS line at all means no read: the first scrape reads every shard once
    let hvals: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_hvals:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0);
    assert!(
        (shards..=shards * (seconds + 1)).contains(&hvals),
        "{scrapes} scrapes in {seconds} s read every shard {hvals} times ({shards} shards)"
    );
}

#[tokio::test]
async fn a_flood_of_refused_requests_does_not_grow_the_audit_past_its_cap() {
    let redis = RedisServer::start();
    let r = RunnerProcess::start(&redis.url(), &["--token", ADMIN, "--audit-max-len", "100"]);
    let flood = 1_000;
    for i in 0..flood {
        let (s, _) = req(
            "GET",
            &format!("{}/v1/plugins", r.url),
            Some(&format!("et_{i}")),
            None,
        )
        .await;
        assert_eq!(s, 401);
    }
    let len: u64 = redis::cmd("XLEN")
        .arg("{eggtimer}:audit")
        .query(&mut redis.conn())
        .unwrap();
    // `MAXLEN ~` trims whole stream nodes (100 entries each): a little over the cap, never the flood
    assert!(
        len <= 200,
        "the audit holds {len} entries after {flood} refusals"
    );
    let (_, page) = req(
        "GET",
        &format!("{}/v1/audit?limit=5", r.url),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(page["entries"][0]["status"], 401, "{page}");
}
