//! Payloads checked by the code that will run them, with a real runner and real plugins: a
//! plugin's `check` (the Rust SDK derives it from the handler's payload type) refuses a task it
//! could not read when the task is scheduled, by a recurring schedule or as a follow-up; and a
//! deploy whose new version can't read tasks already waiting is kept as a candidate (409) unless
//! forced (audited), then promoted once the tasks are fixed. (Each SDK's 422: languages.rs.)

use eggtimer_tests::as_key::{ADMIN, req, upload_as};
use eggtimer_tests::{RedisServer, RunnerProcess, plugin_wasm};
use serde_json::{Value, json};

/// PUT /v1/plugins/{name}{query} as the admin: (status, reply).
async fn deploy(base: &str, name: &str, query: &str, wasm: Vec<u8>) -> (u16, Value) {
    upload_as(base, ADMIN, &format!("{name}{query}"), wasm).await
}

/// POST /v1/plugins/orders/promote{query} `{"version"}` as the admin: (status, reply).
async fn promote(base: &str, query: &str, version: u64) -> (u16, Value) {
    let path = format!("/v1/plugins/orders/promote{query}");
    admin("POST", base, &path, Some(json!({"version": version}))).await
}

async fn admin(method: &str, base: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    req(method, &format!("{base}{path}"), Some(ADMIN), body).await
}

#[tokio::test]
async fn a_payload_the_plugin_cant_read_is_refused_when_it_is_scheduled() {
    let redis = RedisServer::start();
    let r = RunnerProcess::start(&redis.url(), &["--token", ADMIN]);
    let base = r.url.as_str();
    let (s, up) = deploy(base, "order-cancel", "", plugin_wasm("order-cancel")).await;
    assert_eq!(s, 201, "{up}");
    let (s, p) = admin("GET", base, "/v1/plugins/order-cancel", None).await;
    assert_eq!((s, &p["check"]), (200, &json!(true)), "{p}");
    // and says what it takes (the SDK's `schema`: its payload type's JSON Schema)
    let schema = &p["payload_schema"];
    assert_eq!(schema["properties"]["user_id"]["type"], "string", "{p}");
    assert_eq!(schema["required"], json!(["order_id", "user_id"]), "{p}");

    // one task: the message names the field, as serde says it
    let (s, e) = admin(
        "POST",
        base,
        "/v1/tasks",
        Some(json!({"id": "o1", "plugin": "order-cancel", "payload": {"order_id": "o1"}})),
    )
    .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (422, Some("invalid_payload")),
        "{e}"
    );
    let m = e["error"]["message"].as_str().unwrap();
    assert!(m.starts_with("payload: missing field `user_id`"), "{m}");
    // a wrong type names its path
    let (s, e) = admin(
        "POST",
        base,
        "/v1/tasks",
        Some(json!({"plugin": "order-cancel", "payload": {"order_id": 7, "user_id": "u"}})),
    )
    .await;
    assert_eq!(s, 422, "{e}");
    let m = e["error"]["message"].as_str().unwrap();
    assert!(
        m.starts_with("payload: order_id: invalid type: integer `7`"),
        "{m}"
    );

    // a batch with one misfit writes nothing
    let mut batch: Vec<Value> = (0..5)
        .map(|i| {
            json!({"id": format!("b{i}"), "plugin": "order-cancel", "delay_ms": 600_000,
            "payload": {"order_id": format!("o{i}"), "user_id": "u1"}})
        })
        .collect();
    batch[3]["payload"] = json!({"user_id": "u1"});
    let (s, e) = admin("POST", base, "/v1/tasks", Some(json!(batch))).await;
    assert_eq!(s, 422, "{e}");
    let m = e["error"]["message"].as_str().unwrap();
    assert!(
        m.starts_with("[3].payload: missing field `order_id`"),
        "{m}"
    );
    for i in 0..5 {
        let (s, _) = admin("GET", base, &format!("/v1/tasks/b{i}"), None).await;
        assert_eq!(s, 404, "b{i}: nothing of the batch was written");
    }
    batch[3]["payload"] = json!({"order_id": "o3", "user_id": "u1"});
    let (s, e) = admin("POST", base, "/v1/tasks", Some(json!(batch))).await;
    assert_eq!(s, 201, "{e}");

    // a recurring schedule is checked when it is created or changed
    let (s, e) = admin(
        "PUT",
        base,
        "/v1/schedules/nightly",
        Some(
            json!({"plugin": "order-cancel", "every_ms": 3_600_000, "payload": {"order_id": "o"}}),
        ),
    )
    .await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (422, Some("invalid_payload")),
        "{e}"
    );
    let (s, _) = admin("GET", base, "/v1/schedules/nightly", None).await;
    assert_eq!(s, 404, "the schedule was not saved");

    // a plugin without `check` (built against the `plugin` world) takes any payload, as before
    let (s, up) = deploy(base, "plain", "", plugin_wasm("noop-plain")).await;
    assert_eq!(s, 201, "{up}");
    let (s, p) = admin("GET", base, "/v1/plugins/plain", None).await;
    assert_eq!((s, &p["check"]), (200, &json!(false)), "{p}");
    assert_eq!(p["payload_schema"], Value::Null, "{p}");
    let (s, e) = admin(
        "POST",
        base,
        "/v1/tasks",
        Some(json!({"plugin": "plain", "delay_ms": 600_000, "payload": {"anything": 1}})),
    )
    .await;
    assert_eq!(s, 201, "{e}");
}

/// 10,000 orders waiting; v2 of the plugin (order-cancel's code: it needs `user_id`) can't read 3
/// of them. Every request as the admin.
#[tokio::test]
async fn a_deploy_that_cant_read_waiting_tasks_is_a_candidate_until_forced_or_fixed() {
    let redis = RedisServer::start();
    let r = RunnerProcess::start(&redis.url(), &["--token", ADMIN]);
    let base = r.url.as_str();
    // v1 takes any JSON (noop's payload type is serde_json::Value)
    let (s, up) = deploy(base, "orders", "", plugin_wasm("noop")).await;
    assert_eq!((s, up["version"].as_u64()), (201, Some(1)), "{up}");
    let misfits = [17, 4242, 9999];
    for chunk in (0..10_000).collect::<Vec<u32>>().chunks(1000) {
        let specs: Vec<Value> = chunk
            .iter()
            .map(|i| {
                let payload = if misfits.contains(i) {
                    json!({"order_id": format!("o{i}")})
                } else {
                    json!({"order_id": format!("o{i}"), "user_id": "u1"})
                };
                json!({"id": format!("t{i}"), "plugin": "orders", "delay_ms": 3_600_000,
                    "payload": payload})
            })
            .collect();
        let (s, e) = admin("POST", base, "/v1/tasks", Some(json!(specs))).await;
        assert_eq!(s, 201, "{e}");
    }

    // v2 is refused: kept as a candidate, v1 stays current
    let v2 = plugin_wasm("order-cancel");
    let (s, e) = deploy(base, "orders", "", v2.clone()).await;
    assert_eq!(
        (s, e["error"]["code"].as_str()),
        (409, Some("incompatible_payloads")),
        "{e}"
    );
    let err = &e["error"];
    assert_eq!(
        (err["failing"].as_u64(), err["checked"].as_u64()),
        (Some(3), Some(10_000)),
        "{e}"
    );
    assert_eq!(err["version"], 2, "{e}");
    let ids: Vec<&str> = err["examples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["t17", "t4242", "t9999"], "{e}");
    assert!(
        err["examples"][0]["message"]
            .as_str()
            .unwrap()
            .contains("missing field `user_id`"),
        "{e}"
    );
    let (_, p) = admin("GET", base, "/v1/plugins/orders", None).await;
    assert_eq!(p["version"], 1, "v1 is still current: {p}");
    assert_eq!(p["history"][0]["candidate"], true, "{p}");
    // the CLI says the same as a table, and the same bytes again name the same candidate
    let out = std::process::Command::new(eggtimer_tests::eggtimer_bin())
        .args(["plugin", "push", "orders"])
        .arg(eggtimer_tests::plugins_dir().join("order-cancel.wasm"))
        .args(["--url", base, "--token", ADMIN])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let rows: Vec<&str> = stderr.lines().collect();
    assert!(
        rows[0].starts_with("TASK ") && rows[0].contains("WHY"),
        "{stderr}"
    );
    assert!(
        rows[1].starts_with("t17 ") && rows[1].contains("user_id"),
        "{stderr}"
    );
    assert!(
        stderr.contains("3 of 10000 waiting tasks refused by v2"),
        "{stderr}"
    );
    let (_, p) = admin("GET", base, "/v1/plugins/orders", None).await;
    assert_eq!(p["history"].as_array().unwrap().len(), 2, "{p}");
    // promoting it goes through the same check
    let (s, e) = promote(base, "", 2).await;
    assert_eq!((s, e["error"]["failing"].as_u64()), (409, Some(3)), "{e}");

    // the team fixes the three and promotes the candidate
    for i in misfits {
        let (s, e) = admin(
            "POST",
            base,
            "/v1/tasks",
            Some(
                json!({"id": format!("t{i}"), "plugin": "orders", "delay_ms": 3_600_000,
                "payload": {"order_id": format!("o{i}"), "user_id": "u1"}}),
            ),
        )
        .await;
        assert_eq!(s, 201, "{e}");
    }
    let (s, e) = promote(base, "", 2).await;
    assert_eq!((s, e["version"].as_u64()), (200, Some(2)), "{e}");
    let (_, p) = admin("GET", base, "/v1/plugins/orders", None).await;
    assert_eq!(
        (&p["version"], &p["check"]),
        (&json!(2), &json!(true)),
        "{p}"
    );
    assert!(p["history"][0].get("candidate").is_none(), "{p}");

    // a misfit scheduled under v1 again (v1 back by a rollback; v2 checks it then)
    let (s, e) = admin("POST", base, "/v1/plugins/orders/rollback", None).await;
    assert_eq!((s, e["version"].as_u64()), (200, Some(1)), "{e}");
    let (s, e) = admin(
        "POST",
        base,
        "/v1/tasks",
        Some(
            json!({"id": "late", "plugin": "orders", "delay_ms": 3_600_000,
            "payload": {"order_id": "late"}}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{e}");
    // the same bytes again as a candidate: no new version
    let (s, e) = deploy(base, "orders", "?promote=false", v2.clone()).await;
    assert_eq!(
        (s, e["candidate"].as_bool()),
        (200, Some(false)),
        "v2 is in the history: {e}"
    );
    let (s, e) = promote(base, "", 2).await;
    assert_eq!((s, e["error"]["failing"].as_u64()), (409, Some(1)), "{e}");
    // forced: current, and the audit has it
    let (s, e) = promote(base, "?force=true", 2).await;
    assert_eq!((s, e["version"].as_u64()), (200, Some(2)), "{e}");
    let (s, audit) = admin("GET", base, "/v1/audit?plugin=orders", None).await;
    assert_eq!(s, 200, "{audit}");
    assert!(
        audit
            .as_array()
            .or(audit["entries"].as_array())
            .unwrap()
            .iter()
            .any(|a| a["path"] == "/v1/plugins/orders/promote"
                && a["query"] == "force=true"
                && a["status"] == 200),
        "{audit}"
    );
}

/// A plugin's follow-up is checked by the plugin it is for, inside the run: a refusal is the
/// `schedule` call's error (test-flood's `schedule` passes it on, failing its attempt).
#[tokio::test]
async fn a_follow_up_the_other_plugin_cant_read_is_refused_to_the_guest() {
    let redis = RedisServer::start();
    let dir = eggtimer_tests::plugins_dir();
    let r = RunnerProcess::start(
        &redis.url(),
        &["--token", ADMIN, "--plugins-dir", dir.to_str().unwrap()],
    );
    let base = r.url.as_str();
    let (s, e) = admin(
        "PATCH",
        base,
        "/v1/plugins/test-flood",
        Some(json!({"may_schedule": ["order-cancel", "coupon-expiry"]})),
    )
    .await;
    assert_eq!(s, 200, "{e}");
    // its follow-up payload is an order: order-cancel reads it (tried until the runner applies
    // may_schedule, within a second)
    let mut n = 0;
    let done = eggtimer_tests::eventually(
        std::time::Duration::from_secs(30),
        "a follow-up of order-cancel",
        || {
            n += 1;
            let id = format!("to-orders-{n}");
            async move {
                let spec = json!({"id": id, "plugin": "test-flood", "max_attempts": 1,
                    "payload": {"what": "schedule", "id": "order-cancel"}});
                let (s, e) = admin("POST", base, "/v1/tasks", Some(spec)).await;
                assert_eq!(s, 201, "{e}");
                let t = eggtimer_tests::as_key::wait_state_in(base, &id, &["done", "dead"]).await;
                (t["state"] == "done").then_some(t)
            }
        },
    )
    .await;
    let line = done["log"][0]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let follow_up = line.strip_prefix("scheduled ").expect(&line);
    let (s, t) = admin(
        "GET",
        base,
        &format!("/v1/tasks/{follow_up}?plugin=order-cancel"),
        None,
    )
    .await;
    assert_eq!((s, &t["plugin"]), (200, &json!("order-cancel")), "{t}");
    // coupon-expiry does not: the schedule call fails, and with it the attempt
    let (s, e) = admin(
        "POST",
        base,
        "/v1/tasks",
        Some(
            json!({"id": "to-coupons", "plugin": "test-flood", "max_attempts": 1,
             "payload": {"what": "schedule", "id": "coupon-expiry"}}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{e}");
    let dead = eggtimer_tests::as_key::wait_state(base, "to-coupons", "dead").await;
    let err = dead["last_error"].as_str().unwrap();
    assert!(
        err.contains("missing field `coupon_id`") && err.contains("\"coupon-expiry\" refused it"),
        "{dead}"
    );
}

/// Another team (the admin, `order-cancel`) schedules again and again while the `slow`
/// requests run: each of its schedules is 201, and it asked at least twice.
async fn another_team_schedules_while(base: &str, slow: &[tokio::task::JoinHandle<(u16, Value)>]) {
    let mut theirs = 0;
    while !slow.iter().all(|h| h.is_finished()) {
        theirs += 1;
        let spec = json!({"id": format!("o-{theirs}"), "plugin": "order-cancel",
            "delay_ms": 3_600_000, "payload": {"order_id": "o", "user_id": "u"}});
        let (s, e) = admin("POST", base, "/v1/tasks", Some(spec)).await;
        assert_eq!(s, 201, "another team's task while the slow checks run: {e}");
    }
    assert!(
        theirs >= 2,
        "the slow checks were over before the other team asked"
    );
}

/// A team whose check sleeps to its time limit, asked by 40 requests at once, holds at most two
/// of a runner's four check slots: another team's tasks are checked and scheduled all the while
/// (201, never 503 `busy`); the slow team's own requests wait, and some are told to try again.
#[tokio::test]
async fn a_plugins_slow_check_holds_up_only_its_own_requests() {
    let redis = RedisServer::start();
    let dir = eggtimer_tests::plugins_dir();
    let r = RunnerProcess::start(
        &redis.url(),
        &["--token", ADMIN, "--plugins-dir", dir.to_str().unwrap()],
    );
    let base = r.url.clone();
    let slow: Vec<_> = (0..40)
        .map(|i| {
            let base = base.clone();
            tokio::spawn(async move {
                let spec = json!({"id": format!("slow-{i}"), "plugin": "test-slow-check",
                    "delay_ms": 3_600_000, "payload": {"check_ms": 900}});
                admin("POST", &base, "/v1/tasks", Some(spec)).await
            })
        })
        .collect();
    another_team_schedules_while(&base, &slow).await;
    let mut busy = 0;
    for h in slow {
        let (s, e) = h.await.unwrap();
        match s {
            201 => {}
            503 => {
                assert_eq!(e["error"]["code"], "busy", "{e}");
                busy += 1;
            }
            _ => panic!("a slow check's request: {s} {e}"),
        }
    }
    assert!(
        busy > 0,
        "40 checks of 0.9 s through two slots in 5 s: some wait too long"
    );
}

/// Check slots are shared per team, not per plugin: a team that uploads the sleeping check
/// under two names, raises their time limit and floods both with checks that outlast the 5 s
/// queue still holds at most
/// two of a runner's four slots, so another team's schedules are checked all the while (0.2.0
/// gave each plugin two: the four were the slow team's, and everyone else's schedules answered
/// 503 `busy`).
#[tokio::test]
async fn a_team_with_two_slow_checks_holds_no_more_slots_than_with_one() {
    let redis = RedisServer::start();
    let dir = eggtimer_tests::plugins_dir();
    let r = RunnerProcess::start(
        &redis.url(),
        &["--token", ADMIN, "--plugins-dir", dir.to_str().unwrap()],
    );
    let base = r.url.clone();
    let (_, team) =
        eggtimer_tests::as_key::make_key(&base, "slow-team", "developer", &["slow-a", "slow-b"])
            .await;
    // a check runs under its plugin's check time limit, which the team may raise (to 10 s)
    for name in ["slow-a", "slow-b"] {
        let (s, up) = upload_as(&base, &team, name, plugin_wasm("test-slow-check")).await;
        assert_eq!(s, 201, "{up}");
        let (s, p) = req(
            "PATCH",
            &format!("{base}/v1/plugins/{name}"),
            Some(&team),
            Some(json!({"check_time_limit_ms": 10_000})),
        )
        .await;
        assert_eq!(s, 200, "{p}");
    }
    let slow: Vec<_> = (0..8)
        .map(|i| {
            let (base, team) = (base.clone(), team.clone());
            tokio::spawn(async move {
                let plugin = if i % 2 == 0 { "slow-a" } else { "slow-b" };
                let spec = json!({"id": format!("slow-{i}"), "plugin": plugin,
                    "delay_ms": 3_600_000, "payload": {"check_ms": 7_000}});
                req("POST", &format!("{base}/v1/tasks"), Some(&team), Some(spec)).await
            })
        })
        .collect();
    another_team_schedules_while(&base, &slow).await;
    let mut busy = 0;
    for h in slow {
        let (s, e) = h.await.unwrap();
        match s {
            201 => {}
            503 => busy += 1,
            _ => panic!("a slow check's request: {s} {e}"),
        }
    }
    assert!(
        busy > 0,
        "8 checks of 7 s through two slots in 5 s: some wait too long"
    );
}

/// A check's time limit is its own setting, not its runs': a team that gives its plugin long runs
/// (`time_limit_ms` 10 s) still has its check stopped at the runner's `--check-timeout` (1 s by
/// default), saying so; the team may raise it up to the operator's cap (`--max-check-timeout`)
/// and under an admin's ceiling, never past them.
#[tokio::test]
async fn a_checks_time_limit_is_its_own_not_its_runs() {
    let redis = RedisServer::start();
    let dir = eggtimer_tests::plugins_dir();
    let r = RunnerProcess::start(
        &redis.url(),
        &["--token", ADMIN, "--plugins-dir", dir.to_str().unwrap()],
    );
    let base = r.url.clone();
    let (_, team) =
        eggtimer_tests::as_key::make_key(&base, "slow-team", "developer", &["slow-c"]).await;
    let (s, up) = upload_as(&base, &team, "slow-c", plugin_wasm("test-slow-check")).await;
    assert_eq!(s, 201, "{up}");
    let patch = |body: serde_json::Value, bearer: &str| {
        let (base, bearer) = (base.clone(), bearer.to_owned());
        async move {
            req(
                "PATCH",
                &format!("{base}/v1/plugins/slow-c"),
                Some(&bearer),
                Some(body),
            )
            .await
        }
    };
    let (s, p) = patch(json!({"time_limit_ms": 10_000}), &team).await;
    assert_eq!((s, &p["check_time_limit_ms"]), (200, &json!(null)), "{p}");
    let schedule = |id: &str| {
        let (base, team) = (base.clone(), team.clone());
        let spec = json!({"id": id, "plugin": "slow-c", "delay_ms": 3_600_000,
                          "payload": {"check_ms": 2_500}});
        async move { req("POST", &format!("{base}/v1/tasks"), Some(&team), Some(spec)).await }
    };
    let (s, e) = schedule("t1").await;
    assert_eq!(s, 422, "{e}");
    let m = e["error"]["message"].as_str().unwrap();
    assert!(m.contains("check time limit of 1s"), "{m}");

    // past the operator's cap: only an admin; above an admin's ceiling: refused
    let (s, e) = patch(json!({"check_time_limit_ms": 20_000}), &team).await;
    assert_eq!(s, 400, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-check-timeout"),
        "{e}"
    );
    let (s, e) = patch(json!({"ceilings": {"check_time_limit_ms": 4_000}}), ADMIN).await;
    assert_eq!(s, 200, "{e}");
    let (s, e) = patch(json!({"check_time_limit_ms": 5_000}), &team).await;
    assert_eq!(s, 403, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ceiling of 4000"),
        "{e}"
    );
    let (s, p) = patch(json!({"check_time_limit_ms": 4_000}), &team).await;
    assert_eq!((s, &p["check_time_limit_ms"]), (200, &json!(4_000)), "{p}");
    let (s, e) = schedule("t2").await;
    assert_eq!(s, 201, "a check of 2.5 s under its own limit of 4 s: {e}");
}
