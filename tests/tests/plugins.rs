//! The sample plugins and the sandbox, end to end: the real runner binary, a real redis-server,
//! real wasm built from plugins/. Counts come from the plugins' own records (event streams, kv).

use std::time::Duration;

use eggtimer_tests::{
    RedisServer, RunnerProcess, call, eventually, now_ms, plugin_wasm, read_events, sorted_ids,
    upload, wait_state,
};
use serde_json::json;

const T: Duration = Duration::from_secs(20);

fn start(redis: &RedisServer, extra: &[&str]) -> RunnerProcess {
    let mut args = vec!["--retry-base", "50ms", "--plugin-timeout", "300ms"];
    args.extend_from_slice(extra);
    RunnerProcess::with_plugins(redis, &args)
}

#[tokio::test]
async fn auto_feed_feeds_again_with_a_card_and_an_acceleration_card_shifts_the_finish() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    // A meal that ends in 300 ms, with one auto-feed card; the next meal lasts 4 h.
    let (s, b) = call(
        "POST",
        &format!("{}/v1/tasks", r.url),
        Some(
            json!({"plugin": "auto-feed", "id": "meal-1", "owner": "u1", "delay_ms": 300,
                    "payload": {"pet_id": "p1", "user_id": "u1", "auto_feed_cards": 1}}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    wait_state(&r.url, "meal-1", "done", T).await;
    let mut c = redis.conn();
    let events = read_events(&mut c, &["auto-feed"], "pet");
    let types: Vec<&str> = events
        .iter()
        .map(|e| e.2["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["finished_eating", "auto_fed"]);
    assert_eq!(events[1].2["cards_left"], 0);
    // the next finish is scheduled for the owner, 4 h after the first
    let (_, list) = call("GET", &format!("{}/v1/owners/u1/tasks", r.url), None).await;
    let list = list.as_array().unwrap().clone();
    assert_eq!(list.len(), 1, "{list:?}");
    let next_id = list[0]["id"].as_str().unwrap().to_owned();
    let first_due = b["run_at"].as_i64().unwrap();
    assert_eq!(
        list[0]["run_at"].as_i64().unwrap(),
        first_due + 4 * 3600 * 1000
    );
    assert_eq!(list[0]["payload"]["auto_feed_cards"], 0);
    // an acceleration card: the owner's auto-feed tasks move 2 h earlier
    let (s, b) = call(
        "POST",
        &format!("{}/v1/owners/u1/shift", r.url),
        Some(json!({"shift_ms": -7_200_000, "plugin": "auto-feed"})),
    )
    .await;
    assert_eq!((s, b), (200, json!({"shifted": 1})));
    let (_, t) = call("GET", &format!("{}/v1/tasks/{next_id}", r.url), None).await;
    assert_eq!(t["run_at"].as_i64().unwrap(), first_due + 2 * 3600 * 1000);
    // two more cards' worth of time: it finishes now, with no card left nothing more is scheduled
    call(
        "POST",
        &format!("{}/v1/owners/u1/shift", r.url),
        Some(json!({"shift_ms": -7_200_000})),
    )
    .await;
    wait_state(&r.url, &next_id, "done", T).await;
    let events = read_events(&mut c, &["auto-feed"], "pet");
    assert_eq!(events.len(), 3);
    assert_eq!(events[2].2["type"], "finished_eating");
    let (_, list) = call("GET", &format!("{}/v1/owners/u1/tasks", r.url), None).await;
    assert_eq!(list, json!([]));
}

#[tokio::test]
async fn coupon_expiry_reminds_two_hours_before() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    let expires_at = now_ms() + 2 * 3600 * 1000 + 200;
    let (s, _) = call(
        "POST",
        &format!("{}/v1/tasks", r.url),
        Some(json!({"plugin": "coupon-expiry", "id": "coupon-c9", "run_at": expires_at - 2 * 3600 * 1000,
                    "payload": {"coupon_id": "c9", "user_id": "u1", "expires_at": expires_at}})),
    )
    .await;
    assert_eq!(s, 201);
    wait_state(&r.url, "coupon-c9", "done", T).await;
    let events = read_events(&mut redis.conn(), &["coupon-expiry"], "push");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].0, "coupon-c9");
    assert_eq!(events[0].1, "coupon-expiry");
    let want = json!({"type": "coupon_expiring", "coupon_id": "c9", "user_id": "u1", "expires_at": expires_at});
    assert_eq!(events[0].2, want);
    // the API serves the data as JSON, and as the text the stream holds
    let (s, page) = call("GET", &format!("{}/v1/events/push", r.url), None).await;
    assert_eq!(s, 200, "{page}");
    assert_eq!(page[0]["data"], want, "{page}");
    let text: serde_json::Value =
        serde_json::from_str(page[0]["data_text"].as_str().unwrap()).unwrap();
    assert_eq!(text, want);
}

#[tokio::test]
async fn order_cancel_emits_once_per_order_and_nothing_for_a_paid_order() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    let tasks = format!("{}/v1/tasks", r.url);
    // unpaid: its task runs twice (scheduled again under the same id after it ran)
    for _ in 0..2 {
        let (s, _) = call("POST", &tasks, Some(json!({"plugin": "order-cancel", "id": "order-1", "payload": {"order_id": "1", "user_id": "u1"}}))).await;
        assert_eq!(s, 201);
        wait_state(&r.url, "order-1", "done", T).await;
    }
    // paid: the task is deleted before it is due
    let (s, _) = call("POST", &tasks, Some(json!({"plugin": "order-cancel", "id": "order-2", "delay_ms": 400, "payload": {"order_id": "2", "user_id": "u1"}}))).await;
    assert_eq!(s, 201);
    let (s, _) = call("DELETE", &format!("{tasks}/order-2"), None).await;
    assert_eq!(s, 204);
    // a third order after it, to know the runner got past order-2's due time
    call("POST", &tasks, Some(json!({"plugin": "order-cancel", "id": "order-3", "delay_ms": 600, "payload": {"order_id": "3", "user_id": "u1"}}))).await;
    wait_state(&r.url, "order-3", "done", T).await;
    let events = read_events(&mut redis.conn(), &["order-cancel"], "order");
    let orders: Vec<&str> = events
        .iter()
        .map(|e| e.2["order_id"].as_str().unwrap())
        .collect();
    assert_eq!(orders, ["1", "3"]);
    assert_eq!(
        events[0].2,
        json!({"type": "order_cancelled", "order_id": "1", "user_id": "u1"})
    );
    let (s, _) = call("GET", &format!("{tasks}/order-2"), None).await;
    assert_eq!(s, 404);
}

#[tokio::test]
async fn misbehaving_plugins_fail_their_own_tasks_while_good_ones_keep_running() {
    let redis = RedisServer::start();
    let r = start(&redis, &["--plugin-memory", "33554432"]);
    let tasks = format!("{}/v1/tasks", r.url);
    let mut specs = vec![
        json!({"plugin": "test-loop", "id": "loop", "max_attempts": 2}),
        json!({"plugin": "test-alloc", "id": "alloc", "max_attempts": 2}),
        json!({"plugin": "test-panic", "id": "panic", "max_attempts": 2}),
    ];
    for i in 0..300 {
        specs.push(json!({"plugin": "order-cancel", "id": format!("good-{i}"), "payload": {"order_id": format!("{i}"), "user_id": "u"}}));
    }
    let (s, b) = call("POST", &tasks, Some(json!(specs))).await;
    assert_eq!(s, 201, "{b}");
    for (id, want) in [
        ("loop", "ran longer than its time limit of 300ms"),
        ("alloc", "needed more than its memory limit of 32 MiB"),
        ("panic", "test-panic was asked to panic by task panic"),
    ] {
        let t = wait_state(&r.url, id, "dead", T).await;
        let err = t["last_error"].as_str().unwrap();
        assert!(err.contains(want), "{id}: {err}");
        assert_eq!(t["attempts"], 2, "{id} was retried once before it died");
    }
    eventually(T, "all good tasks to run", || async {
        let n = read_events(&mut redis.conn(), &["order-cancel"], "order").len();
        (n == 300).then_some(())
    })
    .await;
    for i in (0..300).step_by(37) {
        wait_state(&r.url, &format!("good-{i}"), "done", T).await;
    }
    // the runner is still healthy and the dead letters are listed with their errors
    let (s, dead) = call("GET", &format!("{}/v1/dead", r.url), None).await;
    assert_eq!(s, 200);
    assert_eq!(dead["tasks"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn a_hot_swap_under_a_stream_of_tasks_loses_none() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    // "swap" starts as noop (no events) and becomes coupon-expiry (an event per task)
    assert_eq!(upload(&r.url, "swap", plugin_wasm("noop")).await.0, 201);
    let tasks = format!("{}/v1/tasks", r.url);
    let payload = |i: usize| json!({"coupon_id": format!("c{i}"), "user_id": "u", "expires_at": 0});
    let mut n = 0;
    let mut after_swap = Vec::new();
    for round in 0..20 {
        let specs: Vec<_> = (0..25).map(|k| json!({"plugin": "swap", "id": format!("s{}", n + k), "payload": payload(n + k)})).collect();
        let (s, _) = call("POST", &tasks, Some(json!(specs))).await;
        assert_eq!(s, 201);
        if round >= 10 {
            after_swap.extend(n..n + 25);
        }
        n += 25;
        if round == 9 {
            let (s, b) = upload(&r.url, "swap", plugin_wasm("coupon-expiry")).await;
            assert_eq!((s, b["version"].as_u64()), (201, Some(2)));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for i in 0..n {
        wait_state(&r.url, &format!("s{i}"), "done", T).await;
    }
    let events = read_events(&mut redis.conn(), &["swap"], "push");
    let with_event: std::collections::HashSet<String> =
        events.iter().map(|e| e.0.clone()).collect();
    for i in &after_swap {
        assert!(
            with_event.contains(&format!("s{i}")),
            "s{i} was scheduled after the swap but ran on the old version"
        );
    }
    assert!(events.len() >= after_swap.len() && events.len() <= n);
}

#[tokio::test]
async fn a_parent_scheduled_again_gets_its_follow_up_and_a_rerun_does_not_duplicate_it() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    let first_due = now_ms();
    let spec = json!({"plugin": "auto-feed", "id": "meal-x", "owner": "u7", "run_at": first_due,
                      "payload": {"pet_id": "p", "user_id": "u7", "auto_feed_cards": 3}});
    let mut created = Vec::new();
    for _ in 0..2 {
        let (s, b) = call("POST", &format!("{}/v1/tasks", r.url), Some(spec.clone())).await;
        assert_eq!(s, 201, "{b}");
        wait_state(&r.url, "meal-x", "done", T).await;
        let (_, t) = call("GET", &format!("{}/v1/tasks/meal-x", r.url), None).await;
        created.push(t["created_at"].as_i64().unwrap());
    }
    // Two occurrences of the parent (scheduled twice): two auto_fed events and two follow-ups,
    // whose ids are derived from (parent, occurrence, index) exactly as the SDK's test host does.
    let events = read_events(&mut redis.conn(), &["auto-feed"], "pet");
    assert_eq!(
        events.iter().filter(|e| e.2["type"] == "auto_fed").count(),
        2
    );
    let (_, list) = call("GET", &format!("{}/v1/owners/u7/tasks", r.url), None).await;
    let ids = sorted_ids(&list);
    let mut want: Vec<String> = created
        .iter()
        .map(|c| eggtimer_sdk::testing::derive_id("meal-x", *c, 0))
        .collect();
    want.sort();
    want.dedup();
    assert_eq!(ids, want, "{list}");
    // A re-run of one occurrence (a crash after its effects, a lost claim) derives the same id:
    // scheduling it again changes nothing.
    let again = eggtimer::NewTask {
        id: want[0].clone(),
        plugin: "auto-feed".into(),
        payload: "{}".into(),
        run_at: 0,
        owner: Some("u7".into()),
        max_attempts: 5,
        unique_for_ms: 0,
        traceparent: None,
        start_by: None,
        ..Default::default()
    };
    let store = eggtimer::Store::open(
        eggtimer::RedisTarget::Single(redis.url()),
        eggtimer::StoreOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        store
            .schedule(&[again], eggtimer::store::ScheduleMode::IfAbsent)
            .await
            .unwrap(),
        vec![eggtimer::store::Scheduled::Exists]
    );
}

/// `--plugins-dir` seeds only names the registry never had: a plugin deleted through the API stays
/// deleted when its runner restarts with the same directory, and can be uploaded again.
#[tokio::test]
async fn a_plugin_deleted_through_the_api_is_not_seeded_again_at_restart() {
    let redis = RedisServer::start();
    let mut r = start(&redis, &[]);
    let (s, _) = call("DELETE", &format!("{}/v1/plugins/noop", r.url), None).await;
    assert_eq!(s, 204);
    assert_eq!(r.terminate(), Some(0));
    let r = start(&redis, &[]);
    let (s, b) = call("GET", &format!("{}/v1/plugins/noop", r.url), None).await;
    assert_eq!(s, 404, "{b}");
    assert!(
        r.log_text().contains("noop was deleted; not seeding"),
        "{}",
        r.log_text()
    );
    // the others were seeded as before, and the deleted one can be uploaded again
    let (s, _) = call("GET", &format!("{}/v1/plugins/coupon-expiry", r.url), None).await;
    assert_eq!(s, 200);
    let (s, b) = upload(&r.url, "noop", plugin_wasm("noop")).await;
    assert_eq!((s, &b["version"]), (201, &json!(2)), "{b}");
}

/// A version that took long to compile is not installed over a newer one installed meanwhile: a
/// registry reloading the Python sample (seconds to compile) while an upload of other bytes lands
/// (its compiled code in the cache, so it waits for no compile) ends with the upload's version,
/// the one the registry names. Without the check it ended with the Python sample, v1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_compile_does_not_install_over_a_newer_version() {
    use eggtimer::plugins::{PluginOptions, Plugins, Registry, digest};
    let redis = RedisServer::start();
    let store = eggtimer_tests::store_on(&redis, 16).await;
    let plugins = Plugins::new(PluginOptions {
        cache_dir: Some(eggtimer_tests::temp_dir("compile-cache")),
        ..Default::default()
    })
    .unwrap();
    let noop = plugin_wasm("noop");
    let (p, wasm) = (plugins.clone(), noop.clone());
    tokio::task::spawn_blocking(move || p.compile("noop", "noop", 0, &wasm).map(|_| ()))
        .await
        .unwrap()
        .unwrap();
    let python = plugin_wasm("coupon-expiry-py");
    store
        .plugin_put("p", &digest(&python), &python, now_ms(), None, false)
        .await
        .unwrap();
    let registry = Registry::new(store.clone(), plugins.clone(), 64 << 20);
    let reload = tokio::spawn({
        let r = registry.clone();
        async move { r.sync_one("p").await }
    });
    eventually(T, "the reload to be compiling", || async {
        (plugins.compiles() == 1).then_some(())
    })
    .await;
    let (entry, created) = registry.upload("p", None, noop.clone()).await.unwrap();
    assert_eq!((entry.version, created), (2, true));
    assert_eq!(plugins.get("p").unwrap().version, 2);
    assert_eq!(plugins.compiles(), 1, "the reload compiles still");
    reload.await.unwrap().unwrap();
    let loaded = plugins.get("p").unwrap();
    assert_eq!(
        (loaded.version, loaded.digest.as_str()),
        (2, digest(&noop).as_str()),
        "the reload installed the version the registry no longer names"
    );
}

/// The compiled-code cache is cleaned at start: files of another engine, files no runner loaded
/// for `--plugin-cache-keep` and temporary files a crash left go; a plugin's file that is loaded
/// stays, however old it was.
#[tokio::test]
async fn the_compiled_code_cache_drops_what_no_runner_loads() {
    use std::time::SystemTime;
    let redis = RedisServer::start();
    let cache = eggtimer_tests::temp_dir("cache-clean");
    let cache_arg = cache.to_str().unwrap().to_owned();
    let mut r = start(&redis, &["--plugin-cache", &cache_arg]);
    assert_eq!(r.terminate(), Some(0));
    let compiled: Vec<std::path::PathBuf> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .collect();
    assert!(compiled.len() >= 5, "{compiled:?}");
    let name = |p: &std::path::Path| p.file_name().unwrap().to_str().unwrap().to_owned();
    let file = name(&compiled[0]);
    let (digest, ours) = file.split_at(64);
    let days_ago = |p: &std::path::Path, days: u64| {
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(SystemTime::now() - Duration::from_secs(days * 86_400))
            .unwrap();
    };
    let bytes = std::fs::read(&compiled[0]).unwrap();
    let mac = std::fs::read(compiled[0].with_extension("mac")).unwrap();
    // a plugin no runner loads, unused for 8 days; one of another engine (new); a crash's leftover
    let unused = cache.join(format!("{}{ours}", "0".repeat(64)));
    let other = cache.join(format!("{digest}-wasmtime47-0123456789abcdef.cwasm"));
    for p in [&unused, &other] {
        std::fs::write(p, &bytes).unwrap();
        std::fs::write(p.with_extension("mac"), &mac).unwrap();
    }
    days_ago(&unused, 8);
    let leftover = cache.join(format!("{}-wasmtime48-feed.tmp", "1".repeat(64)));
    std::fs::write(&leftover, &bytes).unwrap();
    days_ago(&leftover, 1);
    // a loaded plugin's file, as old
    days_ago(&compiled[0], 8);
    let r = start(&redis, &["--plugin-cache", &cache_arg]);
    eventually(T, "the cache to be cleaned", || async {
        [&unused, &other, &leftover]
            .iter()
            .all(|p| !p.exists() && !p.with_extension("mac").exists())
            .then_some(())
    })
    .await;
    for p in &compiled {
        assert!(p.exists(), "{} was removed", p.display());
        assert!(p.with_extension("mac").exists());
    }
    // the runner logs after it removed the files, and its log reaches the test through a pipe
    eventually(T, "the runner to log what it removed", || async {
        r.log_text()
            .contains("removed compiled plugins")
            .then_some(())
    })
    .await;
}
