//! Teams that don't trust each other, at the runner's edges: Host and Origin on every route, the
//! metrics token, the compile child's environment, the audit under a flood of refusals and on a
//! full Redis, a setting applied while another plugin compiles. Real runner processes and a real
//! redis-server; each test is a finding that worked before it was mended (`hostile.rs` has those
//! about a plugin's limits, origins, deletes and quotas).

use std::time::Duration;

use eggtimer_tests::as_key::{ADMIN, make_key, req};
use eggtimer_tests::{RedisServer, RunnerProcess, everything_in_redis, plugin_wasm, plugins_dir};
use serde_json::{Value, json};

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
