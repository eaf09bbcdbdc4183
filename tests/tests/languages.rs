//! Plugins in TypeScript and Python (plugins/*-ts, plugins/*-py, built by `cargo xtask plugins`
//! with jco and componentize-py) through the real runner, asserted like the Rust samples: the
//! same events byte for byte, order-cancel once per order, a payload that does not fit dead at
//! once, a thrown exception a failed attempt with its message. And the SDKs' native test hosts
//! (node's test runner, pytest), and the JS SDK's WIT types generated from wit/plugin.wit.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use eggtimer_tests::{
    RedisServer, RunnerProcess, built_plugins, call, find_program, plugin_wasm, plugins_dir,
    post_tasks, read_stream, temp_dir, upload, wait_state, workspace,
};
use serde_json::json;

const T: Duration = Duration::from_secs(120);

/// A runner with the Rust plugins and a long request timeout (an 18 MB Python upload compiles
/// for seconds on a debug build under a loaded CI machine).
fn runner(redis: &RedisServer) -> RunnerProcess {
    let dir = plugins_dir();
    RunnerProcess::start(
        &redis.url(),
        &[
            "--plugins-dir",
            dir.to_str().unwrap(),
            "--http-request-timeout",
            "600s",
            "--retry-base",
            "50ms",
            "--secrets-key-file",
            KEY.get_or_init(eggtimer_tests::secrets_key_file)
                .to_str()
                .unwrap(),
        ],
    )
}

static KEY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

async fn upload_all(base: &str, names: &[&str]) {
    for n in names {
        let (s, b) = upload(base, n, plugin_wasm(n)).await;
        assert_eq!(s, 201, "uploading {n}: {b}");
    }
}

/// The `data` field of every entry of a stream, by task id.
fn events_by_task(redis: &RedisServer, topic: &str) -> HashMap<String, Vec<String>> {
    let rows: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(format!("{{eggtimer}}:events:{topic}"))
        .arg("-")
        .arg("+")
        .query(&mut redis.conn())
        .unwrap();
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    for (_, fields) in rows {
        let f: HashMap<String, String> = fields.into_iter().collect();
        out.entry(f["task_id"].clone())
            .or_default()
            .push(f["data"].clone());
    }
    out
}

#[tokio::test]
async fn the_typescript_and_python_samples_do_what_the_rust_samples_do() {
    let redis = RedisServer::start();
    let r = runner(&redis);
    let base = r.url.as_str();
    upload_all(
        base,
        &[
            "coupon-expiry-ts",
            "order-cancel-ts",
            "coupon-expiry-py",
            "order-cancel-py",
        ],
    )
    .await;
    let langs = ["", "-ts", "-py"];
    let mut specs = vec![];
    for l in langs {
        specs.push(
            json!({"id": format!("coupon{l}"), "plugin": format!("coupon-expiry{l}"),
            "payload": {"coupon_id": "c1", "user_id": "u1", "expires_at": 1_795_000_000_000_i64}}),
        );
        // the same order twice (two tasks, as if it ran twice): cancelled once
        for run in ["a", "b"] {
            specs.push(
                json!({"id": format!("order{l}-{run}"), "plugin": format!("order-cancel{l}"),
                "payload": {"order_id": format!("o{l}"), "user_id": "u1"}}),
            );
        }
        specs.push(
            json!({"id": format!("misfit{l}"), "plugin": format!("coupon-expiry{l}"),
            "payload": {"coupon": "nope"}}),
        );
    }
    post_tasks(base, json!(specs)).await;
    for l in langs {
        for id in [
            format!("coupon{l}"),
            format!("order{l}-a"),
            format!("order{l}-b"),
        ] {
            wait_state(base, &id, "done", T).await;
        }
        let dead = wait_state(base, &format!("misfit{l}"), "dead", T).await;
        assert_eq!(
            dead["attempts"], 1,
            "a payload that does not fit is not retried: {dead}"
        );
        assert!(
            dead["last_error"]
                .as_str()
                .unwrap()
                .contains("does not fit this plugin"),
            "{dead}"
        );
    }
    let push = events_by_task(&redis, "push");
    let rust = &push["coupon"];
    assert_eq!(rust.len(), 1, "{push:?}");
    for l in ["-ts", "-py"] {
        assert_eq!(
            &push[&format!("coupon{l}")],
            rust,
            "coupon-expiry{l} emits what Rust emits"
        );
    }
    let orders = read_stream(&mut redis.conn(), "{eggtimer}:events:order");
    for l in langs {
        let mine: Vec<_> = orders
            .iter()
            .filter(|(_, _, d)| d["order_id"] == format!("o{l}"))
            .collect();
        assert_eq!(mine.len(), 1, "order-cancel{l}: once per order: {orders:?}");
    }
    let by_task = events_by_task(&redis, "order");
    let text = |l: &str| {
        let a = by_task.get(&format!("order{l}-a"));
        let b = by_task.get(&format!("order{l}-b"));
        a.or(b).unwrap()[0].replace(&format!("\"o{l}\""), "\"o\"")
    };
    assert_eq!(text("-ts"), text(""), "the same event as Rust's");
    assert_eq!(text("-py"), text(""), "the same event as Rust's");
}

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
    let events = events_by_task(&redis, "http");
    for (id, token) in [("ts", "tok-ts"), ("py", "tok-py")] {
        let data: serde_json::Value = serde_json::from_str(&events[id][0]).unwrap();
        assert_eq!(
            data,
            json!({"status": 201, "echo": token, "body": "got {\"n\":\"é1\"}"}),
            "{id}"
        );
    }
}

#[tokio::test]
async fn an_exception_in_typescript_or_python_is_a_failed_attempt_with_its_message() {
    let redis = RedisServer::start();
    let r = runner(&redis);
    let base = r.url.as_str();
    upload_all(base, &["test-throw-ts", "test-throw-py"]).await;
    post_tasks(
        base,
        json!([
            {"id": "ts", "plugin": "test-throw-ts", "max_attempts": 2, "payload": {"message": "boom from ts"}},
            {"id": "py", "plugin": "test-throw-py", "max_attempts": 2, "payload": {"message": "boom from py"}},
        ]),
    )
    .await;
    let ts = wait_state(base, "ts", "dead", T).await;
    let py = wait_state(base, "py", "dead", T).await;
    // retried (a failed attempt, not a dead letter at once), then dead with the message
    assert_eq!(
        (ts["attempts"].as_u64(), py["attempts"].as_u64()),
        (Some(2), Some(2))
    );
    assert!(
        ts["last_error"].as_str().unwrap().contains("boom from ts"),
        "{ts}"
    );
    assert!(
        py["last_error"]
            .as_str()
            .unwrap()
            .contains("ValueError: boom from py"),
        "{py}"
    );
    // the runner is fine: another plugin's task runs
    post_tasks(base, json!({"id": "after", "plugin": "noop"})).await;
    wait_state(base, "after", "done", T).await;
}

#[tokio::test]
async fn a_large_python_upload_compiles_while_other_tasks_run() {
    let redis = RedisServer::start();
    let r = runner(&redis);
    let base = r.url.as_str().to_owned();
    let wasm = plugin_wasm("coupon-expiry-py");
    assert!(
        wasm.len() > 16 << 20,
        "the Python plugin is {} bytes",
        wasm.len()
    );
    let up = tokio::spawn({
        let base = base.clone();
        async move { upload(&base, "big-py", wasm).await }
    });
    // while it compiles, tasks of other plugins are scheduled and run
    let mut done_during = 0;
    for i in 0..200 {
        if up.is_finished() {
            break;
        }
        let id = format!("during-{i}");
        post_tasks(&base, json!({"id": id, "plugin": "noop"})).await;
        wait_state(&base, &id, "done", T).await;
        done_during += 1;
    }
    let (s, b) = up.await.unwrap();
    assert_eq!(s, 201, "{b}");
    assert!(done_during >= 1, "no task ran while the upload compiled");
    // ready when the reply came: a task of it runs at once
    post_tasks(
        &base,
        json!({"id": "big", "plugin": "big-py", "payload": {"coupon_id": "c", "user_id": "u", "expires_at": 1}}),
    )
    .await;
    wait_state(&base, "big", "done", T).await;
    let (_, p) = call("GET", &format!("{base}/v1/plugins/big-py"), None).await;
    assert_eq!(
        p["size"].as_u64(),
        Some(plugin_wasm("coupon-expiry-py").len() as u64)
    );
}

fn program(name: &str, install: &str) -> PathBuf {
    find_program(&[name]).unwrap_or_else(|| panic!("{name} is not on PATH: {install}"))
}

fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed:\n{text}");
    text
}

#[test]
fn the_sdks_native_test_hosts_pass_and_the_js_types_come_from_the_wit() {
    built_plugins(); // installs the toolchains into target/ (and builds the plugins)
    let node = program(
        "node",
        "install Node.js 20+ (Debian/Ubuntu: sudo apt-get install -y nodejs npm)",
    );
    let js = workspace().join("sdk/js");
    let out = run_ok(
        Command::new(&node)
            .current_dir(&js)
            .args(["--import", "./register.js", "--test", "test/"]),
        "node --test (sdk/js)",
    );
    assert!(
        out.contains("# pass 5") && out.contains("# fail 0"),
        "{out}"
    );

    // the WIT types shipped in sdk/js/wit are what jco generates from wit/plugin.wit now
    let fresh = temp_dir("jstypes");
    let transpile =
        workspace().join("target/js-tools/node_modules/@bytecodealliance/jco-transpile");
    run_ok(
        Command::new(&node)
            .arg(js.join("gen-types.mjs"))
            .arg(&transpile)
            .arg(workspace().join("wit/plugin.wit"))
            .arg(&fresh),
        "generating the WIT types",
    );
    for f in [
        "eggtimer-plugin.d.ts",
        "interfaces/eggtimer-plugin-host.d.ts",
        "interfaces/eggtimer-plugin-types.d.ts",
    ] {
        let want = std::fs::read_to_string(fresh.join(f)).unwrap();
        let have = std::fs::read_to_string(js.join("wit").join(f)).unwrap();
        assert_eq!(
            have, want,
            "sdk/js/wit/{f} is stale: regenerate with `node sdk/js/gen-types.mjs target/js-tools/node_modules/@bytecodealliance/jco-transpile wit/plugin.wit sdk/js/wit`"
        );
    }

    // pytest over the Python SDK, with the bindings componentize-py makes from the WIT
    let bin = workspace().join("target/py-tools/bin");
    let bindings = temp_dir("pybindings");
    run_ok(
        Command::new(bin.join("componentize-py"))
            .arg("-d")
            .arg(workspace().join("wit/plugin.wit"))
            .args(["-w", "plugin", "bindings"])
            .arg(&bindings),
        "componentize-py bindings",
    );
    let py = workspace().join("sdk/python");
    let path = std::env::join_paths([bindings.as_path(), py.as_path()]).unwrap();
    let out = run_ok(
        Command::new(bin.join("pytest"))
            .current_dir(temp_dir("pytest"))
            .env("PYTHONPATH", path)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .args(["-q", "-p", "no:cacheprovider"])
            .arg(py.join("tests")),
        "pytest (sdk/python)",
    );
    assert!(out.contains("5 passed"), "{out}");
    assert!(
        !Path::new(&py.join("tests/__pycache__")).exists(),
        "pytest wrote into the source tree"
    );
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
    let events = events_by_task(&redis, "fetched");
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

/// TypeScript plugins are type-checked as `cargo xtask plugins` checks them (the SDK's
/// `tsconfig.plugin.json`, strict): a type error fails with the compiler's message, the same
/// handler with the types right passes.
#[test]
fn a_typescript_type_error_fails_the_plugin_build() {
    built_plugins(); // installs tsc into target/js-tools
    let stage = temp_dir("tscheck");
    std::fs::create_dir_all(stage.join("node_modules/@eggtimer")).unwrap();
    std::os::unix::fs::symlink(
        workspace().join("sdk/js"),
        stage.join("node_modules/@eggtimer/sdk"),
    )
    .unwrap();
    // what xtask writes into each plugin's staging directory
    std::fs::write(
        stage.join("tsconfig.json"),
        r#"{ "extends": "@eggtimer/sdk/tsconfig.plugin.json", "files": ["index.ts"] }"#,
    )
    .unwrap();
    let tsc = workspace().join("target/js-tools/node_modules/.bin/tsc");
    let check = |body: &str| {
        std::fs::write(
            stage.join("index.ts"),
            format!(
                "import {{ Outcome, handler }} from '@eggtimer/sdk';\n\
                 export const handle = handler<{{ n: number }}>((task) => {{ {body} }});\n"
            ),
        )
        .unwrap();
        Command::new(&tsc)
            .current_dir(&stage)
            .args(["-p", "tsconfig.json", "--pretty", "false"])
            .output()
            .unwrap()
    };
    let bad = check("const s: string = task.payload.n; return Outcome.fail(s);");
    let text = String::from_utf8_lossy(&bad.stdout);
    assert!(!bad.status.success(), "a type error passed: {text}");
    assert!(
        text.contains("TS2322") && text.contains("not assignable to type 'string'"),
        "{text}"
    );
    let good = check("return Outcome.fail(String(task.payload.n));");
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stdout)
    );
}
