//! The HTTP API of API.md through the real binary over real HTTP, against a real redis-server.

use std::time::Duration;

use eggtimer_tests::{
    RedisServer, RunnerProcess, call, eggtimer_bin, eventually, http, now_ms, plugin_wasm,
    plugins_dir, upload, wait_state,
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);

/// The smallest valid component: it exports nothing, so it does not fit the contract.
const EMPTY_COMPONENT: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

fn start(redis: &RedisServer, extra: &[&str]) -> RunnerProcess {
    let dir = plugins_dir();
    let mut args = vec!["--plugins-dir", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    RunnerProcess::start(&redis.url(), &args)
}

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("<no error code>")
}

fn message(v: &Value) -> &str {
    v["error"]["message"]
        .as_str()
        .unwrap_or("<no error message>")
}

async fn raw(method: &str, url: &str, content_type: &str, body: Vec<u8>) -> (u16, Value) {
    let r = http()
        .request(method.parse().unwrap(), url)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        s,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test]
async fn task_routes_succeed_and_refuse_bad_input_with_json_errors() {
    let redis = RedisServer::start();
    let r = start(&redis, &["--max-payload-bytes", "1024"]);
    let tasks = format!("{}/v1/tasks", r.url);
    let far = now_ms() + 3_600_000;

    // schedule one, read it, move it, run it, cancel another
    let (s, b) = call(
        "POST",
        &tasks,
        Some(
            json!({"plugin": "noop", "id": "a", "run_at": far, "owner": "u1", "payload": {"x": 1}}),
        ),
    )
    .await;
    assert_eq!((s, &b), (201, &json!({"id": "a", "run_at": far})));
    let (s, t) = call("GET", &format!("{tasks}/a"), None).await;
    assert_eq!(s, 200);
    assert_eq!(
        (
            t["state"].as_str(),
            t["plugin"].as_str(),
            t["payload"].clone(),
            t["owner"].as_str(),
            t["max_attempts"].as_u64()
        ),
        (
            Some("scheduled"),
            Some("noop"),
            json!({"x": 1}),
            Some("u1"),
            Some(5)
        )
    );
    let (s, t) = call(
        "PATCH",
        &format!("{tasks}/a"),
        Some(json!({"shift_ms": -1000})),
    )
    .await;
    assert_eq!((s, t["run_at"].as_i64()), (200, Some(far - 1000)));
    let (s, t) = call("PATCH", &format!("{tasks}/a"), Some(json!({"run_at": far}))).await;
    assert_eq!((s, t["run_at"].as_i64()), (200, Some(far)));
    let (s, _) = call("GET", &format!("{}/v1/owners/u1/tasks", r.url), None).await;
    assert_eq!(s, 200);
    let (s, b) = call("POST", &format!("{tasks}/a/run"), None).await;
    assert_eq!(s, 202, "{b}");
    wait_state(&r.url, "a", "done", T).await;
    let (s, b) = call("PATCH", &format!("{tasks}/a"), Some(json!({"shift_ms": 5}))).await;
    assert_eq!((s, code(&b)), (409, "conflict"));
    let (s, b) = call("DELETE", &format!("{tasks}/a"), None).await;
    assert_eq!((s, code(&b)), (409, "conflict"));

    // a batch, with generated ids
    let (s, b) = call(
        "POST",
        &tasks,
        Some(json!([{"plugin": "noop", "delay_ms": 3_600_000}, {"plugin": "noop", "run_at": far}])),
    )
    .await;
    assert_eq!(s, 201);
    let ids: Vec<&str> = b
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1]);
    let (s, _) = call("DELETE", &format!("{tasks}/{}", ids[0]), None).await;
    assert_eq!(s, 204);
    let (s, b) = call("GET", &format!("{tasks}/{}", ids[0]), None).await;
    assert_eq!((s, code(&b)), (404, "not_found"));
    let (s, b) = call("DELETE", &format!("{tasks}/nope"), None).await;
    assert_eq!((s, code(&b)), (404, "not_found"));
    let (s, _) = call("POST", &format!("{tasks}/nope/run"), None).await;
    assert_eq!(s, 404);

    // idempotent by id: the second schedule replaces the first
    for payload in [json!(1), json!(2)] {
        let (s, _) = call(
            "POST",
            &tasks,
            Some(json!({"plugin": "noop", "id": "idem", "run_at": far, "payload": payload})),
        )
        .await;
        assert_eq!(s, 201);
    }
    let (_, t) = call("GET", &format!("{tasks}/idem"), None).await;
    assert_eq!(t["payload"], 2);

    // bad input
    let cases: Vec<(Value, u16, &str, &str)> = vec![
        (
            json!({"payload": 1}),
            400,
            "bad_request",
            "plugin is required",
        ),
        (
            json!({"plugin": 5}),
            400,
            "bad_request",
            "plugin must be a string",
        ),
        (
            json!({"plugin": "Bad Name"}),
            400,
            "bad_request",
            "not a plugin name",
        ),
        (
            json!({"plugin": "noop", "run_at": "soon"}),
            400,
            "bad_request",
            "run_at must be an integer",
        ),
        (
            json!({"plugin": "noop", "run_at": 5, "delay_ms": 5}),
            400,
            "bad_request",
            "not both",
        ),
        (
            json!({"plugin": "noop", "delay_ms": -5}),
            400,
            "bad_request",
            "delay_ms must be from 0",
        ),
        (
            json!({"plugin": "noop", "max_attempts": 0}),
            400,
            "bad_request",
            "max_attempts",
        ),
        (
            json!({"plugin": "noop", "id": "has\ttab"}),
            400,
            "bad_request",
            "id must be 1 to 200 bytes without control characters",
        ),
        (
            json!({"plugin": "noop", "colour": "red"}),
            400,
            "bad_request",
            "unknown field `colour`",
        ),
        (
            json!([{"plugin": "noop"}, {"plugin": 1}]),
            400,
            "bad_request",
            "[1].plugin must be a string",
        ),
        (json!([]), 400, "bad_request", "empty"),
        (
            json!({"plugin": "nosuch"}),
            422,
            "unknown_plugin",
            "no plugin named \"nosuch\"",
        ),
        (
            json!({"plugin": "noop", "payload": "x".repeat(2000)}),
            413,
            "too_large",
            "payload is",
        ),
    ];
    for (body, status, c, msg) in cases {
        let (s, b) = call("POST", &tasks, Some(body.clone())).await;
        assert_eq!((s, code(&b)), (status, c), "{body}: {b}");
        assert!(message(&b).contains(msg), "{body}: {b}");
    }
    let (s, b) = raw("POST", &tasks, "application/json", b"{not json".to_vec()).await;
    assert_eq!((s, code(&b)), (400, "bad_request"));
    let (s, b) = raw("POST", &tasks, "text/plain", b"{}".to_vec()).await;
    assert_eq!((s, code(&b)), (415, "unsupported_media_type"));
    let big: Vec<Value> = (0..10_001).map(|_| json!({"plugin": "noop"})).collect();
    let (s, b) = call("POST", &tasks, Some(json!(big))).await;
    assert_eq!(
        (s, code(&b), message(&b)),
        (
            400,
            "bad_request",
            "the array of task specs: more than 10000 elements"
        )
    );
    let (s, b) = call(
        "PATCH",
        &format!("{tasks}/idem"),
        Some(json!({"run_at": 1, "shift_ms": 1})),
    )
    .await;
    assert_eq!((s, code(&b)), (400, "bad_request"));
    let (s, b) = call("GET", &format!("{}/v1/nowhere", r.url), None).await;
    assert_eq!((s, code(&b)), (404, "not_found"));
}

#[tokio::test]
async fn dead_letters_are_listed_retried_and_dropped() {
    let redis = RedisServer::start();
    let r = start(
        &redis,
        &["--plugin-timeout", "100ms", "--retry-base", "20ms"],
    );
    let tasks = format!("{}/v1/tasks", r.url);
    let specs: Vec<Value> = (0..3)
        .map(|i| json!({"plugin": "test-panic", "id": format!("d{i}"), "max_attempts": 1}))
        .collect();
    assert_eq!(call("POST", &tasks, Some(json!(specs))).await.0, 201);
    for i in 0..3 {
        wait_state(&r.url, &format!("d{i}"), "dead", T).await;
    }
    // paging: 2 + 1
    let (s, p1) = call("GET", &format!("{}/v1/dead?limit=2", r.url), None).await;
    assert_eq!(s, 200);
    assert_eq!(p1["tasks"].as_array().unwrap().len(), 2);
    let cursor = p1["next_cursor"].as_str().unwrap();
    let (_, p2) = call(
        "GET",
        &format!("{}/v1/dead?limit=2&cursor={cursor}", r.url),
        None,
    )
    .await;
    assert_eq!(p2["tasks"].as_array().unwrap().len(), 1);
    assert!(p2["next_cursor"].is_null());
    assert!(
        p1["tasks"][0]["last_error"]
            .as_str()
            .unwrap()
            .contains("panic")
    );
    let (s, b) = call("GET", &format!("{}/v1/dead?limit=zero", r.url), None).await;
    assert_eq!((s, code(&b)), (400, "bad_request"));
    // retry one (it dies again), drop another
    let (s, b) = call("POST", &format!("{}/v1/dead/d0/retry", r.url), None).await;
    assert_eq!(s, 200, "{b}");
    let (s, _) = call("DELETE", &format!("{}/v1/dead/d1", r.url), None).await;
    assert_eq!(s, 204);
    let (s, _) = call("GET", &format!("{tasks}/d1"), None).await;
    assert_eq!(s, 404);
    let (s, _) = call("DELETE", &format!("{}/v1/dead/d1", r.url), None).await;
    assert_eq!(s, 404);
    let t = wait_state(&r.url, "d0", "dead", T).await;
    assert_eq!(t["attempts"], 1);
}

#[tokio::test]
async fn plugin_routes_upload_list_roll_back_delete_and_refuse_bad_binaries() {
    let redis = RedisServer::start();
    let r = start(&redis, &["--max-plugin-bytes", "1000000"]);
    let p = format!("{}/v1/plugins", r.url);
    let (s, b) = upload(&r.url, "rb", plugin_wasm("noop")).await;
    assert_eq!((s, b["version"].as_u64()), (201, Some(1)));
    let digest1 = b["digest"].as_str().unwrap().to_owned();
    let (s, b) = call("POST", &format!("{p}/rb/rollback"), None).await;
    assert_eq!((s, code(&b)), (409, "conflict"), "one version: {b}");
    let (s, b) = upload(&r.url, "rb", plugin_wasm("noop")).await;
    assert_eq!(
        (s, b["version"].as_u64()),
        (200, Some(1)),
        "the same bytes again: same version"
    );
    let (s, b) = upload(&r.url, "rb", plugin_wasm("coupon-expiry")).await;
    assert_eq!((s, b["version"].as_u64()), (201, Some(2)));
    let (s, list) = call("GET", &p, None).await;
    assert_eq!(s, 200);
    let rb = list
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "rb")
        .unwrap();
    assert_eq!(rb["version"], 2);
    assert!(rb["size"].as_u64().unwrap() > 1000 && rb["uploaded_at"].as_i64().unwrap() > 0);
    let (s, b) = call("GET", &format!("{p}/rb"), None).await;
    assert_eq!((s, b["history"].as_array().unwrap().len()), (200, 2));
    let (s, b) = call("POST", &format!("{p}/rb/rollback"), None).await;
    assert_eq!(
        (
            s,
            b["version"].as_u64(),
            b["digest"].as_str(),
            b["previous"].as_u64()
        ),
        (200, Some(1), Some(digest1.as_str()), Some(2))
    );
    // a rollback goes back to the version current before: twice comes back, three times
    // returns to the first
    let (s, b) = call("POST", &format!("{p}/rb/rollback"), None).await;
    assert_eq!(
        (s, b["version"].as_u64(), b["previous"].as_u64()),
        (200, Some(2), Some(1))
    );
    let (s, b) = call("POST", &format!("{p}/rb/rollback"), None).await;
    assert_eq!(
        (s, b["version"].as_u64(), b["previous"].as_u64()),
        (200, Some(1), Some(2))
    );
    // v3 kept as a candidate, then promoted: a rollback goes back to v1, which it replaced,
    // not to v2, the newest before it
    let (s, b) = upload(&r.url, "rb?promote=false", plugin_wasm("order-cancel")).await;
    assert_eq!((s, b["version"].as_u64()), (201, Some(3)), "{b}");
    let (s, b) = call(
        "POST",
        &format!("{p}/rb/promote"),
        Some(json!({"version": 3})),
    )
    .await;
    assert_eq!(
        (s, b["version"].as_u64(), b["previous"].as_u64()),
        (200, Some(3), Some(1)),
        "{b}"
    );
    let (s, b) = call("POST", &format!("{p}/rb/rollback"), None).await;
    assert_eq!(
        (s, b["version"].as_u64(), b["previous"].as_u64()),
        (200, Some(1), Some(3)),
        "{b}"
    );
    // the rolled-back version runs: noop emits nothing, so the task is simply done
    call("POST", &format!("{}/v1/tasks", r.url), Some(json!({"plugin": "rb", "id": "x", "payload": {"coupon_id": "c", "user_id": "u", "expires_at": 1}}))).await;
    wait_state(&r.url, "x", "done", T).await;
    assert!(eggtimer_tests::read_events(&mut redis.conn(), &["rb"], "push").is_empty());
    let (s, _) = call("DELETE", &format!("{p}/rb"), None).await;
    assert_eq!(s, 204);
    let (s, b) = call("GET", &format!("{p}/rb"), None).await;
    assert_eq!((s, code(&b)), (404, "not_found"));
    let (s, _) = call("DELETE", &format!("{p}/rb"), None).await;
    assert_eq!(s, 404);

    // refusals
    let (s, b) = upload(&r.url, "junk", b"not wasm at all".to_vec()).await;
    assert_eq!((s, code(&b)), (400, "invalid_plugin"));
    assert!(
        message(&b).contains("not a valid WebAssembly component"),
        "{b}"
    );
    let (s, b) = upload(&r.url, "empty", EMPTY_COMPONENT.to_vec()).await;
    assert_eq!((s, code(&b)), (400, "invalid_plugin"));
    assert!(
        message(&b).contains("does not export the eggtimer handler"),
        "{b}"
    );
    let (s, b) = upload(&r.url, "Bad_Name", plugin_wasm("noop")).await;
    assert_eq!((s, code(&b)), (400, "bad_request"));
    let (s, b) = upload(&r.url, "big", vec![0; 1_000_001]).await;
    assert_eq!((s, code(&b)), (413, "too_large"));
    let (s, b) = raw(
        "PUT",
        &format!("{p}/x"),
        "application/octet-stream",
        plugin_wasm("noop"),
    )
    .await;
    assert_eq!((s, code(&b)), (415, "unsupported_media_type"));
}

#[tokio::test]
async fn the_token_guards_every_v1_route_and_not_health() {
    let redis = RedisServer::start();
    let r = start(&redis, &["--token", "s3cret"]);
    for (method, path) in [
        ("GET", "/v1/tasks/x"),
        ("POST", "/v1/tasks"),
        ("GET", "/v1/plugins"),
        ("GET", "/v1/dead"),
    ] {
        let (s, b) = call(
            method,
            &format!("{}{path}", r.url),
            Some(json!({"plugin": "noop"})),
        )
        .await;
        assert_eq!((s, code(&b)), (401, "unauthorized"), "{method} {path}");
        let resp = http()
            .request(method.parse().unwrap(), format!("{}{path}", r.url))
            .bearer_auth("wrong")
            .json(&json!({"plugin": "noop"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 401);
    }
    let resp = http()
        .post(format!("{}/v1/tasks", r.url))
        .bearer_auth("s3cret")
        .json(&json!({"plugin": "noop"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    // the CLI takes it from the environment or a file, not only from its command line (where
    // `ps` shows it)
    let dir = eggtimer_tests::temp_dir("token");
    let file = dir.join("token");
    std::fs::write(&file, "s3cret\n").unwrap();
    let list = |env: &[(&str, &str)]| {
        std::process::Command::new(eggtimer_bin())
            .args(["plugin", "list", "--json", "--url", &r.url])
            .env_remove("EGGTIMER_TOKEN")
            .envs(env.iter().copied())
            .output()
            .unwrap()
    };
    assert!(!list(&[]).status.success(), "no token: 401");
    for env in [
        [("EGGTIMER_TOKEN", "s3cret")],
        [("EGGTIMER_TOKEN_FILE", file.to_str().unwrap())],
    ] {
        let out = list(&env);
        assert!(
            out.status.success(),
            "{env:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for path in ["/healthz", "/readyz"] {
        assert_eq!(
            http()
                .get(format!("{}{path}", r.url))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16(),
            200,
            "{path}"
        );
    }
    // the metrics name every team's plugins: with a token they want it
    let metrics = |bearer: Option<&'static str>| {
        let mut rq = http().get(format!("{}/metrics", r.url));
        if let Some(b) = bearer {
            rq = rq.bearer_auth(b);
        }
        async move { rq.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(metrics(None).await, 401);
    assert_eq!(metrics(Some("s3cret")).await, 200);
}

#[tokio::test]
async fn an_upload_on_one_runner_is_used_by_another_within_a_second() {
    let redis = RedisServer::start();
    let a = start(&redis, &[]);
    let b = start(&redis, &[]);
    let (s, _) = upload(&a.url, "shared", plugin_wasm("noop")).await;
    assert_eq!(s, 201);
    let t0 = std::time::Instant::now();
    let (s, _) = upload(&a.url, "shared", plugin_wasm("coupon-expiry")).await;
    assert_eq!(s, 201);
    eventually(
        Duration::from_secs(1),
        "runner B to load version 2",
        || async {
            let m = http()
                .get(format!("{}/metrics", b.url))
                .send()
                .await
                .ok()?
                .text()
                .await
                .ok()?;
            m.contains("eggtimer_plugin_loaded{plugin=\"shared\",version=\"2\"")
                .then_some(())
        },
    )
    .await;
    eprintln!(
        "runner B loaded the new version {:?} after the reply",
        t0.elapsed()
    );
    let (s, runners) = call("GET", &format!("{}/v1/runners", a.url), None).await;
    assert_eq!(s, 200);
    assert_eq!(runners.as_array().unwrap().len(), 2, "{runners}");
}

#[tokio::test]
async fn redis_away_gives_503_and_everything_resumes_when_it_is_back() {
    let mut redis = RedisServer::start();
    let r = start(&redis, &[]);
    let tasks = format!("{}/v1/tasks", r.url);
    // tasks due while Redis is away
    let due = now_ms() + 1500;
    let specs: Vec<Value> = (0..50).map(|i| json!({"plugin": "order-cancel", "id": format!("o{i}"), "run_at": due, "payload": {"order_id": format!("{i}"), "user_id": "u"}})).collect();
    assert_eq!(call("POST", &tasks, Some(json!(specs))).await.0, 201);
    redis.stop();
    let (s, b) = call("GET", &format!("{}/readyz", r.url), None).await;
    assert_eq!((s, code(&b)), (503, "redis_unavailable"));
    let (s, b) = call("POST", &tasks, Some(json!({"plugin": "noop"}))).await;
    assert_eq!((s, code(&b)), (503, "redis_unavailable"));
    let (s, _) = call("GET", &format!("{tasks}/o1"), None).await;
    assert_eq!(s, 503);
    assert_eq!(
        call("GET", &format!("{}/healthz", r.url), None).await.0,
        200
    );
    tokio::time::sleep(Duration::from_millis(2000)).await; // the tasks fall due while Redis is away
    redis.start_again();
    eventually(T, "readyz to recover", || async {
        (call("GET", &format!("{}/readyz", r.url), None).await.0 == 200).then_some(())
    })
    .await;
    for i in 0..50 {
        wait_state(&r.url, &format!("o{i}"), "done", T).await;
    }
    let events = eggtimer_tests::read_events(&mut redis.conn(), &["order-cancel"], "order");
    assert_eq!(events.len(), 50);
    assert_eq!(
        call("POST", &tasks, Some(json!({"plugin": "noop"})))
            .await
            .0,
        201
    );
}
