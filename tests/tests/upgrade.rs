//! Upgrades lose nothing: data written by an earlier main keeps working with this build.
//!
//! The earlier data is written by the earlier main's own Lua scripts, read from git history (every
//! write of a task's state is one of those scripts; the Rust around them only passes arguments),
//! so the test needs no second build of the runner.

use std::time::Duration;

use eggtimer::store::{Finish, Finished, ScheduleMode, TaskState, shard_of};
use eggtimer_tests::{
    RedisServer, RunnerProcess, call, claim_when_due, find_all, found_ids, now_ms, plugins_dir,
    read_stream, script_at, wait_state,
};

/// The main before claim tokens (records without a token; five keys per shard script).
const BEFORE_CLAIM_TOKENS: &str = "e09a83c57049997b022c353e5a7c0b60cb7ccb48";

/// The main before the plugin index, pausing and dedup windows (six keys per shard script).
const BEFORE_PLUGIN_INDEX: &str = "068d2c00b8dd37788ee59cdb8fed1f043b911ae1";

/// A script of the main before claim tokens: its prelude and the script's own file.
fn old_script(name: &str) -> String {
    script_at(BEFORE_CLAIM_TOKENS, name)
}

/// The earlier layout of one shard's keys (five, then the done keys).
fn old_keys(shard: u32, ids: &[&str]) -> Vec<String> {
    let tag = format!("{{eggtimer:{shard}}}");
    let mut k: Vec<String> = ["due", "tasks", "inflight", "dead", "byowner"]
        .iter()
        .map(|n| format!("{tag}:{n}"))
        .collect();
    k.extend(ids.iter().map(|id| format!("{tag}:done:{id}")));
    k
}

/// Schedules one task with the earlier main's schedule script.
fn old_schedule(
    c: &mut redis::Connection,
    id: &str,
    plugin: &str,
    due: i64,
    owner: &str,
    payload: &str,
) {
    let keys = old_keys(shard_of(id, 16), &[id]);
    schedule_at(
        c,
        BEFORE_CLAIM_TOKENS,
        &keys,
        (id, plugin, due, 5, owner, payload),
    );
}

/// Schedules one task `(id, plugin, due, max_attempts, owner, payload)` with the schedule script
/// of the main at `commit`, given that main's keys for it.
fn schedule_at(
    c: &mut redis::Connection,
    commit: &str,
    keys: &[String],
    (id, plugin, due, max_attempts, owner, payload): (&str, &str, i64, u32, &str, &str),
) {
    let shard = shard_of(id, 16);
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script_at(commit, "schedule"));
    cmd.arg(keys.len()).arg(keys);
    cmd.arg("{eggtimer}:wake").arg(shard).arg("upsert");
    cmd.arg(id)
        .arg(due)
        .arg(max_attempts)
        .arg(plugin)
        .arg(owner)
        .arg(payload)
        .arg(0);
    let v: Vec<String> = cmd.query(c).unwrap();
    assert_eq!(v, ["ok"]);
}

#[tokio::test]
async fn tasks_written_by_the_main_before_claim_tokens_run_after_the_upgrade() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let _: () = redis::cmd("HSET")
        .arg("{eggtimer}:meta")
        .arg("shards")
        .arg(16)
        .query(&mut c)
        .unwrap();
    // A task the earlier runner had claimed when it was stopped for the upgrade: running, in the
    // earlier record format (no claim token), with a short lease.
    old_schedule(
        &mut c,
        "old-running",
        "order-cancel",
        0,
        "",
        r#"{"order_id":"r","user_id":"u"}"#,
    );
    let shard = shard_of("old-running", 16);
    let claimed: redis::Value = redis::cmd("EVAL")
        .arg(old_script("claim"))
        .arg(5)
        .arg(old_keys(shard, &[]))
        .arg(10)
        .arg(800)
        .query(&mut c)
        .unwrap();
    assert!(
        format!("{claimed:?}").contains("old-running"),
        "{claimed:?}"
    );
    // Scheduled tasks: one due now, one due later with an owner.
    old_schedule(
        &mut c,
        "old-due",
        "order-cancel",
        now_ms(),
        "",
        r#"{"order_id":"d","user_id":"u"}"#,
    );
    let later = now_ms() + 60_000;
    old_schedule(
        &mut c,
        "old-later",
        "order-cancel",
        later,
        "u9",
        r#"{"order_id":"l","user_id":"u9"}"#,
    );

    // The upgraded runner.
    let dir = plugins_dir();
    let r = RunnerProcess::start(&redis.url(), &["--plugins-dir", dir.to_str().unwrap()]);
    let (_, owned) = call("GET", &format!("{}/v1/owners/u9/tasks", r.url), None).await;
    assert_eq!(
        owned[0]["id"], "old-later",
        "the earlier owner index is read: {owned}"
    );
    assert_eq!(owned[0]["run_at"], later);
    // moved through the new API: the earlier record is moved and run
    let (s, _) = call("POST", &format!("{}/v1/tasks/old-later/run", r.url), None).await;
    assert_eq!(s, 202);
    let t = Duration::from_secs(20);
    wait_state(&r.url, "old-due", "done", t).await;
    wait_state(&r.url, "old-later", "done", t).await;
    // the earlier claim's lease expires and the task runs again, under a claim token now
    let running = wait_state(&r.url, "old-running", "done", t).await;
    assert_eq!(running["attempts"], 2, "{running}");
    let events = read_stream(&mut c, "{eggtimer}:events:order");
    let mut orders: Vec<&str> = events
        .iter()
        .map(|e| e.2["order_id"].as_str().unwrap())
        .collect();
    orders.sort();
    assert_eq!(orders, ["d", "l", "r"], "each ran once: {events:?}");
}

/// Claims the due task `id` (alone due in its shard) and records `kind` for it, with the scripts
/// of the main before the plugin index.
fn finish_before_plugin_index(c: &mut redis::Connection, id: &str, kind: &str) {
    let shard = shard_of(id, 16);
    let claimed: Vec<redis::Value> = redis::cmd("EVAL")
        .arg(script_at(BEFORE_PLUGIN_INDEX, "claim"))
        .arg(6)
        .arg(keys_before_plugin_index(shard, &[]))
        .arg(10)
        .arg(60_000)
        .query(c)
        .unwrap();
    let token: i64 = redis::from_redis_value_ref(&claimed[3]).unwrap();
    let keys = keys_before_plugin_index(shard, &[id]);
    let v: Vec<String> = redis::cmd("EVAL")
        .arg(script_at(BEFORE_PLUGIN_INDEX, "finish"))
        .arg(keys.len())
        .arg(&keys)
        .arg("{eggtimer}:wake")
        .arg(shard)
        .arg(600_000)
        .arg(id)
        .arg(token)
        .arg(kind)
        .arg(0)
        .arg("gave up before the upgrade")
        .query(c)
        .unwrap();
    assert_eq!(v, [kind]);
}

/// The six keys of one shard of the main before the plugin index, then `extra` (done keys).
fn keys_before_plugin_index(shard: u32, ids: &[&str]) -> Vec<String> {
    let tag = format!("{{eggtimer:{shard}}}");
    let mut k: Vec<String> = ["due", "tasks", "inflight", "dead", "byowner", "meta"]
        .iter()
        .map(|n| format!("{tag}:{n}"))
        .collect();
    k.extend(ids.iter().map(|id| format!("{tag}:done:{id}")));
    k
}

#[tokio::test]
async fn tasks_written_before_the_plugin_index_are_found_paused_and_retried_after_the_upgrade() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let _: () = redis::cmd("HSET")
        .arg("{eggtimer}:meta")
        .arg("shards")
        .arg(16)
        .query(&mut c)
        .unwrap();
    let schedule = |c: &mut redis::Connection, id: &str, due: i64| {
        let keys = keys_before_plugin_index(shard_of(id, 16), &[id]);
        let payload = format!(r#"{{"order_id":"{id}","user_id":"u7"}}"#);
        schedule_at(
            c,
            BEFORE_PLUGIN_INDEX,
            &keys,
            (id, "order-cancel", due, 1, "u7", &payload),
        );
    };
    let later = now_ms() + 3_600_000;
    for i in 0..20 {
        schedule(&mut c, &format!("pi-{i}"), later + i);
    }
    // one dead letter and one done task, by the earlier claim and finish scripts
    for (id, kind) in [("pi-dead", "dead"), ("pi-done", "done")] {
        schedule(&mut c, id, 0);
        finish_before_plugin_index(&mut c, id, kind);
    }

    // The upgraded runner migrates the indexes on start.
    let dir = plugins_dir();
    let r = RunnerProcess::start(&redis.url(), &["--plugins-dir", dir.to_str().unwrap()]);
    let (_, page) = call(
        "GET",
        &format!(
            "{}/v1/tasks?plugin=order-cancel&state=scheduled&limit=100",
            r.url
        ),
        None,
    )
    .await;
    let ids: Vec<&str> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    let want: Vec<String> = (0..20).map(|i| format!("pi-{i}")).collect();
    assert_eq!(
        ids, want,
        "the earlier tasks are found by plugin, in due order"
    );
    let (_, dead) = call(
        "GET",
        &format!("{}/v1/tasks?plugin=order-cancel&state=dead", r.url),
        None,
    )
    .await;
    assert_eq!(dead["tasks"][0]["id"], "pi-dead", "{dead}");
    // a done task of the earlier layout (its own key) is read as done
    let (s, done) = call("GET", &format!("{}/v1/tasks/pi-done", r.url), None).await;
    assert_eq!(
        (s, &done["state"]),
        (200, &serde_json::json!("done")),
        "{done}"
    );
    let (s, _) = call("DELETE", &format!("{}/v1/tasks/pi-done", r.url), None).await;
    assert_eq!(s, 409, "a done task can't be cancelled");
    // pausing parks them; resuming and running one works on the earlier records
    let (s, _) = call(
        "POST",
        &format!("{}/v1/plugins/order-cancel/pause", r.url),
        None,
    )
    .await;
    assert_eq!(s, 200);
    let (s, b) = call(
        "POST",
        &format!("{}/v1/dead/retry", r.url),
        Some(serde_json::json!({"plugin": "order-cancel"})),
    )
    .await;
    assert_eq!((s, &b["retried"]), (200, &serde_json::json!(1)), "{b}");
    let (s, _) = call("POST", &format!("{}/v1/tasks/pi-3/run", r.url), None).await;
    assert_eq!(s, 202);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (_, t) = call("GET", &format!("{}/v1/tasks/pi-3", r.url), None).await;
    assert_eq!(t["state"], "scheduled", "paused: not started: {t}");
    let (s, _) = call(
        "POST",
        &format!("{}/v1/plugins/order-cancel/resume", r.url),
        None,
    )
    .await;
    assert_eq!(s, 200);
    let t = Duration::from_secs(20);
    wait_state(&r.url, "pi-3", "done", t).await;
    wait_state(&r.url, "pi-dead", "done", t).await;
    let (_, owned) = call("GET", &format!("{}/v1/owners/u7/tasks", r.url), None).await;
    assert_eq!(owned.as_array().unwrap().len(), 19, "{owned}");
    // the earlier done task's id scheduled again: it replaces the old done record and runs
    let (s, b) = call(
        "POST",
        &format!("{}/v1/tasks", r.url),
        Some(
            serde_json::json!({"plugin": "order-cancel", "id": "pi-done",
                                "payload": {"order_id": "again", "user_id": "u7"}}),
        ),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    let again = wait_state(&r.url, "pi-done", "done", t).await;
    assert_eq!(again["attempts"], 1, "{again}");
}

/// The main before claim batches (one `inflight` entry per running task; eleven keys per shard
/// script).
const BEFORE_CLAIM_BATCHES: &str = "adc2e5412593aed47c4b0aaa2a5a6a90643385f6";

/// Claims up to 100 due tasks of shard 0 with the claim script of the main before claim
/// batches, with a lease of `lease_ms`: (id, token) of each.
fn claim_before_batches(
    c: &mut redis::Connection,
    keys: &[&str],
    lease_ms: u64,
) -> Vec<(String, u64)> {
    let v: Vec<redis::Value> = redis::cmd("EVAL")
        .arg(script_at(BEFORE_CLAIM_BATCHES, "claim"))
        .arg(keys.len())
        .arg(keys)
        .arg(100)
        .arg(lease_ms)
        .query(c)
        .unwrap();
    let token: u64 = redis::from_redis_value_ref(&v[3]).unwrap();
    v[4..]
        .chunks_exact(3)
        .map(|t| (redis::from_redis_value_ref(&t[0]).unwrap(), token))
        .collect()
}

/// Tasks a runner of the previous main claimed (one `inflight` entry each) during a rolling
/// upgrade: this build counts and finds them as running, that runner can still record their
/// outcomes with its own script, and when it dies this build's claims put the rest back.
#[tokio::test]
async fn tasks_claimed_by_the_main_before_claim_batches_are_found_and_reaped_after_the_upgrade() {
    let redis = RedisServer::start();
    let s = eggtimer_tests::store_on(&redis, 1).await;
    let k = s.keys().shard(0);
    let old_keys: Vec<&str> = k.all()[..11].to_vec();
    let tasks: Vec<_> = (0..3)
        .map(|i| eggtimer_tests::noop_task(&format!("u{i}"), 0))
        .collect();
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    let mut c = redis.conn();
    // as that main kept them: in one `due` ZSET, not in buckets
    for (id, due) in eggtimer_tests::due_entries(&redis, &k) {
        let _: () = redis::cmd("ZADD")
            .arg(&k.due)
            .arg(due)
            .arg(&id)
            .query(&mut c)
            .unwrap();
    }
    let buckets: Vec<String> = redis::cmd("ZRANGE")
        .arg(&k.duex)
        .arg(0)
        .arg(-1)
        .query(&mut c)
        .unwrap();
    for b in buckets
        .iter()
        .map(|b| k.due_bucket(b))
        .chain([k.duex.clone()])
    {
        let _: () = redis::cmd("DEL").arg(b).query(&mut c).unwrap();
    }
    let claimed = claim_before_batches(&mut c, &old_keys, 300);
    assert_eq!(claimed.len(), 3);
    assert_eq!(s.shard_counts().await.unwrap()[0].inflight, 3);
    assert_eq!(found_ids(&s, TaskState::Running).await.len(), 3);
    // the old runner records one outcome with its own finish script, then dies
    let (id, token) = &claimed[0];
    let v: Vec<String> = redis::cmd("EVAL")
        .arg(script_at(BEFORE_CLAIM_BATCHES, "finish"))
        .arg(old_keys.len())
        .arg(&old_keys)
        .arg("")
        .arg(0)
        .arg(60_000)
        .arg(id)
        .arg(token)
        .arg("done")
        .arg(0)
        .arg("")
        .query(&mut c)
        .unwrap();
    assert_eq!(v, ["done"]);
    assert_eq!(s.shard_counts().await.unwrap()[0].inflight, 2);
    // this build's claims put the other two back once their leases end
    let b = claim_when_due(&s, 0, 10, "the old leases to end").await;
    let mut ids: Vec<&str> = b.tasks.iter().map(|t| t.id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, [claimed[1].0.as_str(), claimed[2].0.as_str()]);
    assert!(b.tasks.iter().all(|t| t.attempt == 2));
    let inflight: u64 = redis::cmd("ZCARD").arg(&k.inflight).query(&mut c).unwrap();
    assert_eq!(inflight, 0);
    let done = Finish::Done;
    let items: Vec<(&str, u64, &Finish)> = b
        .tasks
        .iter()
        .map(|t| (t.id.as_str(), t.token, &done))
        .collect();
    assert_eq!(s.finish(0, &items).await.unwrap(), vec![Finished::Done; 2]);
    assert_eq!(s.shard_counts().await.unwrap()[0].inflight, 0);
    assert_eq!(s.get(id).await.unwrap().unwrap().state, TaskState::Done);
    // done: one in the earlier layout's `recent` (its runner's finish), two in the `finished` log
    let recent: u64 = redis::cmd("ZCARD").arg(&k.recent).query(&mut c).unwrap();
    assert_eq!(recent, 1);
    assert_eq!(found_ids(&s, TaskState::Done).await, ["u0", "u1", "u2"]);
}

/// The main before per-plugin counts (scheduled tasks listed in `byplugin`; fourteen keys per
/// shard script).
const BEFORE_PLUGIN_COUNTS: &str = "f3931482f0a52e61e480b08711d43e16be61a8ee";

/// Runs `script` of the main before per-plugin counts on shard 0 of a one-shard namespace.
fn eval_before_counts(
    c: &mut redis::Connection,
    keys: &[&str],
    script: &str,
    args: &[String],
) -> redis::Value {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script_at(BEFORE_PLUGIN_COUNTS, script))
        .arg(keys.len())
        .arg(keys);
    for a in args {
        cmd.arg(a);
    }
    cmd.query(c).unwrap()
}

/// Scheduled tasks the previous main listed in the plugin index are counted per plugin when the
/// shard is migrated, once, though two runners migrate it at the same time; its dead letters stay
/// listed; and the tasks are found, paused, resumed and claimed with the counts kept exact.
#[tokio::test]
async fn scheduled_tasks_listed_by_the_previous_main_are_counted_once_after_the_upgrade() {
    let redis = RedisServer::start();
    // the previous main's shard: opened by it (layout 3), then written by its scripts
    let old = eggtimer_tests::store_on(&redis, 1).await;
    let k = old.keys().shard(0);
    let mut c = redis.conn();
    let _: () = redis::cmd("HSET")
        .arg(&k.meta)
        .arg("layout")
        .arg("3")
        .query(&mut c)
        .unwrap();
    let keys: Vec<&str> = k.all()[..14].to_vec();
    let due = now_ms() - 1000;
    let mut args: Vec<String> = vec!["{eggtimer}:wake".into(), "0".into(), "upsert".into()];
    for i in 0..1200 {
        let plugin = if i % 4 == 0 { "a" } else { "b" };
        let id = format!("c{i:04}");
        let at = if id == "c0001" { 0 } else { due + 3_600_000 };
        for v in [&id, &at.to_string(), "3", plugin, "", "{}", "0", "0"] {
            args.push(v.to_string());
        }
    }
    // the schedule script takes each task's done key of the layout before done records in `tasks`
    let done_keys: Vec<String> = (0..1200)
        .map(|i| format!("{{eggtimer:0}}:done:c{i:04}"))
        .collect();
    let with_done: Vec<&str> = keys
        .iter()
        .copied()
        .chain(done_keys.iter().map(String::as_str))
        .collect();
    eval_before_counts(&mut c, &with_done, "schedule", &args);
    // one of them (c0001, of b) dead-lettered by the previous main's claim and finish
    let claimed = eval_before_counts(&mut c, &keys, "claim", &["10".into(), "60000".into()]);
    let redis::Value::Array(claimed) = claimed else {
        panic!("{claimed:?}")
    };
    let token: u64 = redis::from_redis_value_ref(&claimed[3]).unwrap();
    let args: Vec<String> = ["{eggtimer}:wake", "0", "60000", "c0001"]
        .iter()
        .map(|s| s.to_string())
        .chain([
            token.to_string(),
            "dead".into(),
            "0".into(),
            "gave up".into(),
        ])
        .collect();
    eval_before_counts(&mut c, &keys, "finish", &args);
    // and a stale entry, whose task is gone: dropped, not counted
    let _: () = redis::cmd("ZADD")
        .arg(&k.byplugin)
        .arg(0)
        .arg(format!("a\0s\0{:015}\0ghost", 1))
        .query(&mut c)
        .unwrap();
    let listed: u64 = redis::cmd("ZCARD").arg(&k.byplugin).query(&mut c).unwrap();
    assert_eq!(listed, 1201, "1199 scheduled, 1 dead, 1 stale");

    // two upgraded runners open the namespace at once: each migrates the shard
    let (s, _other) = tokio::join!(
        eggtimer_tests::store_on(&redis, 1),
        eggtimer_tests::store_on(&redis, 1)
    );
    assert_eq!(eggtimer_tests::layout_of(&redis, &k), "5");
    let listed: u64 = redis::cmd("ZCARD").arg(&k.byplugin).query(&mut c).unwrap();
    assert_eq!(listed, 1, "only the dead letter stays listed");
    let counts = |v: Vec<eggtimer::store::PluginCounts>| -> Vec<(u64, u64)> {
        v.iter().map(|p| (p.scheduled, p.dead)).collect()
    };
    let names = ["a".to_string(), "b".to_string()];
    assert_eq!(
        counts(s.plugin_counts(&names).await.unwrap()),
        [(300, 0), (899, 1)]
    );
    let q = eggtimer::store::FindQuery {
        plugin: Some("a".into()),
        state: Some(TaskState::Scheduled),
        limit: 100,
        ..Default::default()
    };
    assert_eq!(find_all(&s, &q).await.len(), 300);
    // paused and resumed, then claimed: every count reaches zero, none below
    s.set_paused("b", true).await.unwrap();
    s.move_task("c0002", eggtimer::store::Move::Now)
        .await
        .unwrap()
        .unwrap();
    assert!(s.claim(0, 10, 30_000).await.unwrap().tasks.is_empty());
    assert_eq!(s.set_paused("b", false).await.unwrap(), 1);
    let b = claim_when_due(&s, 0, 10, "the resumed task").await;
    assert_eq!(b.tasks[0].id, "c0002");
    assert_eq!(
        counts(s.plugin_counts(&names).await.unwrap()),
        [(300, 0), (898, 1)]
    );
}
