//! Teams that don't trust each other: what a team's key tries against another team, or against
//! what an admin set, on real runner processes and a real redis-server. Each test is a finding
//! that worked before it was mended.

use std::time::Duration;

use eggtimer_tests::as_key::{ADMIN, make_key, req, upload_as};
use eggtimer_tests::{RedisServer, RunnerProcess, everything_in_redis, plugin_wasm, plugins_dir};
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
    let spec = |i: usize| json!({"plugin": "order-cancel", "id": format!("o-{i}"), "run_at": far});
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
            json!({"plugin": "order-cancel", "id": "order-task-o1", "owner": "u1", "run_at": far}),
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

/// The Host check covers every route, not only /v1 (a DNS-rebinding page read `/metrics` and
/// `/readyz` before), and with a token `/metrics` wants one: a team's key is not enough, since the
/// metrics name every team's plugins and the hosts they call.
#[tokio::test]
async fn every_route_checks_the_host_and_metrics_want_the_admins_token() {
    let redis = RedisServer::start();
    let open = RunnerProcess::start(&redis.url(), &[]);
    let http = reqwest::Client::new();
    for path in [
        "/metrics",
        "/readyz",
        "/healthz",
        "/ui/",
        "/v1/openapi.json",
        "/nowhere",
    ] {
        let s = http
            .get(format!("{}{path}", open.url))
            .header("host", format!("evil.example:{}", open.port))
            .send()
            .await
            .unwrap();
        assert_eq!(s.status().as_u16(), 403, "{path}");
        let s = http
            .get(format!("{}{path}", open.url))
            .header("host", format!("localhost:{}", open.port))
            .send()
            .await
            .unwrap();
        assert_ne!(s.status().as_u16(), 403, "{path} from localhost");
    }
    // a link to the dashboard followed from another site still opens it
    let s = http
        .get(format!("{}/ui/", open.url))
        .header("sec-fetch-site", "cross-site")
        .header("sec-fetch-mode", "navigate")
        .send()
        .await
        .unwrap();
    assert_eq!(s.status().as_u16(), 200);
    // a cross-site script's fetch of /metrics is not
    let s = http
        .get(format!("{}/metrics", open.url))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(s.status().as_u16(), 403);

    let r = RunnerProcess::start(&redis.url(), &["--token", ADMIN]);
    let (_, team) = make_key(&r.url, "orders", "admin", &["*"]).await;
    let (s, _) = req("GET", &format!("{}/metrics", r.url), None, None).await;
    assert_eq!(s, 401);
    let (s, _) = req("GET", &format!("{}/metrics", r.url), Some(&team), None).await;
    assert_eq!(s, 401, "a key, even an admin's, is not the metrics token");
    let (s, text) = req("GET", &format!("{}/metrics", r.url), Some(ADMIN), None).await;
    assert_eq!(s, 200);
    assert!(text.as_str().unwrap().contains("eggtimer_"), "{text}");
}

/// The compile of an uploaded component starts with a cleared environment: it learns nothing of
/// the runner's (its token, its Redis, anything an operator put there). Before, it inherited all.
#[tokio::test]
async fn the_compile_of_an_upload_sees_none_of_the_runners_environment() {
    let redis = RedisServer::start();
    let r = RunnerProcess::start_with_env(
        &redis.url(),
        &[
            "--plugin-cache",
            eggtimer_tests::temp_dir("cold-cache").to_str().unwrap(),
        ],
        &[("EGGTIMER_TEST_SECRET", "do-not-leak")],
    );
    let runner_env = std::fs::read(format!("/proc/{}/environ", r.pid())).unwrap();
    assert!(String::from_utf8_lossy(&runner_env).contains("do-not-leak"));
    let (url, pid) = (r.url.clone(), r.pid());
    // the Python sample compiles for seconds: long enough to read the child's environment
    let upload = tokio::spawn(async move {
        eggtimer_tests::upload(&url, "coupon-expiry-py", plugin_wasm("coupon-expiry-py")).await
    });
    let child_env = eggtimer_tests::eventually(
        Duration::from_secs(120),
        "the compile child to start",
        || async move { compile_child_env(pid) },
    )
    .await;
    assert!(!child_env.contains("do-not-leak"), "{child_env}");
    assert!(!child_env.contains("EGGTIMER_"), "{child_env}");
    let (s, b) = upload.await.unwrap();
    assert_eq!(s, 201, "{b}");
}

/// The environment of the runner `parent`'s `compile-plugin` child, once there is one.
fn compile_child_env(parent: u32) -> Option<String> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let dir = e.path();
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        // pid (comm) state ppid ...
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
        if ppid == Some(parent) && String::from_utf8_lossy(&cmdline).contains("compile-plugin") {
            let env = std::fs::read(dir.join("environ")).ok()?;
            return Some(String::from_utf8_lossy(&env).replace('\0', "\n"));
        }
    }
    None
}

/// Refusals are kept apart from changes: a flood of refused requests can't push a change out of
/// the audit (before, 60 requests with an unknown key under `--audit-max-len 40` did). A change's
/// entry names the fields its body gave (a secret's name, never its value) and its query.
#[tokio::test]
async fn a_flood_of_refusals_does_not_push_a_change_out_and_entries_say_what_changed() {
    let redis = RedisServer::start();
    let key = eggtimer_tests::secrets_key_file();
    let r = RunnerProcess::start(
        &redis.url(),
        &[
            "--token",
            ADMIN,
            "--audit-max-len",
            "40",
            "--plugins-dir",
            plugins_dir().to_str().unwrap(),
            "--secrets-key-file",
            key.to_str().unwrap(),
        ],
    );
    let base = r.url.as_str();
    let (s, b) = req(
        "PATCH",
        &format!("{base}/v1/plugins/noop"),
        Some(ADMIN),
        Some(json!({"max_pending": 100, "config": {"a": "b"}})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = req(
        "PUT",
        &format!("{base}/v1/plugins/noop/secrets/token"),
        Some(ADMIN),
        Some(json!({"value": "very-secret-value-1234"})),
    )
    .await;
    assert_eq!(s, 204, "{b}");
    let (s, b) = req(
        "DELETE",
        &format!("{base}/v1/dead?plugin=noop"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(s, 200, "{b}");
    for i in 0..60 {
        let (s, _) = req(
            "GET",
            &format!("{base}/v1/plugins"),
            Some(&format!("et_{i}")),
            None,
        )
        .await;
        assert_eq!(s, 401);
    }
    let (s, page) = req(
        "GET",
        &format!("{base}/v1/audit?limit=1000"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(s, 200, "{page}");
    let entries = page["entries"].as_array().unwrap();
    let patch = entries
        .iter()
        .find(|e| e["method"] == "PATCH")
        .unwrap_or_else(|| panic!("the PATCH was pushed out: {page}"));
    assert_eq!(patch["fields"], json!(["config", "max_pending"]), "{patch}");
    let put = entries
        .iter()
        .find(|e| e["method"] == "PUT")
        .expect("the secret's PUT");
    assert_eq!(put["fields"], json!(["value"]), "{put}");
    let drop = entries
        .iter()
        .find(|e| e["method"] == "DELETE")
        .expect("the dead letters' DELETE");
    assert_eq!(
        (&drop["query"], &drop["plugin"]),
        (&json!("plugin=noop"), &json!("noop")),
        "{drop}"
    );
    assert!(
        entries.iter().any(|e| e["status"] == 401),
        "the refusals are there too"
    );
    assert!(!everything_in_redis(&redis).contains("very-secret-value-1234"));
    // newest first, whichever stream an entry is in; the pages meet without a gap or a repeat
    let mut walked = Vec::new();
    let mut cursor = String::new();
    loop {
        let (s, p) = req(
            "GET",
            &format!("{base}/v1/audit?limit=7&cursor={cursor}"),
            Some(ADMIN),
            None,
        )
        .await;
        assert_eq!(s, 200, "{p}");
        walked.extend(
            p["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["id"].clone()),
        );
        match p["next_cursor"].as_str() {
            Some(c) => cursor = c.to_owned(),
            None => break,
        }
    }
    let all: Vec<Value> = entries.iter().map(|e| e["id"].clone()).collect();
    assert_eq!(walked, all);
}

/// A change made while Redis is out of memory (cancelling a task, which frees memory) is
/// audited all the same. Before, the audit's XADD was refused and the change went unrecorded.
#[tokio::test]
async fn a_change_made_while_redis_is_full_is_audited() {
    let redis = RedisServer::start();
    let r = RunnerProcess::with_plugins(&redis, &[]);
    let far = eggtimer_tests::now_ms() + 3_600_000;
    let (s, b) = req(
        "POST",
        &format!("{}/v1/tasks", r.url),
        None,
        Some(json!({"plugin": "noop", "id": "full-1", "run_at": far})),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    let mut c = redis.conn();
    let info: String = redis::cmd("INFO").arg("memory").query(&mut c).unwrap();
    let used: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(used / 2)
        .query(&mut c)
        .unwrap();
    let refused: redis::RedisResult<()> = redis::cmd("SET").arg("x").arg("y").query(&mut c);
    assert!(refused.is_err(), "Redis is full");
    let (s, b) = req("DELETE", &format!("{}/v1/tasks/full-1", r.url), None, None).await;
    assert_eq!(s, 204, "{b}");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query(&mut c)
        .unwrap();
    let (_, page) = req("GET", &format!("{}/v1/audit", r.url), None, None).await;
    let audited =
        page["entries"].as_array().unwrap().iter().any(|e| {
            e["method"] == "DELETE" && e["path"] == "/v1/tasks/full-1" && e["status"] == 204
        });
    assert!(audited, "{page}");
}

/// A runner whose registry is compiling one team's plugin (seconds for the Python sample) still
/// applies another plugin's settings at once. Before, its listener took one announcement at a
/// time, so a setting waited behind the compile (up to --plugin-compile-timeout, 2 min).
#[tokio::test]
async fn a_setting_applies_while_another_plugin_compiles() {
    let redis = RedisServer::start();
    let dir = plugins_dir();
    let a = RunnerProcess::start(&redis.url(), &["--plugins-dir", dir.to_str().unwrap()]);
    // b compiles what it hears for itself: a cache of its own
    let b = RunnerProcess::start(
        &redis.url(),
        &[
            "--plugins-dir",
            dir.to_str().unwrap(),
            "--plugin-cache",
            eggtimer_tests::temp_dir("own-cache").to_str().unwrap(),
        ],
    );
    let url = a.url.clone();
    let upload = tokio::spawn(async move {
        eggtimer_tests::upload(&url, "coupon-expiry-py", plugin_wasm("coupon-expiry-py")).await
    });
    let compiling = |base: String| async move {
        eggtimer_tests::metric(&base, "eggtimer_plugin_compiles")
            .await
            .is_some_and(|n| n >= 1.0)
    };
    // a's upload is done once a has compiled it; then b hears of it and compiles it too
    let (s, body) = upload.await.unwrap();
    assert_eq!(s, 201, "{body}");
    eggtimer_tests::eventually(Duration::from_secs(60), "b to compile the upload", || {
        let base = b.url.clone();
        async move { compiling(base).await.then_some(()) }
    })
    .await;
    let (s, body) = req(
        "PATCH",
        &format!("{}/v1/plugins/noop", a.url),
        None,
        Some(json!({"max_pending": 1})),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let far = eggtimer_tests::now_ms() + 3_600_000;
    let (s, body) = req(
        "POST",
        &format!("{}/v1/tasks", b.url),
        None,
        Some(json!({"plugin": "noop", "id": "n-1", "run_at": far})),
    )
    .await;
    assert_eq!(s, 201, "{body}");
    // b refuses more within a second of the change, while it still compiles
    let tries = std::sync::atomic::AtomicU32::new(0);
    eggtimer_tests::eventually(Duration::from_secs(1), "b to apply max_pending", || {
        let base = b.url.clone();
        let id = format!(
            "n-more-{}",
            tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        async move {
            let (s, _) = req(
                "POST",
                &format!("{base}/v1/tasks"),
                None,
                Some(json!({"plugin": "noop", "id": id, "run_at": far})),
            )
            .await;
            (s == 429).then_some(())
        }
    })
    .await;
    assert!(
        compiling(b.url.clone()).await,
        "b was still compiling when it applied the setting"
    );
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
        message(&e).contains("has 3 scheduled and dead tasks"),
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
