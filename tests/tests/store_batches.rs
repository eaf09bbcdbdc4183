//! The batch scripts (schedule, claim, renew, finish) write each key once per batch: their
//! indexes stay exact with an id named twice in a batch and with batches larger than one chunk.

use eggtimer::Store;
use eggtimer::store::{Finish, Finished, NewTask, ScheduleMode, Scheduled, TaskState};
use eggtimer_tests::RedisServer;
use eggtimer_tests::{noop_task as task, now_ms as now, store_on as store};

/// The sizes of a shard's keys: (due, byplugin, byowner, inflight, recent, tasks).
fn key_sizes(redis: &RedisServer, s: &Store, shard: u32) -> (u64, u64, u64, u64, u64, u64) {
    let k = s.keys().shard(shard);
    let mut c = redis.conn();
    let mut card =
        |cmd: &str, key: &str| -> u64 { redis::cmd(cmd).arg(key).query(&mut c).unwrap() };
    (
        card("ZCARD", &k.due),
        card("ZCARD", &k.byplugin),
        card("ZCARD", &k.byowner),
        card("ZCARD", &k.inflight),
        card("ZCARD", &k.recent),
        card("HLEN", &k.tasks),
    )
}

/// The scripts write each key once per batch (variadic calls, in chunks of 4000 values): an id
/// named twice in one batch, and batches of more tasks than one chunk holds, keep every index
/// exact.
#[tokio::test]
async fn batched_writes_keep_every_index_exact() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    let far = now() + 3_600_000;
    // the same id twice in one batch, the second replacing the first (another due time, owner)
    let mut a1 = task("a", far);
    a1.owner = Some("u1".into());
    let mut a2 = task("a", far + 10);
    a2.owner = Some("u2".into());
    assert_eq!(
        s.schedule(&[a1, task("b", far), a2], ScheduleMode::Upsert)
            .await
            .unwrap(),
        vec![Scheduled::Ok; 3]
    );
    assert_eq!(s.get("a").await.unwrap().unwrap().run_at, far + 10);
    assert_eq!(key_sizes(&redis, &s, 0), (2, 2, 1, 0, 0, 2));
    assert!(s.owner_tasks("u1", 10, None).await.unwrap().0.is_empty());
    s.cancel("a").await.unwrap().unwrap();
    s.cancel("b").await.unwrap().unwrap();
    assert_eq!(key_sizes(&redis, &s, 0), (0, 0, 0, 0, 0, 0));

    // 5000 due tasks, claimed in one claim, renewed and finished in one call each
    let n = 5000;
    let tasks: Vec<NewTask> = (0..n).map(|i| task(&format!("t{i}"), 0)).collect();
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    assert_eq!(key_sizes(&redis, &s, 0), (n, n, 0, 0, 0, n));
    let b = s.claim(0, 10_000, 30_000).await.unwrap();
    assert_eq!(b.tasks.len() as u64, n);
    assert_eq!(key_sizes(&redis, &s, 0), (0, 0, 0, n, 0, n));
    assert!(b.tasks.iter().all(|t| t.attempt == 1));
    let held: Vec<(&str, u64)> = b.tasks.iter().map(|t| (t.id.as_str(), t.token)).collect();
    assert!(s.renew(0, &held, 30_000).await.unwrap().iter().all(|x| *x));
    let mut items: Vec<(&str, u64, &Finish)> = held
        .iter()
        .map(|(id, tk)| (*id, *tk, &Finish::Done))
        .collect();
    // an outcome named twice is recorded once: the second is stale
    items.push(items[0]);
    let verdicts = s.finish(0, &items).await.unwrap();
    assert_eq!(
        verdicts.iter().filter(|v| **v == Finished::Done).count() as u64,
        n
    );
    assert_eq!(verdicts.last(), Some(&Finished::Stale));
    assert_eq!(key_sizes(&redis, &s, 0), (0, 0, 0, 0, n, n));
    assert_eq!(
        s.get("t4999").await.unwrap().unwrap().state,
        TaskState::Done
    );
}
