//! A run's kv writes and events against a real redis-server: committed only if every kv entry
//! the run read is unchanged (two runs racing on one key behave as if one ran after the other).

use std::time::Duration;

use eggtimer::RedisTarget;
use eggtimer::store::{
    Claimed, Committed, Finish, Finished, NewTask, NsEffects, ScheduleMode, Store, StoreOptions,
};
use eggtimer_tests::{
    RedisServer, RunnerProcess, events_key, eventually, key, noop_task as task, read_events,
    store_on as store, wait_state,
};

#[tokio::test]
async fn effects_commit_only_if_the_kv_entries_read_are_unchanged() {
    use eggtimer::store::{KvRead, KvWrite};
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    s.schedule(&[task("o1", 0), task("o2", 0)], ScheduleMode::Upsert)
        .await
        .unwrap();
    let claimed = s.claim(0, 10, 30_000).await.unwrap().tasks;
    // both runs read "cancelled:1" as absent and want to set it and emit
    let fx = NsEffects {
        reads: vec![KvRead {
            key: "cancelled:1".into(),
            sha1: None,
        }],
        kv: vec![KvWrite::Set {
            key: "cancelled:1".into(),
            value: "true".into(),
            ttl_ms: Some(60_000),
        }],
        events: vec![("order".into(), "{\"n\":1}".into())],
        traceparent: None,
    };
    assert_eq!(
        s.commit_ns_effects(&claimed[0], &fx).await.unwrap(),
        Committed::Applied
    );
    assert_eq!(
        s.commit_ns_effects(&claimed[1], &fx).await.unwrap(),
        Committed::Conflict,
        "the second run read a value that has changed"
    );
    let len: usize = redis::cmd("XLEN")
        .arg(events_key("noop", "order"))
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(len, 1, "the conflicting run wrote nothing");
    // with a fresh read (sha1 of the current value) it commits
    let current: String = redis::cmd("GET")
        .arg("{eggtimer}:kv:noop:cancelled:1")
        .query(&mut redis.conn())
        .unwrap();
    let fresh = NsEffects {
        reads: vec![KvRead {
            key: "cancelled:1".into(),
            sha1: Some(redis_sha1(&redis, &current)),
        }],
        kv: vec![],
        events: vec![("order".into(), "{\"n\":2}".into())],
        traceparent: None,
    };
    assert_eq!(
        s.commit_ns_effects(&claimed[1], &fresh).await.unwrap(),
        Committed::Applied
    );
}

/// The sha1 of a value as Redis's Lua computes it.
fn redis_sha1(redis: &RedisServer, v: &str) -> String {
    redis::cmd("EVAL")
        .arg("return redis.sha1hex(ARGV[1])")
        .arg(0)
        .arg(v)
        .query(&mut redis.conn())
        .unwrap()
}

/// A run that committed its events and then lost its runner (kill -9 before the outcome was
/// recorded) is run again, but its events are not committed again: the rerun commits under the
/// first lost claim's marker, through any number of lost claims and given-back attempts, until an
/// outcome is recorded; the next attempt's effects are its own.
#[tokio::test]
async fn effects_of_a_run_whose_runner_died_are_not_committed_again_by_its_rerun() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    let mut t = task("t", 0);
    t.max_attempts = 10;
    s.schedule(&[t], ScheduleMode::Upsert).await.unwrap();
    let emit = |n: u32| NsEffects {
        events: vec![("fx".into(), format!("{{\"n\":{n}}}"))],
        ..NsEffects::default()
    };
    let events = || -> usize {
        redis::cmd("XLEN")
            .arg(events_key("noop", "fx"))
            .query(&mut redis.conn())
            .unwrap()
    };
    // A commits its events, then dies before its outcome
    let a = claim_one(&s, 100).await;
    assert_eq!(
        a.effects_claim, a.token,
        "a first claim commits under its own marker"
    );
    assert_eq!(
        s.commit_ns_effects(&a, &emit(1)).await.unwrap(),
        Committed::Applied
    );
    // B reruns it: same marker, nothing written; B dies too
    let b = claim_one(&s, 100).await;
    assert_ne!(b.token, a.token);
    assert_eq!(b.effects_claim, a.token);
    assert_eq!(
        s.commit_ns_effects(&b, &emit(2)).await.unwrap(),
        Committed::AppliedBefore
    );
    // C is given back unstarted (shutdown): the chain holds
    let c = claim_one(&s, 30_000).await;
    assert_eq!(c.effects_claim, a.token, "after two lost claims");
    let release = Finish::Release;
    assert_eq!(
        s.finish(0, &[(key("t").as_str(), c.token, &release)])
            .await
            .unwrap(),
        vec![Finished::Release]
    );
    let d = claim_one(&s, 30_000).await;
    assert_eq!(d.effects_claim, a.token, "after an attempt given back");
    assert_eq!(
        s.commit_ns_effects(&d, &emit(3)).await.unwrap(),
        Committed::AppliedBefore
    );
    assert_eq!(events(), 1, "the lost run's events, once");
    // D's outcome is recorded (a retry): the next attempt is a new run, with effects of its own
    let retry = Finish::Retry {
        after_ms: 0,
        error: "again".into(),
    };
    assert_eq!(
        s.finish(0, &[(key("t").as_str(), d.token, &retry)])
            .await
            .unwrap(),
        vec![Finished::Retry]
    );
    let rerun_entries = || -> usize {
        redis::cmd("HLEN")
            .arg("{eggtimer:0}:rerun")
            .query(&mut redis.conn())
            .unwrap()
    };
    assert_eq!(rerun_entries(), 0, "a recorded outcome ends the chain");
    let e = claim_one(&s, 30_000).await;
    assert_eq!(e.effects_claim, e.token);
    assert_eq!(
        s.commit_ns_effects(&e, &emit(4)).await.unwrap(),
        Committed::Applied
    );
    assert_eq!(events(), 2);

    // A lost claim that had committed nothing: its rerun commits, and the lost claim's late
    // commit (its runner was only stalled) is refused as applied before.
    s.schedule(&[task("u", 0)], ScheduleMode::Upsert)
        .await
        .unwrap();
    let f = claim_one(&s, 100).await;
    let g = claim_one(&s, 30_000).await;
    assert_eq!((g.id.clone(), g.effects_claim), (key("u"), f.token));
    assert_eq!(
        s.commit_ns_effects(&g, &emit(5)).await.unwrap(),
        Committed::Applied
    );
    assert_eq!(
        s.commit_ns_effects(&f, &emit(6)).await.unwrap(),
        Committed::AppliedBefore
    );
    assert_eq!(events(), 3);
    let done = Finish::Done;
    assert_eq!(
        s.finish(0, &[(key("u").as_str(), g.token, &done)])
            .await
            .unwrap(),
        vec![Finished::Done]
    );
    assert_eq!(rerun_entries(), 0, "u's outcome ends its chain");
    // cancelling a task put back by lease expiry drops its entry
    s.schedule(&[task("v", 0)], ScheduleMode::Upsert)
        .await
        .unwrap();
    let v = claim_one(&s, 100).await;
    assert_eq!(v.id, key("v"));
    eventually(Duration::from_secs(5), "v's lease to expire", || async {
        // a claim of nothing due reaps; v comes back as due and is claimed, so give it back
        let b = s.claim(0, 10, 30_000).await.unwrap();
        let w = b.tasks.into_iter().find(|t| t.id == key("v"))?;
        let release = Finish::Release;
        s.finish(0, &[(key("v").as_str(), w.token, &release)])
            .await
            .unwrap();
        Some(())
    })
    .await;
    assert_eq!(rerun_entries(), 1, "v was put back by lease expiry");
    assert!(s.cancel(&key("v")).await.unwrap().is_ok());
    assert_eq!(rerun_entries(), 0, "cancel drops v's entry");
}

/// The same through a runner process: a runner that committed a task's event and died before its
/// outcome (the test plays it: a claim with a short lease, a commit, nothing more) is taken over by
/// a real runner, which runs the task again to done without emitting again; a task the dead runner
/// claimed and committed nothing for is emitted by the rerun.
#[tokio::test]
async fn a_runner_takes_over_a_dead_runners_task_without_emitting_its_event_again() {
    let redis = RedisServer::start();
    let s = Store::open(RedisTarget::Single(redis.url()), StoreOptions::default())
        .await
        .unwrap();
    let ids = ["committed", "not-committed"];
    let specs: Vec<NewTask> = ids
        .iter()
        .map(|id| NewTask {
            id: (*id).into(),
            plugin: "coupon-expiry".into(),
            payload: format!(r#"{{"coupon_id":"{id}","user_id":"u","expires_at":0}}"#),
            run_at: 0,
            owner: None,
            max_attempts: 5,
            unique_for_ms: 0,
            traceparent: None,
            start_by: None,
            ..Default::default()
        })
        .collect();
    s.schedule(&specs, ScheduleMode::Upsert).await.unwrap();
    let mut held = Vec::new();
    for id in ids {
        held.extend(s.claim(s.shard_of(id), 10, 300).await.unwrap().tasks);
    }
    assert_eq!(held.len(), 2, "{held:?}");
    let dead_run = held
        .iter()
        .find(|t| t.id == eggtimer::store::task_key("coupon-expiry", "committed"))
        .unwrap();
    let fx = NsEffects {
        events: vec![("push".into(), r#"{"from":"the dead runner"}"#.into())],
        ..NsEffects::default()
    };
    assert_eq!(
        s.commit_ns_effects(dead_run, &fx).await.unwrap(),
        Committed::Applied
    );
    let r = RunnerProcess::with_plugins(&redis, &[]);
    for id in ids {
        let t = wait_state(&r.url, id, "done", Duration::from_secs(30)).await;
        assert_eq!(t["attempts"], 2, "{t}");
    }
    let events = read_events(&mut redis.conn(), &["coupon-expiry"], "push");
    let of = |id: &str| -> Vec<serde_json::Value> {
        events
            .iter()
            .filter(|(t, _, _)| t == id)
            .map(|(_, _, data)| data.clone())
            .collect()
    };
    assert_eq!(
        of("committed"),
        vec![serde_json::json!({"from": "the dead runner"})],
        "the dead run's event, once"
    );
    let rerun = of("not-committed");
    assert_eq!(rerun.len(), 1, "{events:?}");
    assert_eq!(rerun[0]["coupon_id"], "not-committed");
}

/// The one task of shard 0 claimed once its earlier claim's lease (if any) expired.
async fn claim_one(s: &Store, lease_ms: u64) -> Claimed {
    eventually(Duration::from_secs(5), "a task to claim", || async {
        let mut b = s.claim(0, 10, lease_ms).await.unwrap();
        assert!(b.tasks.len() <= 1, "one task at a time: {:?}", b.tasks);
        b.tasks.pop()
    })
    .await
}

/// The marker a run's kv writes and events are committed under is dropped once its task's outcome
/// is recorded (a few seconds' grace for a stalled runner): 500 reminders that emit leave no
/// marker behind, where each used to stay a day.
#[tokio::test]
async fn effect_markers_go_once_their_tasks_outcomes_are_recorded() {
    let redis = RedisServer::start();
    let r = RunnerProcess::with_plugins(&redis, &[]);
    let specs: Vec<serde_json::Value> = (0..500)
        .map(|i| {
            serde_json::json!({"plugin": "coupon-expiry", "id": format!("remind-{i}"),
                "payload": {"coupon_id": format!("c{i}"), "user_id": "u1", "expires_at": 0}})
        })
        .collect();
    eggtimer_tests::post_tasks(&r.url, serde_json::Value::Array(specs)).await;
    let mut c = redis.conn();
    eventually(Duration::from_secs(60), "500 reminders emitted", || {
        let n = read_events(&mut c, &["coupon-expiry"], "push").len();
        async move { (n == 500).then_some(()) }
    })
    .await;
    wait_state(&r.url, "remind-499", "done", Duration::from_secs(30)).await;
    let markers = |c: &mut redis::Connection| -> Vec<(String, i64)> {
        let keys: Vec<String> = redis::cmd("KEYS").arg("{eggtimer}:fx:*").query(c).unwrap();
        keys.into_iter()
            .map(|k| {
                let ttl: i64 = redis::cmd("PTTL").arg(&k).query(c).unwrap();
                (k, ttl)
            })
            .collect()
    };
    // whatever is left expires within the grace, not in a day
    let grace = eggtimer::store::MARKER_GRACE_MS as i64;
    eventually(
        Duration::from_secs(30),
        "every marker within the grace",
        || {
            let left = markers(&mut c);
            let ok = left.iter().all(|(_, ttl)| *ttl <= grace);
            async move { ok.then_some(()) }
        },
    )
    .await;
    eventually(Duration::from_secs(30), "no marker left", || {
        let left = markers(&mut c).len();
        async move { (left == 0).then_some(()) }
    })
    .await;
}

/// A one-shard store with `opts` and `n` tasks claimed in it (each claim commits effects once).
async fn store_with_claimed(
    redis: &RedisServer,
    opts: eggtimer::store::StoreOptions,
    n: usize,
) -> (Store, Vec<eggtimer::Claimed>) {
    let opts = eggtimer::store::StoreOptions { shards: 1, ..opts };
    let s = Store::open(RedisTarget::Single(redis.url()), opts)
        .await
        .unwrap();
    let tasks: Vec<NewTask> = (0..n).map(|i| task(&format!("t{i}"), 0)).collect();
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    let claimed = s.claim(0, n, 30_000).await.unwrap().tasks;
    assert_eq!(claimed.len(), n);
    (s, claimed)
}

/// A plugin writes events to at most `--max-topics` topics: a run whose events would add one past
/// it writes nothing (kv included) and says so; topics it has written stay open to it. Before, a
/// plugin could create any number of streams.
#[tokio::test]
async fn a_plugin_writes_events_to_at_most_max_topics_topics() {
    use eggtimer::store::KvWrite;
    let redis = RedisServer::start();
    let opts = eggtimer::store::StoreOptions {
        max_topics: 3,
        ..Default::default()
    };
    let (s, claimed) = store_with_claimed(&redis, opts, 4).await;
    let emit = |topics: &[&str]| NsEffects {
        kv: vec![KvWrite::Set {
            key: "written".into(),
            value: topics.join(","),
            ttl_ms: None,
        }],
        events: topics
            .iter()
            .map(|t| (t.to_string(), "{}".into()))
            .collect(),
        ..NsEffects::default()
    };
    // three topics (one named twice): room for them
    let fx = emit(&["a", "b", "a", "c"]);
    assert_eq!(
        s.commit_ns_effects(&claimed[0], &fx).await.unwrap(),
        Committed::Applied
    );
    // a fourth: refused, nothing of the run written
    let fx = emit(&["a", "d"]);
    assert_eq!(
        s.commit_ns_effects(&claimed[1], &fx).await.unwrap(),
        Committed::TooManyTopics { max: 3 }
    );
    assert_eq!(
        s.kv_get("noop", "written").await.unwrap().as_deref(),
        Some("a,b,a,c")
    );
    let len = |key: String| -> usize {
        redis::cmd("XLEN")
            .arg(key)
            .query(&mut redis.conn())
            .unwrap()
    };
    assert_eq!(len(events_key("noop", "a")), 2);
    assert_eq!(len(events_key("noop", "d")), 0);
    // the topics it has stay open
    let fx = emit(&["c", "b"]);
    assert_eq!(
        s.commit_ns_effects(&claimed[2], &fx).await.unwrap(),
        Committed::Applied
    );
    assert_eq!(len(events_key("noop", "c")), 2);
}

/// A plugin keeps at most `--kv-max-keys` kv keys and `--kv-max-bytes` bytes of keys and values:
/// a run whose writes would add past either writes nothing and says so; overwriting and deleting
/// stay open, and an entry whose TTL has passed no longer counts. Before, one team's plugin could
/// fill Redis with kv, and then every team's schedules got 507.
#[tokio::test]
async fn a_plugin_keeps_at_most_kv_max_keys_keys_and_kv_max_bytes_bytes() {
    use eggtimer::store::KvWrite;
    let redis = RedisServer::start();
    let opts = eggtimer::store::StoreOptions {
        kv_max_keys: 3,
        kv_max_bytes: 100,
        ..Default::default()
    };
    let (s, claimed) = store_with_claimed(&redis, opts, 40).await;
    let mut claimed = claimed.into_iter();
    let set = |key: &str, value: &str, ttl_ms: Option<u64>| KvWrite::Set {
        key: key.into(),
        value: value.into(),
        ttl_ms,
    };
    let del = |key: &str| KvWrite::Delete { key: key.into() };
    let mut commit = async |kv: Vec<KvWrite>| {
        let fx = NsEffects {
            kv,
            ..NsEffects::default()
        };
        let run = claimed.next().expect("a claimed task left");
        s.commit_ns_effects(&run, &fx).await.unwrap()
    };
    let full = Committed::KvFull {
        max_keys: 3,
        max_bytes: 100,
        team: None,
    };
    assert_eq!(
        commit(vec![
            set("a", "1", None),
            set("b", "2", None),
            set("c", "3", None)
        ])
        .await,
        Committed::Applied
    );
    // a fourth key: refused whole (the overwrite beside it too)
    assert_eq!(
        commit(vec![set("a", "9", None), set("d", "4", None)]).await,
        full
    );
    assert_eq!(s.kv_get("noop", "d").await.unwrap(), None);
    assert_eq!(s.kv_get("noop", "a").await.unwrap().as_deref(), Some("1"));
    // overwriting, and a delete that makes room, are taken
    assert_eq!(commit(vec![set("a", "10", None)]).await, Committed::Applied);
    assert_eq!(
        commit(vec![del("b"), set("d", "4", None)]).await,
        Committed::Applied
    );
    assert_eq!(s.kv_get("noop", "d").await.unwrap().as_deref(), Some("4"));
    // bytes: a value that would take the keys and values past 100 bytes
    let big = "x".repeat(97); // with "a", "c" and "d": 102 bytes
    assert_eq!(commit(vec![set("a", &big, None)]).await, full);
    assert_eq!(s.kv_get("noop", "a").await.unwrap().as_deref(), Some("10"));
    // an entry with a TTL counts until the TTL has passed, then it makes room
    assert_eq!(
        commit(vec![del("c"), set("e", "5", Some(200))]).await,
        Committed::Applied
    );
    assert_eq!(commit(vec![set("f", "6", None)]).await, full);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match commit(vec![set("f", "6", None)]).await {
            Committed::Applied => break,
            c => assert_eq!(c, full),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "an entry whose TTL passed still counts"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(s.kv_get("noop", "e").await.unwrap(), None);
    assert_eq!(s.kv_get("noop", "f").await.unwrap().as_deref(), Some("6"));
}
