//! The OpenAPI document: it covers every route, and schemathesis (PyPI), with all of its checks,
//! finds no answer of a real runner that breaks it: no 5xx, every status, header and body as
//! documented, schema-valid input accepted and schema-invalid input refused.

use std::path::PathBuf;
use std::process::Command;

use eggtimer_tests::{RedisServer, RunnerProcess, call, plugins_dir, workspace};

/// The schemathesis command: `EGGTIMER_SCHEMATHESIS`, the venv `.ci/run` makes, or PATH.
fn schemathesis() -> PathBuf {
    if let Some(p) = std::env::var_os("EGGTIMER_SCHEMATHESIS") {
        return p.into();
    }
    let venv = workspace().join("target/py/bin/schemathesis");
    if venv.exists() {
        return venv;
    }
    eggtimer_tests::find_program(&["schemathesis"]).unwrap_or_else(|| {
        panic!(
            "schemathesis is not installed. Install it into the repository's target dir (as .ci/run does): \
             `python3 -m venv target/py && target/py/bin/pip install schemathesis==4.32.5`"
        )
    })
}

#[tokio::test]
async fn the_document_names_every_route_of_the_api() {
    let redis = RedisServer::start();
    let r = RunnerProcess::start(&redis.url(), &[]);
    let (s, doc) = call("GET", &format!("{}/v1/openapi.json", r.url), None).await;
    assert_eq!(s, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    for (path, methods) in [
        ("/v1/tasks", &["post"][..]),
        ("/v1/tasks/{id}", &["get", "patch", "delete"]),
        ("/v1/tasks/{id}/run", &["post"]),
        ("/v1/owners/{owner}/tasks", &["get"]),
        ("/v1/owners/{owner}/shift", &["post"]),
        ("/v1/dead", &["get"]),
        ("/v1/dead/{id}/retry", &["post"]),
        ("/v1/dead/{id}", &["delete"]),
        ("/v1/plugins", &["get"]),
        ("/v1/plugins/{name}", &["put", "get", "delete"]),
        ("/v1/plugins/{name}/rollback", &["post"]),
        ("/v1/plugins/{name}/secrets", &["get"]),
        ("/v1/plugins/{name}/secrets/{key}", &["put", "delete"]),
        ("/v1/runners", &["get"]),
        ("/v1/stats", &["get"]),
        ("/v1/stats/history", &["get"]),
        ("/v1/events/{topic}", &["get"]),
        ("/healthz", &["get"]),
        ("/readyz", &["get"]),
        ("/metrics", &["get"]),
    ] {
        for m in methods {
            assert!(
                doc["paths"][path][m].is_object(),
                "{m} {path} is not in the document"
            );
        }
    }
}

/// docs/api.md is the document a runner serves, rendered (`eggtimer_tests::api_doc`).
/// `EGGTIMER_BLESS=1` rewrites the file instead of comparing.
#[tokio::test]
async fn the_api_reference_in_docs_is_the_document_rendered() {
    let redis = RedisServer::start();
    let r = RunnerProcess::start(&redis.url(), &[]);
    let (s, doc) = call("GET", &format!("{}/v1/openapi.json", r.url), None).await;
    assert_eq!(s, 200);
    let fresh = eggtimer_tests::api_doc::markdown(&doc);
    let file = workspace().join("docs/api.md");
    if std::env::var_os("EGGTIMER_BLESS").is_some() {
        std::fs::write(&file, &fresh).unwrap();
    }
    let have = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        have == fresh,
        "docs/api.md does not match the OpenAPI document; rewrite it with \
         `EGGTIMER_BLESS=1 cargo test -p eggtimer-tests --test openapi the_api_reference`"
    );
    for route in [
        "#### `POST /v1/tasks`",
        "#### `PATCH /v1/plugins/{name}`",
        "### TaskSpec",
    ] {
        assert!(fresh.contains(route), "{route} is not in the reference");
    }
}

/// Every shape of answer `POST /v1/tasks` gives (one task, a batch, a debounced one and a batch of
/// them; new and merged) is valid under the document's `ScheduleReply`, checked with the
/// `jsonschema_rs` package of schemathesis's Python: the fuzzer finds a missing shape only by chance.
#[tokio::test]
async fn every_answer_of_a_schedule_fits_the_document() {
    let redis = RedisServer::start();
    let dir = plugins_dir();
    let r = RunnerProcess::start(&redis.url(), &["--plugins-dir", dir.to_str().unwrap()]);
    let (s, doc) = call("GET", &format!("{}/v1/openapi.json", r.url), None).await;
    assert_eq!(s, 200);
    let url = format!("{}/v1/tasks", r.url);
    let later = serde_json::json!({"plugin": "noop", "delay_ms": 3_600_000});
    let debounced = |key: &str| {
        serde_json::json!({"plugin": "noop", "payload": {"k": key},
                           "debounce": {"key": key, "quiet_ms": 60_000, "max_wait_ms": 600_000}})
    };
    let mut answers = Vec::new();
    for body in [
        later.clone(),
        serde_json::json!([later.clone(), later]),
        debounced("one"),
        debounced("one"),
        serde_json::json!([debounced("two"), debounced("one")]),
    ] {
        let (s, answer) = call("POST", &url, Some(body.clone())).await;
        assert_eq!(s, 201, "{body} -> {answer}");
        answers.push(answer);
    }
    assert_eq!(answers[3]["debounced"], "merged", "{}", answers[3]);
    let reply = serde_json::json!({"$ref": "#/components/schemas/ScheduleReply"});
    let checked: Vec<_> = answers.into_iter().map(|a| (reply.clone(), a)).collect();
    assert_fits(&doc, &checked);
}

/// Checks each answer against its schema (with the document's components) by the
/// `jsonschema_rs` package of schemathesis's Python, and that every field of every object in it
/// is one its schema (with the parts it is made of: `allOf`, `oneOf`, `anyOf`) describes: a
/// field the document leaves out is lost to a client generated from it (openapi-python-client
/// drops it). A free-form object (no `properties`) takes any field.
fn assert_fits(doc: &serde_json::Value, checked: &[(serde_json::Value, serde_json::Value)]) {
    let python = schemathesis().with_file_name("python");
    const CHECK: &str = r##"
import json, sys, jsonschema_rs
doc, checked = json.load(sys.stdin)
components = doc["components"]
def parts(s):
    while "$ref" in s:
        s = components["schemas"][s["$ref"].split("/")[-1]]
    out = [s]
    for k in ("allOf", "oneOf", "anyOf"):
        for sub in s.get(k, []):
            out += parts(sub)
    return out
def undescribed(s, v, path):
    ps, bad = parts(s), []
    if isinstance(v, dict):
        maps = [p["additionalProperties"] for p in ps if isinstance(p.get("additionalProperties"), dict)]
        props = {}
        for p in ps:
            props.update(p.get("properties", {}))
        for k, x in v.items():
            if k in props:
                bad += undescribed(props[k], x, path + [k])
            elif maps:
                bad += undescribed({"anyOf": maps}, x, path + [k])
            elif any("properties" in p for p in ps) or any(p.get("additionalProperties") is False for p in ps):
                bad.append(("a field the document does not describe", path + [k]))
    elif isinstance(v, list):
        items = [p["items"] for p in ps if isinstance(p.get("items"), dict)]
        for i, x in enumerate(v):
            if items:
                bad += undescribed({"anyOf": items}, x, path + [i])
    return bad
bad = []
for schema, answer in checked:
    v = jsonschema_rs.Draft202012Validator({**schema, "components": components})
    bad += [(e.message[:300], list(e.instance_path)) for e in v.iter_errors(answer)]
    bad += undescribed(schema, answer, [])
print(json.dumps(bad, indent=1)[:20000])
sys.exit(1 if bad else 0)
"##;
    let mut child = Command::new(&python)
        .args(["-c", CHECK])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
    {
        use std::io::Write;
        let input = serde_json::json!([doc, checked]).to_string();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "answers outside the document: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Every answer of the routes that show settings, keys, versions and runners fits its documented
/// type with no field left undescribed: a client generated from the document (openapi-python-client,
/// which keeps only what a schema names) gets every field the API sends.
#[tokio::test]
async fn every_answer_fits_its_documented_type_with_no_field_left_out() {
    let redis = RedisServer::start();
    let dir = plugins_dir();
    let key = eggtimer_tests::secrets_key_file();
    let r = RunnerProcess::start(
        &redis.url(),
        &[
            "--plugins-dir",
            dir.to_str().unwrap(),
            "--secrets-key-file",
            key.to_str().unwrap(),
        ],
    );
    let (s, doc) = call("GET", &format!("{}/v1/openapi.json", r.url), None).await;
    assert_eq!(s, 200);
    let patch = serde_json::json!({"allowed_hosts": ["https://api.example.com"], "config": {"a": "b"},
        "max_pending": 500, "rate_limit": {"max": 5, "per_ms": 1000}, "max_concurrency": 2,
        "ceilings": {"max_pending": 1000}, "may_schedule": ["noop"], "weight": 2});
    let task = serde_json::json!({"plugin": "noop", "id": "t1", "delay_ms": 3_600_000, "owner": "o1",
        "on": [{"topic": "payments", "key": "k", "then": "cancel"}]});
    let calls: Vec<(&str, &str, String, Option<serde_json::Value>, &str)> = vec![
        (
            "patch",
            "/v1/plugins/{name}",
            "/v1/plugins/webhook".into(),
            Some(patch),
            "200",
        ),
        ("get", "/v1/plugins", "/v1/plugins".into(), None, "200"),
        (
            "get",
            "/v1/plugins/{name}",
            "/v1/plugins/webhook".into(),
            None,
            "200",
        ),
        (
            "post",
            "/v1/plugins/{name}/pause",
            "/v1/plugins/noop/pause".into(),
            None,
            "200",
        ),
        ("post", "/v1/tasks", "/v1/tasks".into(), Some(task), "201"),
        ("get", "/v1/tasks/{id}", "/v1/tasks/t1".into(), None, "200"),
        (
            "get",
            "/v1/owners/{owner}/tasks",
            "/v1/owners/o1/tasks".into(),
            None,
            "200",
        ),
        ("get", "/v1/tasks", "/v1/tasks?owner=o1".into(), None, "200"),
        ("get", "/v1/runners", "/v1/runners".into(), None, "200"),
        (
            "post",
            "/v1/keys",
            "/v1/keys".into(),
            Some(
                serde_json::json!({"name": "k", "role": "developer", "plugins": ["noop"],
                "max_pending": 10, "publish": ["p"], "listen": ["l"], "streams": ["s"]}),
            ),
            "201",
        ),
        ("get", "/v1/keys", "/v1/keys".into(), None, "200"),
        ("get", "/v1/audit", "/v1/audit".into(), None, "200"),
        ("get", "/v1/stats", "/v1/stats".into(), None, "200"),
    ];
    let mut checked = Vec::new();
    for (method, template, path, body, status) in calls {
        let (s, answer) = call(&method.to_uppercase(), &format!("{}{path}", r.url), body).await;
        assert_eq!(s.to_string(), status, "{method} {path}: {answer}");
        let schema = doc["paths"][template][method]["responses"][status]["content"]
            ["application/json"]["schema"]
            .clone();
        assert!(
            schema.is_object(),
            "{method} {template} {status} has no schema"
        );
        checked.push((schema, answer));
    }
    assert_fits(&doc, &checked);
}

#[tokio::test]
async fn schemathesis_with_every_check_finds_nothing() {
    let redis = RedisServer::start();
    let dir = plugins_dir();
    let key = eggtimer_tests::secrets_key_file();
    let admin = "schemathesis-admin";
    let r = RunnerProcess::start(
        &redis.url(),
        &[
            "--plugins-dir",
            dir.to_str().unwrap(),
            "--token",
            admin,
            "--secrets-key-file",
            key.to_str().unwrap(),
        ],
    );
    schemathesis_finds_nothing(&r, &["--header", &format!("Authorization: Bearer {admin}")]);
}

/// The same with a team's key: a developer of some plugins only, on a runner with a token.
/// Requests it may not make are 401/403/404 as documented; none is a 5xx.
#[tokio::test]
async fn schemathesis_with_a_teams_key_finds_nothing() {
    let redis = RedisServer::start();
    let dir = plugins_dir();
    let key = eggtimer_tests::secrets_key_file();
    let admin = "schemathesis-admin";
    let r = RunnerProcess::start(
        &redis.url(),
        &[
            "--plugins-dir",
            dir.to_str().unwrap(),
            "--token",
            admin,
            "--secrets-key-file",
            key.to_str().unwrap(),
        ],
    );
    let k: serde_json::Value = eggtimer_tests::http()
        .post(format!("{}/v1/keys", r.url))
        .bearer_auth(admin)
        .json(&serde_json::json!({"name": "team", "role": "developer", "plugins": ["order-*", "test-*", "noop"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let key = k["key"].as_str().expect("a key");
    schemathesis_finds_nothing(&r, &["--header", &format!("Authorization: Bearer {key}")]);
    // it spoke as the key: changes made with it, and refusals of plugins outside its scope
    let audit: serde_json::Value = eggtimer_tests::http()
        .get(format!("{}/v1/audit?key=team&limit=1000", r.url))
        .bearer_auth(admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let statuses: Vec<u64> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["status"].as_u64())
        .collect();
    assert!(
        statuses.iter().any(|s| *s < 300),
        "no change made with the key: {statuses:?}"
    );
    assert!(
        statuses.contains(&403),
        "no refusal of the key: {statuses:?}"
    );
}

/// Runs schemathesis with every check against `r` (with `extra` arguments) and asserts it found
/// nothing, generated enough requests, and that the runner did not panic.
fn schemathesis_finds_nothing(r: &RunnerProcess, extra: &[&str]) {
    // one run at a time: each loads the machine (and its runner) fully
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let bin = schemathesis();
    let conf = workspace().join("tests/schemathesis");
    let out = Command::new(&bin)
        .current_dir(eggtimer_tests::temp_dir("schemathesis"))
        .env("PYTHONPATH", &conf)
        .env("SCHEMATHESIS_HOOKS", "eggtimer_hooks")
        .arg("--config-file")
        .arg(conf.join("schemathesis.toml"))
        .args(["run", &format!("{}/v1/openapi.json", r.url)])
        .args(["--checks", "all", "--max-examples", "60", "--no-color"])
        .args(extra)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    let text = String::from_utf8_lossy(&out.stdout);
    let summary: String = text
        .lines()
        .filter(|l| l.contains("generated") || l.contains("Failures") || l.contains(" ST"))
        .collect::<Vec<_>>()
        .join("\n");
    eprintln!("schemathesis: {summary}");
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{}\n{}",
        text.chars().take(20_000).collect::<String>(),
        String::from_utf8_lossy(&out.stderr)
    );
    let generated: u64 = text
        .lines()
        .find_map(|l| l.trim().split(" generated").next()?.trim().parse().ok())
        .expect("schemathesis reports how many requests it generated");
    assert!(generated > 1000, "only {generated} requests were generated");
    // the runner's own panics; a plugin's panic (schemathesis may schedule a `test-panic` task) is
    // a failed attempt, logged as the plugin's stderr and the task's error
    let log = r.log_text();
    let runner_panics: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("panicked"))
        .filter(|l| !l.contains("plugin stderr") && !l.contains("the task failed"))
        .collect();
    assert!(runner_panics.is_empty(), "the runner panicked:\n{log}");
}

/// A Python client generated from the document by openapi-python-client (PyPI; nobody here wrote
/// it) reads the answers of the routes that list and show things — plugins with their settings,
/// keys with their limits, tasks, owners, schedules, runners, stats, the audit — and keeps no
/// field outside the ones the document describes (such a field lands in a model's
/// `additional_properties`, and a client of a stricter generator drops it).
#[tokio::test]
async fn a_client_generated_from_the_document_keeps_every_field_of_the_answers() {
    use eggtimer_tests::as_key::{ADMIN, req};
    use serde_json::json;
    let bin = workspace().join("target/py-gen/bin");
    assert!(
        bin.join("openapi-python-client").is_file(),
        "openapi-python-client is not installed. Install it into the repository's target dir (as \
         `cargo xtask test` does): `python3 -m venv target/py-gen && target/py-gen/bin/pip install \
         openapi-python-client==0.29.1`"
    );
    let redis = RedisServer::start();
    let r = RunnerProcess::start(
        &redis.url(),
        &[
            "--token",
            ADMIN,
            "--plugins-dir",
            plugins_dir().to_str().unwrap(),
        ],
    );
    let base = r.url.as_str();
    let ok = |(s, v): (u16, serde_json::Value)| {
        assert!((200..300).contains(&s), "{s} {v}");
    };
    ok(req(
        "PATCH",
        &format!("{base}/v1/plugins/bench-record"),
        Some(ADMIN),
        Some(json!({"max_pending": 500, "config": {"region": "eu"},
                    "rate_limit": {"max": 100, "per_ms": 1000},
                    "ceilings": {"max_concurrency": 4}})),
    )
    .await);
    ok(req(
        "POST",
        &format!("{base}/v1/keys"),
        Some(ADMIN),
        Some(
            json!({"name": "team-a", "role": "developer", "plugins": ["a-*"],
                    "max_plugins": 3, "max_pending": 100, "task_bytes": 1_048_576,
                    "event_bytes": 1_048_576, "publish": ["a.*"], "listen": ["a.*"]}),
        ),
    )
    .await);
    ok(req(
        "POST",
        &format!("{base}/v1/tasks"),
        Some(ADMIN),
        Some(
            json!({"id": "t1", "plugin": "bench-record", "payload": {"n": 1}, "owner": "u1",
                    "delay_ms": 3_600_000,
                    "on": [{"topic": "orders", "key": "o1", "then": "cancel"}]}),
        ),
    )
    .await);
    ok(req(
        "PUT",
        &format!("{base}/v1/schedules/nightly"),
        Some(ADMIN),
        Some(json!({"plugin": "bench-record", "payload": {"n": 2}, "cron": "0 3 * * *"})),
    )
    .await);
    let (s, doc) = req("GET", &format!("{base}/v1/openapi.json"), Some(ADMIN), None).await;
    assert_eq!(s, 200);
    let dir = eggtimer_tests::temp_dir("generated-client");
    let path = dir.join("openapi.json");
    std::fs::write(&path, doc.to_string()).unwrap();
    let generated = dir.join("client");
    let out = Command::new(bin.join("openapi-python-client"))
        .arg("generate")
        .arg("--path")
        .arg(&path)
        .arg("--output-path")
        .arg(&generated)
        .output()
        .unwrap();
    assert!(
        out.status.success() && generated.join("eggtimer_admin_api_client").is_dir(),
        "openapi-python-client made no client: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(bin.join("python"))
        .arg(workspace().join("tests/py/generated_client.py"))
        .args([base, ADMIN, "t1", "bench-record"])
        .env("PYTHONPATH", &generated)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("every field described"),
        "the generated client kept fields the document does not describe:\n{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
