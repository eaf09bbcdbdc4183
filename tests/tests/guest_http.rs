//! Plugins in TypeScript and JavaScript calling services through a real runner, to real HTTP
//! servers on 127.0.0.1: the SDKs' `http` with config and secrets (QuickJS and componentize-py),
//! a StarlingMonkey build's `fetch` over `wasi:http` under the same rules, and the TypeScript
//! webhook sample signing as the Rust one does.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eggtimer_tests::guests::{events_by_task, guest_runner as runner, run_ok, upload_all};
use eggtimer_tests::{
    RedisServer, built_plugins, call, post_tasks, temp_dir, upload, wait_state, workspace,
};
use serde_json::json;

const T: Duration = Duration::from_secs(120);

/// A receiver on 127.0.0.1: answers 201 with `X-Echo: <the request's X-Token>` and the body
/// `got <the request's body>`.
async fn echo_server() -> u16 {
    use axum::http::HeaderMap;
    let app = axum::Router::new().route(
        "/in",
        axum::routing::post(|headers: HeaderMap, body: String| async move {
            let token = headers
                .get("x-token")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            (
                axum::http::StatusCode::CREATED,
                [("x-echo", token)],
                format!("got {body}"),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    port
}

#[tokio::test(flavor = "multi_thread")]
async fn typescript_and_python_plugins_call_services_with_config_and_secrets() {
    let redis = RedisServer::start();
    let port = echo_server().await;
    let r = runner(&redis);
    let base = r.url.as_str();
    upload_all(base, &["test-http-ts", "test-http-py"]).await;
    for (name, token) in [("test-http-ts", "tok-ts"), ("test-http-py", "tok-py")] {
        let (s, b) = call(
            "PATCH",
            &format!("{base}/v1/plugins/{name}"),
            Some(
                json!({"allowed_hosts": [format!("http://127.0.0.1:{port}")],
                        "config": {"url": format!("http://127.0.0.1:{port}/in")}}),
            ),
        )
        .await;
        assert_eq!(s, 200, "{b}");
        let (s, b) = call(
            "PUT",
            &format!("{base}/v1/plugins/{name}/secrets/token"),
            Some(json!({"value": token})),
        )
        .await;
        assert_eq!(s, 204, "{b}");
    }
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    post_tasks(
        base,
        json!([
            {"id": "ts", "plugin": "test-http-ts", "max_attempts": 1, "payload": {"body": {"n": "é1"}}},
            {"id": "py", "plugin": "test-http-py", "max_attempts": 1, "payload": {"body": {"n": "é1"}}},
        ]),
    )
    .await;
    for id in ["ts", "py"] {
        let t = wait_state(base, id, "done", T).await;
        assert_eq!(t["attempts"], 1, "{t}");
    }
    let events = events_by_task(&redis, &["test-http-ts", "test-http-py"], "http");
    for (id, token) in [("ts", "tok-ts"), ("py", "tok-py")] {
        let data: serde_json::Value = serde_json::from_str(&events[id][0]).unwrap();
        assert_eq!(
            data,
            json!({"status": 201, "echo": token, "body": "got {\"n\":\"é1\"}"}),
            "{id}"
        );
    }
}

/// What a recording receiver got: each request's headers (lowercase names) and body.
type Received = Arc<Mutex<Vec<(HashMap<String, String>, String)>>>;

/// A receiver on 127.0.0.1 that records each request to `/in` and answers 201 `got <body>`, and
/// 400 `no thanks` to `/refuse`.
async fn recording_server() -> (u16, Received) {
    use axum::http::HeaderMap;
    let seen: Received = Arc::default();
    let log = Arc::clone(&seen);
    let record = move |status: u16, answer: &'static str| {
        let log = Arc::clone(&log);
        move |headers: HeaderMap, body: String| {
            let log = Arc::clone(&log);
            async move {
                let h = headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
                    .collect();
                log.lock().unwrap().push((h, body.clone()));
                let code = axum::http::StatusCode::from_u16(status).unwrap();
                (code, answer.replace("{body}", &body))
            }
        }
    };
    let app = axum::Router::new()
        .route("/in", axum::routing::post(record(201, "got {body}")))
        .route("/refuse", axum::routing::post(record(400, "no thanks")));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (port, seen)
}

/// The standard wasi:http outgoing handler, as a StarlingMonkey (componentize-js) build's `fetch`
/// uses it, under the rules of the host's own `http-send`: an allowed origin gets the request
/// with the runner's Idempotency-Key and the plugin reads the answer; an origin not allowed gets
/// nothing and the attempt fails.
#[tokio::test(flavor = "multi_thread")]
async fn a_starlingmonkey_plugins_fetch_goes_where_it_is_allowed_with_the_idempotency_key() {
    built_plugins(); // installs jco and its componentize-js (StarlingMonkey) into target/js-tools
    let dir = temp_dir("starlingmonkey");
    std::fs::write(
        dir.join("index.js"),
        r#"import { emit } from 'eggtimer:plugin/host@0.1.0';
export async function handle(task) {
  const { url } = JSON.parse(task.payload);
  let text;
  try {
    const r = await fetch(url, { method: 'POST', body: `hello ${task.id}` });
    text = `${r.status} ${await r.text()}`;
  } catch (e) {
    return { tag: 'fail', val: `fetch failed: ${e}` };
  }
  emit('fetched', JSON.stringify({ text }));
  return { tag: 'done' };
}
"#,
    )
    .unwrap();
    let cjs = workspace().join("target/js-tools/node_modules/.bin/componentize-js");
    run_ok(
        Command::new(&cjs)
            .current_dir(&dir)
            .arg("--wit")
            .arg(workspace().join("wit/plugin.wit"))
            .args(["--world-name", "plugin", "-o", "sm.wasm", "index.js"]),
        "componentize-js",
    );
    let wasm = std::fs::read(dir.join("sm.wasm")).unwrap();
    let (allowed, seen) = recording_server().await;
    let (other, other_seen) = recording_server().await;
    let redis = RedisServer::start();
    let r = runner(&redis);
    let base = r.url.as_str();
    let (s, b) = upload(base, "fetcher", wasm).await;
    assert_eq!(s, 201, "{b}");
    let (s, b) = call(
        "PATCH",
        &format!("{base}/v1/plugins/fetcher"),
        Some(json!({"allowed_hosts": [format!("http://127.0.0.1:{allowed}")]})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    post_tasks(
        base,
        json!([
            {"id": "sm-ok", "plugin": "fetcher", "max_attempts": 1,
             "payload": {"url": format!("http://127.0.0.1:{allowed}/in")}},
            {"id": "sm-no", "plugin": "fetcher", "max_attempts": 1,
             "payload": {"url": format!("http://127.0.0.1:{other}/in")}},
        ]),
    )
    .await;
    let t = wait_state(base, "sm-ok", "done", T).await;
    let dead = wait_state(base, "sm-no", "dead", T).await;
    let err = dead["last_error"].as_str().unwrap_or_default();
    assert!(err.contains("fetch failed"), "{dead}");
    assert!(
        other_seen.lock().unwrap().is_empty(),
        "a refused origin got a request"
    );
    let got: Vec<(String, String)> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(h, body)| (h["idempotency-key"].clone(), body.clone()))
        .collect();
    let key = eggtimer_sdk::testing::idempotency_key("sm-ok", t["created_at"].as_i64().unwrap(), 0);
    assert_eq!(got, vec![(key, "hello sm-ok".to_owned())]);
    let events = events_by_task(&redis, &["fetcher"], "fetched");
    assert_eq!(
        events["sm-ok"],
        vec![r#"{"text":"201 got hello sm-ok"}"#.to_owned()]
    );
}

/// The TypeScript webhook sample signs and delivers what the Rust one does: the body as the Rust
/// SDK writes it, `X-Eggtimer-Signature` the HMAC-SHA256 of those bytes with its secret, the
/// runner's Idempotency-Key; a 400 is dead at once with the answer in the error.
#[tokio::test(flavor = "multi_thread")]
async fn the_typescript_webhook_signs_and_delivers_as_the_rust_one() {
    use hmac::{Hmac, Mac};
    let (port, seen) = recording_server().await;
    let redis = RedisServer::start();
    let r = runner(&redis);
    let base = r.url.as_str();
    upload_all(base, &["webhook-ts"]).await;
    let (s, b) = call(
        "PATCH",
        &format!("{base}/v1/plugins/webhook-ts"),
        Some(json!({"allowed_hosts": [format!("http://127.0.0.1:{port}")]})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = call(
        "PUT",
        &format!("{base}/v1/plugins/webhook-ts/secrets/signing_key"),
        Some(json!({"value": "whsec-ts"})),
    )
    .await;
    assert_eq!(s, 204, "{b}");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let body = json!({"state": "cancelled", "order_id": "o1", "note": "é€"});
    post_tasks(
        base,
        json!([
            {"id": "wh-ok", "plugin": "webhook-ts", "payload": {"url": format!("http://127.0.0.1:{port}/in"), "body": body, "headers": {"X-Tenant": "t1"}}},
            {"id": "wh-400", "plugin": "webhook-ts", "payload": {"url": format!("http://127.0.0.1:{port}/refuse"), "body": {}}},
        ]),
    )
    .await;
    let t = wait_state(base, "wh-ok", "done", T).await;
    let dead = wait_state(base, "wh-400", "dead", T).await;
    assert_eq!(dead["attempts"], 1, "a 400 is not retried: {dead}");
    assert_eq!(
        dead["last_error"].as_str(),
        Some("the receiver answered 400: no thanks"),
        "{dead}"
    );
    let got = seen.lock().unwrap().clone();
    let (h, sent) = got
        .iter()
        .find(|(h, _)| h.get("x-eggtimer-task").map(String::as_str) == Some("wh-ok"))
        .expect("the delivery arrived");
    // the bytes serde_json writes for the same value: keys sorted, no spaces
    assert_eq!(sent, &serde_json::to_string(&body).unwrap());
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"whsec-ts").unwrap();
    mac.update(sent.as_bytes());
    let want = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    assert_eq!(h["x-eggtimer-signature"], want);
    assert_eq!(h["x-tenant"], "t1");
    assert_eq!(h["content-type"], "application/json");
    assert_eq!(
        h["idempotency-key"],
        eggtimer_sdk::testing::idempotency_key("wh-ok", t["created_at"].as_i64().unwrap(), 0)
    );
    assert_eq!(
        got.iter()
            .filter(|(h, _)| h.get("x-eggtimer-task").map(String::as_str) == Some("wh-ok"))
            .count(),
        1,
        "delivered once"
    );
}
