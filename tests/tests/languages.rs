//! Plugins in TypeScript and Python (plugins/*-ts, plugins/*-py, built by `cargo xtask plugins`
//! with jco and componentize-py) through the real runner, asserted like the Rust samples: the
//! same events byte for byte, order-cancel once per order, a payload that does not fit dead at
//! once, a thrown exception a failed attempt with its message. And the SDKs' native test hosts
//! (node's test runner, pytest), the JS SDK's WIT types generated from wit/plugin.wit, and the
//! type check of TypeScript plugins. (Plugins calling services: guest_http.rs.)

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use eggtimer_tests::guests::{events_by_task, guest_runner as runner, program, run_ok, upload_all};
use eggtimer_tests::{
    RedisServer, built_plugins, call, owner_priorities, plugin_wasm, post_tasks, read_events,
    temp_dir, upload, wait_state, workspace,
};
use serde_json::json;

const T: Duration = Duration::from_secs(120);

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
    }
    // each SDK's `check` refuses a payload its handler could not read when it is scheduled,
    // naming the field; the batch it came in is not written
    for l in langs {
        let misfit = json!([
            {"id": format!("fits{l}"), "plugin": format!("order-cancel{l}"),
             "payload": {"order_id": "o9", "user_id": "u9"}},
            {"id": format!("misfit{l}"), "plugin": format!("order-cancel{l}"),
             "payload": {"order_id": "o9"}},
        ]);
        let (s, b) = call("POST", &format!("{base}/v1/tasks"), Some(misfit)).await;
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (422, Some("invalid_payload")),
            "{b}"
        );
        let m = b["error"]["message"].as_str().unwrap();
        assert!(
            m.starts_with("[1].payload: missing field") && m.contains("user_id"),
            "order-cancel{l} names the field: {m}"
        );
        for id in [format!("fits{l}"), format!("misfit{l}")] {
            let (s, _) = call("GET", &format!("{base}/v1/tasks/{id}"), None).await;
            assert_eq!(s, 404, "nothing of the batch was written");
        }
        let wrong_type = json!({"plugin": format!("coupon-expiry{l}"),
            "payload": {"coupon_id": "c1", "user_id": "u1", "expires_at": "soon"}});
        let (s, b) = call("POST", &format!("{base}/v1/tasks"), Some(wrong_type)).await;
        assert_eq!(s, 422, "{b}");
        let m = b["error"]["message"].as_str().unwrap();
        assert!(
            m.starts_with("payload: ") && m.contains("expires_at"),
            "coupon-expiry{l} says what does not fit: {m}"
        );
    }
    // the TypeScript field map and the Python dataclass, described as JSON Schema
    for l in ["-ts", "-py"] {
        let (s, p) = call("GET", &format!("{base}/v1/plugins/order-cancel{l}"), None).await;
        assert_eq!(s, 200, "{p}");
        let schema = &p["payload_schema"];
        assert_eq!(
            schema["properties"]["user_id"]["type"], "string",
            "{l}: {p}"
        );
        assert_eq!(
            schema["required"],
            json!(["order_id", "user_id"]),
            "{l}: {p}"
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
    }
    let push = events_by_task(
        &redis,
        &["coupon-expiry", "coupon-expiry-ts", "coupon-expiry-py"],
        "push",
    );
    let rust = &push["coupon"];
    assert_eq!(rust.len(), 1, "{push:?}");
    for l in ["-ts", "-py"] {
        assert_eq!(
            &push[&format!("coupon{l}")],
            rust,
            "coupon-expiry{l} emits what Rust emits"
        );
    }
    let orders = read_events(
        &mut redis.conn(),
        &["order-cancel", "order-cancel-ts", "order-cancel-py"],
        "order",
    );
    for l in langs {
        let mine: Vec<_> = orders
            .iter()
            .filter(|(_, _, d)| d["order_id"] == format!("o{l}"))
            .collect();
        assert_eq!(mine.len(), 1, "order-cancel{l}: once per order: {orders:?}");
    }
    let by_task = events_by_task(
        &redis,
        &["order-cancel", "order-cancel-ts", "order-cancel-py"],
        "order",
    );
    let text = |l: &str| {
        let a = by_task.get(&format!("order{l}-a"));
        let b = by_task.get(&format!("order{l}-b"));
        a.or(b).unwrap()[0].replace(&format!("\"o{l}\""), "\"o\"")
    };
    assert_eq!(text("-ts"), text(""), "the same event as Rust's");
    assert_eq!(text("-py"), text(""), "the same event as Rust's");
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

/// A follow-up's priority given through the TypeScript and Python SDKs reaches the task (the
/// components import the contract's `schedule-with-priority`); above 9 the runner refuses it and
/// the run fails with the rule.
#[tokio::test]
async fn typescript_and_python_plugins_give_their_follow_ups_a_priority() {
    let redis = RedisServer::start();
    let r = runner(&redis);
    let base = r.url.as_str();
    upload_all(base, &["test-throw-ts", "test-throw-py"]).await;
    post_tasks(
        base,
        json!([
            {"id": "ts", "plugin": "test-throw-ts", "owner": "lang", "payload": {"priority": 7}},
            {"id": "py", "plugin": "test-throw-py", "owner": "lang", "payload": {"priority": 3}},
            {"id": "ts-bad", "plugin": "test-throw-ts", "max_attempts": 1, "payload": {"priority": 10}},
            {"id": "py-bad", "plugin": "test-throw-py", "max_attempts": 1, "payload": {"priority": 10}},
        ]),
    )
    .await;
    wait_state(base, "ts", "done", T).await;
    wait_state(base, "py", "done", T).await;
    let got = owner_priorities(base, "lang", |t| &t["plugin"]).await;
    assert_eq!(
        got,
        [
            ("test-throw-py".to_owned(), json!(3)),
            ("test-throw-ts".to_owned(), json!(7)),
        ],
        "{got:?}"
    );
    for id in ["ts-bad", "py-bad"] {
        let t = wait_state(base, id, "dead", T).await;
        assert!(
            t["last_error"]
                .as_str()
                .unwrap_or_default()
                .contains("priority must be an integer from 0 to 9"),
            "{t}"
        );
    }
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

/// Tasks scheduled at once after an upload's 201 reach runners still compiling the plugin: they
/// wait for it there (put back, no attempt used) instead of failing an attempt.
#[tokio::test]
async fn tasks_scheduled_right_after_an_upload_wait_for_runners_still_loading_it() {
    let redis = RedisServer::start();
    let a = runner(&redis);
    // b compiles what it loads itself (a cache of its own): the Python plugin takes it seconds
    let cache = eggtimer_tests::temp_dir("own-plugin-cache");
    let dir = eggtimer_tests::plugins_dir();
    let b = eggtimer_tests::RunnerProcess::start(
        &redis.url(),
        &[
            "--plugins-dir",
            dir.to_str().unwrap(),
            "--retry-base",
            "50ms",
            "--plugin-cache",
            cache.to_str().unwrap(),
        ],
    );
    eggtimer_tests::runners_holding_shards(&a.url, 2).await;
    let (s, body) = upload(&a.url, "late-py", plugin_wasm("coupon-expiry-py")).await;
    assert_eq!(s, 201, "{body}");
    let specs: Vec<serde_json::Value> = (0..32)
        .map(|i| {
            json!({"id": format!("l{i}"), "plugin": "late-py",
                        "payload": {"coupon_id": format!("c{i}"), "user_id": "u", "expires_at": 1}})
        })
        .collect();
    post_tasks(&a.url, json!(specs)).await;
    for i in 0..32 {
        let t = wait_state(&a.url, &format!("l{i}"), "done", T).await;
        assert_eq!(t["attempts"], 1, "{t}");
    }
    // b met some of them before it had the plugin (else this test would show nothing)
    let waited = eggtimer_tests::metric(&b.url, "eggtimer_limit_waits_total{plugin=\"late-py\"}")
        .await
        .unwrap_or(0.0);
    assert!(
        waited >= 1.0,
        "runner b had loaded the plugin before it met a task of it"
    );
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
        out.contains("# pass 9") && out.contains("# fail 0"),
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
            .args(["-w", "checked", "bindings"])
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
    assert!(out.contains("11 passed"), "{out}");
    assert!(
        !Path::new(&py.join("tests/__pycache__")).exists(),
        "pytest wrote into the source tree"
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
