//! The dashboard in a real headless Chromium (Debian's `chromium` and `chromium-driver`, driven
//! over WebDriver with fantoccini) against a real runner: the overview's numbers match the API;
//! a task found by owner is cancelled, and so is one of the far tier; a dead letter is retried; a
//! plugin is uploaded from the file picker; a token is asked for once. Each page is photographed
//! into a temporary directory, and also into `$EGGTIMER_SCREENSHOTS` when set (how README's
//! screenshots are made).

mod browser;

use std::time::Duration;

use browser::{Browser, T};
use eggtimer_tests::{
    RedisServer, RunnerProcess, call, eventually, plugins_dir, post_tasks, wait_state,
};
use fantoccini::Locator;
use serde_json::{Value, json};

async fn stats(base: &str) -> Value {
    let (s, v) = call("GET", &format!("{base}/v1/stats"), None).await;
    assert_eq!(s, 200, "{v}");
    v
}

#[tokio::test]
async fn the_dashboard_shows_the_api_numbers_and_acts_on_tasks_dead_letters_and_plugins() {
    let redis = RedisServer::start();
    let dir = plugins_dir();
    let key = eggtimer_tests::secrets_key_file();
    let runner = RunnerProcess::start(
        &redis.url(),
        &[
            "--plugins-dir",
            dir.to_str().unwrap(),
            "--plugin-timeout",
            "300s",
            "--secrets-key-file",
            key.to_str().unwrap(),
            // plain tasks 10 minutes ahead or more go far (owned ones stay live)
            "--far-horizon",
            "10m",
        ],
    );
    let base = runner.url.as_str();
    let now = eggtimer_tests::now_ms();
    // tasks in every state: scheduled (alice, bob), running (a long sleep), dead, done
    let mut specs = vec![];
    for i in 0..5 {
        specs.push(json!({"id": format!("alice-{i}"), "plugin": "noop", "owner": "alice", "run_at": now + 600_000 + i * 60_000}));
    }
    for i in 0..3 {
        specs.push(json!({"id": format!("bob-{i}"), "plugin": "noop", "owner": "bob", "run_at": now + 1_200_000 + i * 60_000}));
    }
    // running for the whole test (its runner is killed at the end)
    specs.push(json!({"id": "sleeper", "plugin": "test-sleep", "payload": {"ms": 240_000}}));
    for i in 0..2 {
        specs.push(json!({"id": format!("dead-{i}"), "plugin": "test-panic", "max_attempts": 1}));
        specs.push(json!({"id": format!("done-{i}"), "plugin": "noop"}));
    }
    specs.push(json!({"id": "coupon", "plugin": "coupon-expiry", "payload": {"coupon_id": "c1", "user_id": "u1", "expires_at": now}}));
    post_tasks(base, json!(specs)).await;
    let (s, b) = call(
        "PUT",
        &format!("{base}/v1/schedules/nightly-sweep"),
        Some(json!({"plugin": "noop", "cron": "30 2 * * *", "tz": "Europe/Berlin"})),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    for id in ["done-0", "done-1", "coupon"] {
        wait_state(base, id, "done", T).await;
    }
    for id in ["dead-0", "dead-1"] {
        wait_state(base, id, "dead", T).await;
    }
    wait_state(base, "sleeper", "running", T).await;

    let b = Browser::start().await;

    // Overview: the numbers are the API's
    let api = stats(base).await;
    assert_eq!(
        (&api["scheduled"], &api["running"], &api["dead"]),
        (&json!(8), &json!(1), &json!(2)),
        "{api}"
    );
    b.open(base, "overview").await;
    for (css, field) in [
        ("#ov-scheduled", "scheduled"),
        ("#ov-running", "running"),
        ("#ov-dead", "dead"),
        ("#ov-due", "due_now"),
    ] {
        let want = api[field].to_string();
        b.text_until(css, field, |t| t == want).await;
    }
    b.text_until("#ov-runners", "runners", |t| t == "1").await;
    b.text_until("#runners", "the runner listed", |t| {
        t.contains(&runner.url.replace("http://", ""))
    })
    .await;
    b.text_until("#per-plugin", "per-plugin counts", |t| {
        t.contains("test-panic")
    })
    .await;
    b.count_until("#chart-throughput canvas", 1).await;
    b.count_until("#chart-due canvas", 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // let the charts paint
    b.shot("overview").await;

    // Tasks: find bob's tasks, cancel one from its detail, then the rest at once
    b.open(base, "tasks").await;
    b.type_into("#find-owner", "bob").await;
    b.click("#find-go").await;
    b.count_until("#task-rows tbody tr", 3).await;
    // the owner's panel: its counts per plugin; pause it and resume it
    let noop_row = "#owner-counts tr[data-id='noop']";
    let cells = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
    b.text_until(noop_row, "bob's counts", |t| cells(t) == "noop 3 0 0")
        .await;
    b.click("#owner-pause").await;
    b.text_until(noop_row, "bob paused", |t| cells(t) == "noop 3 0 0 paused")
        .await;
    let (_, stats) = call("GET", &format!("{base}/v1/owners/bob/stats"), None).await;
    assert_eq!(stats["paused"]["all"], true, "{stats}");
    b.click("#owner-resume").await;
    b.text_until(noop_row, "bob resumed", |t| cells(t) == "noop 3 0 0")
        .await;
    let (_, stats) = call("GET", &format!("{base}/v1/owners/bob/stats"), None).await;
    assert_eq!(stats["paused"]["all"], false, "{stats}");
    b.click("#task-rows tr[data-id='bob-0']").await;
    b.text_until("#task-detail", "the task's detail", |t| {
        t.contains("bob-0") && t.contains("noop")
    })
    .await;
    b.shot("tasks").await;
    b.click("#act-cancel").await;
    b.click("#act-cancel").await; // the second click confirms
    eventually(T, "bob-0 cancelled", || async {
        let (s, _) = call("GET", &format!("{base}/v1/tasks/bob-0"), None).await;
        (s == 404).then_some(())
    })
    .await;
    b.count_until("#task-rows tbody tr", 2).await;
    b.click("#owner-cancel").await;
    b.click("#owner-cancel").await;
    eventually(T, "bob's other tasks cancelled", || async {
        let (_, v) = call("GET", &format!("{base}/v1/owners/bob/tasks"), None).await;
        (v == json!([])).then_some(())
    })
    .await;
    let (_, alice) = call("GET", &format!("{base}/v1/owners/alice/tasks"), None).await;
    assert_eq!(
        alice.as_array().map(Vec::len),
        Some(5),
        "only bob's: {alice}"
    );

    // Tasks of one plugin due after 2,000 of another, all in the far tier: the API reads it with
    // the plugin as a filter, and on past the others until its page has them
    let fillers: Vec<Value> = (0..2000)
        .map(|i| json!({"id": format!("filler-{i}"), "plugin": "noop", "run_at": now + 3_000_000}))
        .collect();
    post_tasks(base, json!(fillers)).await;
    post_tasks(
        base,
        json!([
            {"id": "late-0", "plugin": "coupon-expiry", "run_at": now + 3_600_000,
             "payload": {"coupon_id": "c2", "user_id": "u1", "expires_at": now}},
            {"id": "late-1", "plugin": "coupon-expiry", "run_at": now + 3_600_001,
             "payload": {"coupon_id": "c3", "user_id": "u1", "expires_at": now}}
        ]),
    )
    .await;
    let far: Vec<String> = redis::cmd("KEYS")
        .arg("*:tasks:f:*")
        .query(&mut redis.conn())
        .unwrap();
    assert!(
        far.iter().any(|k| k.contains("coupon-expiry")) && far.iter().any(|k| k.contains("noop")),
        "the late tasks and the fillers are far: {far:?}"
    );
    let (_, first) = call(
        "GET",
        &format!("{base}/v1/tasks?plugin=coupon-expiry&state=scheduled&limit=100"),
        None,
    )
    .await;
    assert_eq!(
        (
            first["tasks"].as_array().map(Vec::len),
            first["next_cursor"].is_null()
        ),
        (Some(2), true),
        "the API's first page has both, read past the 2,000 others: {first}"
    );
    // (the tasks page is still open, with bob in the owner field)
    b.element("#find-owner").await.clear().await.unwrap();
    b.type_into("#find-plugin", "coupon-expiry").await;
    b.element("#find-state")
        .await
        .select_by_value("scheduled")
        .await
        .unwrap();
    b.click("#find-go").await;
    b.count_until("#task-rows tbody tr", 2).await;
    b.text_until("#task-rows", "both late tasks", |t| {
        t.contains("late-0") && t.contains("late-1")
    })
    .await;
    // a link with filters fills them and lists at once, no Find pressed (it waited for Find)
    b.open(base, "overview").await;
    b.open(base, "tasks?state=scheduled&plugin=coupon-expiry")
        .await;
    b.count_until("#task-rows tbody tr", 2).await;
    b.text_until("#task-rows", "both late tasks, listed on open", |t| {
        t.contains("late-0") && t.contains("late-1")
    })
    .await;
    let state = b.element("#find-state").await.prop("value").await.unwrap();
    assert_eq!(state.as_deref(), Some("scheduled"));
    // a far task's detail, and its cancel from there, as any task's
    b.click("#task-rows tr[data-id='late-1']").await;
    b.text_until("#task-detail", "late-1's detail", |t| {
        t.contains("late-1") && t.contains("coupon-expiry")
    })
    .await;
    b.click("#act-cancel").await;
    b.click("#act-cancel").await; // the second click confirms
    eventually(T, "late-1 cancelled", || async {
        let (s, _) = call("GET", &format!("{base}/v1/tasks/late-1"), None).await;
        (s == 404).then_some(())
    })
    .await;
    b.count_until("#task-rows tbody tr", 1).await;

    // Dead letters: retry one (it runs again: a new occurrence)
    let (_, before) = call("GET", &format!("{base}/v1/tasks/dead-0"), None).await;
    b.open(base, "dead").await;
    b.count_until("#dead-rows tbody tr", 2).await;
    b.text_until("#dead-rows", "the error shown", |t| t.contains("panicked"))
        .await;
    b.shot("dead-letters").await;
    b.click("#dead-rows tr[data-id='dead-0'] button").await; // "Retry" comes first
    eventually(T, "dead-0 retried", || async {
        let (_, t) = call("GET", &format!("{base}/v1/tasks/dead-0"), None).await;
        (t["created_at"].as_i64() > before["created_at"].as_i64()).then_some(())
    })
    .await;

    // A task's log: the panic message its plugin printed to stderr, on the task's page
    let (_, dead) = call("GET", &format!("{base}/v1/tasks/dead-1"), None).await;
    assert_eq!(dead["log"][0]["level"], "stderr", "{dead}");
    b.open(base, "tasks?id=dead-1").await;
    b.click("#task-rows tr[data-id='dead-1']").await;
    b.text_until("#task-log", "the task's log", |t| {
        t.contains("stderr") && t.contains("test-panic was asked to panic by task dead-1")
    })
    .await;
    // a dry run of the dead letter: what its plugin does now, with nothing applied
    b.click("#act-dry-run").await;
    b.text_until("#dry-run-result", "the dry run's answer", |t| {
        t.contains("Dry run on v") && t.contains("nothing applied") && t.contains("panic")
    })
    .await;
    let (_, still) = call("GET", &format!("{base}/v1/tasks/dead-1"), None).await;
    assert_eq!(
        (&still["state"], &still["attempts"]),
        (&json!("dead"), &dead["attempts"]),
        "a dry run changes nothing: {still}"
    );

    // A task that listens: what for on its page, and the event that reached one
    let far = eggtimer_tests::now_ms() + 3_600_000;
    let coupon = |id: &str, key: &str, then: &str| {
        json!({"id": id, "plugin": "coupon-expiry", "run_at": far,
               "payload": {"coupon_id": key, "user_id": "u1", "expires_at": far},
               "on": [{"topic": "coupons.used", "key": key, "then": then}]})
    };
    post_tasks(
        base,
        json!([
            coupon("listen-1", "c9", "cancel"),
            coupon("listen-2", "c8", "run")
        ]),
    )
    .await;
    let (s, p) = call(
        "POST",
        &format!("{base}/v1/events/coupons.used"),
        Some(json!({"key": "c8", "data": {"by": "u1"}})),
    )
    .await;
    assert_eq!((s, &p["matched"]), (200, &json!(1)), "{p}");
    b.open(base, "tasks?id=listen-1").await;
    b.click("#task-rows tr[data-id='listen-1']").await;
    b.text_until("#task-listeners", "what the task listens for", |t| {
        t.contains("coupons.used") && t.contains("c9") && t.contains("cancel it")
    })
    .await;
    wait_state(base, "listen-2", "done", T).await;
    b.open(base, "tasks?id=listen-2").await;
    b.click("#task-rows tr[data-id='listen-2']").await;
    b.text_until("#task-event", "the event that reached it", |t| {
        t.contains("coupons.used") && t.contains("\"by\": \"u1\"")
    })
    .await;

    // Plugins: upload from the file picker
    let wasm = dir.join("noop.wasm");
    b.open(base, "plugins").await;
    b.text_until("#plugin-rows", "the plugin list", |t| {
        t.contains("coupon-expiry")
    })
    .await;
    b.type_into("#up-name", "uploaded-noop").await;
    b.type_into("#up-file", wasm.to_str().unwrap()).await;
    b.click("#up-go").await;
    eventually(T, "the upload stored", || async {
        let (s, p) = call("GET", &format!("{base}/v1/plugins/uploaded-noop"), None).await;
        (s == 200 && p["version"] == 1).then_some(())
    })
    .await;
    b.text_until("#plugin-detail", "the uploaded plugin's detail", |t| {
        t.contains("uploaded-noop") && t.contains("version 1")
    })
    .await;
    // its weight in the fair share, set from the page
    b.type_into("#w-value", "4").await;
    b.click("#w-set").await;
    eventually(T, "the weight set", || async {
        let (_, p) = call("GET", &format!("{base}/v1/plugins/uploaded-noop"), None).await;
        (p["weight"] == 4).then_some(())
    })
    .await;
    b.text_until("#pl-weight", "the weight shown", |t| t.trim() == "4")
        .await;
    // its own time limit and memory cap (the dashboard signs in with the admin token)
    b.type_into("#tl-value", "5000").await;
    b.click("#tl-set").await;
    b.text_until("#pl-time-limit", "the time limit shown", |t| {
        t.trim() == "5,000 ms"
    })
    .await;
    b.type_into("#mem-value", "128").await;
    b.click("#mem-set").await;
    b.text_until("#pl-memory", "the memory cap shown", |t| {
        t.trim() == "128 MiB"
    })
    .await;
    b.type_into("#po-value", "3").await;
    b.click("#po-set").await;
    b.text_until("#pl-per-owner", "the per-owner limit shown", |t| {
        t.trim() == "3"
    })
    .await;
    b.type_into("#rl-max", "20").await;
    b.type_into("#rl-per", "2000").await;
    b.click("#rl-set").await;
    b.text_until("#pl-rate", "the rate limit shown", |t| {
        t.trim() == "20 starts per 2,000 ms"
    })
    .await;
    b.type_into("#mp-value", "2500").await;
    b.click("#mp-set").await;
    b.text_until("#pl-max-pending", "the max pending shown", |t| {
        t.trim() == "2,500"
    })
    .await;
    // allowed hosts, config and the secrets' names (never a value)
    let (s, _) = call(
        "PUT",
        &format!("{base}/v1/plugins/uploaded-noop/secrets/api_token"),
        Some(json!({"value": "tok-never-shown"})),
    )
    .await;
    assert_eq!(s, 204);
    let (s, _) = call(
        "PATCH",
        &format!("{base}/v1/plugins/uploaded-noop"),
        Some(json!({"allowed_hosts": ["https://api.example.com"], "config": {"region": "eu"}})),
    )
    .await;
    assert_eq!(s, 200);
    b.text_until("#pl-hosts", "the allowed hosts shown", |t| {
        t.trim() == "https://api.example.com"
    })
    .await;
    b.text_until("#pl-config", "the config shown", |t| {
        t.trim() == "region=eu"
    })
    .await;
    let secrets = b
        .text_until("#plugin-secrets", "the secret's name", |t| {
            t.contains("api_token")
        })
        .await;
    assert!(!secrets.contains("tok-never-shown"), "{secrets}");
    let (_, p) = call("GET", &format!("{base}/v1/plugins/uploaded-noop"), None).await;
    assert_eq!(p["max_pending"], 2500, "{p}");
    assert_eq!(p["max_concurrency_per_owner"], 3, "{p}");
    assert_eq!(p["rate_limit"], json!({"max": 20, "per_ms": 2000}), "{p}");
    assert_eq!(p["time_limit_ms"], 5000, "{p}");
    assert_eq!(p["memory_bytes"], 128 << 20, "{p}");
    b.shot("plugins").await;

    // Schedules and events
    b.open(base, "schedules").await;
    b.text_until("#schedule-rows", "the schedule", |t| {
        t.contains("nightly-sweep") && t.contains("Europe/Berlin")
    })
    .await;
    b.shot("schedules").await;
    b.open(base, "events").await;
    b.text_until("#event-rows", "the coupon event", |t| {
        t.contains("coupon_expiring")
    })
    .await;
    b.shot("events").await;
}

#[tokio::test]
async fn with_a_token_the_dashboard_asks_for_it_once() {
    let redis = RedisServer::start();
    let runner = RunnerProcess::start(&redis.url(), &["--token", "s3cret-token"]);
    let b = Browser::start().await;
    b.open(&runner.url, "overview").await;
    b.element("#token-dialog:not([hidden])").await;
    b.type_into("#token-input", "wrong").await;
    b.click("#token-go").await;
    b.text_until("#token-error", "the refusal", |t| {
        t.contains("not one this runner knows")
    })
    .await;
    b.type_into("#token-input", "s3cret-token").await;
    b.click("#token-go").await;
    b.text_until("#ov-runners", "the overview with the token", |t| t == "1")
        .await;
    // kept for the session: another page loads without asking again
    b.open(&runner.url, "plugins").await;
    b.text_until("#plugin-rows", "the plugins page", |t| {
        t.contains("No plugins yet")
    })
    .await;
    let hidden = b
        .client
        .find(Locator::Css("#token-dialog"))
        .await
        .unwrap()
        .attr("hidden")
        .await
        .unwrap();
    assert!(hidden.is_some(), "the token dialog came back");
}

#[tokio::test]
async fn each_teams_key_shows_its_own_plugins_and_audit() {
    let redis = RedisServer::start();
    let admin = "s3cret-admin";
    let runner = RunnerProcess::with_plugins(&redis, &["--token", admin]);
    let mut keys = Vec::new();
    for (team, plugins) in [("team-orders", "order-*"), ("team-coupons", "coupon-*")] {
        let k: Value = eggtimer_tests::http()
            .post(format!("{}/v1/keys", runner.url))
            .bearer_auth(admin)
            .json(&json!({"name": team, "role": "developer", "plugins": [plugins]}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        keys.push(k["key"].as_str().unwrap().to_owned());
    }
    let b = Browser::start().await;
    for (key, mine, theirs, team) in [
        (&keys[0], "order-cancel", "coupon-expiry", "team-orders"),
        (&keys[1], "coupon-expiry", "order-cancel", "team-coupons"),
    ] {
        // a fresh session: sign in with this team's key
        b.open(&runner.url, "plugins").await;
        b.client
            .execute("sessionStorage.clear(); location.reload();", vec![])
            .await
            .unwrap();
        b.element("#token-dialog:not([hidden])").await;
        b.type_into("#token-input", key).await;
        b.click("#token-go").await;
        let rows = b
            .text_until("#plugin-rows", "the team's plugins", |t| t.contains(mine))
            .await;
        assert!(!rows.contains(theirs), "{team} sees {theirs}: {rows}");
        assert!(!rows.contains("auto-feed"), "{team} sees auto-feed: {rows}");
        // the team deletes the other team's plugin by hand: refused, and the audit page says so
        let s = eggtimer_tests::http()
            .delete(format!("{}/v1/plugins/{theirs}", runner.url))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(s, 403);
        b.open(&runner.url, "audit").await;
        let audit = b
            .text_until("#audit-rows", "the team's audit", |t| {
                t.contains(&format!("DELETE /v1/plugins/{theirs}"))
            })
            .await;
        assert!(audit.contains("403") && audit.contains(team), "{audit}");
        let other = if team == "team-orders" {
            "team-coupons"
        } else {
            "team-orders"
        };
        assert!(
            !audit.contains(other),
            "{team} sees {other}'s audit: {audit}"
        );
    }
}
