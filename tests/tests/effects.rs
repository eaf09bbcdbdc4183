//! A run's kv writes and events against a real redis-server: committed only if every kv entry
//! the run read is unchanged (two runs racing on one key behave as if one ran after the other).

use eggtimer::store::ScheduleMode;
use eggtimer_tests::{RedisServer, noop_task as task, store_on as store};

#[tokio::test]
async fn effects_commit_only_if_the_kv_entries_read_are_unchanged() {
    use eggtimer::store::{Committed, KvRead, KvWrite, NsEffects};
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
        .arg("{eggtimer}:events:order")
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
