//! The batch scripts (schedule, claim, renew, finish) write each key once per batch: their
//! indexes stay exact with an id named twice in a batch and with batches larger than one chunk.

use std::collections::BTreeSet;

use eggtimer::Store;
use eggtimer::store::{FindQuery, Finish, Finished, NewTask, ScheduleMode, Scheduled, TaskState};
use eggtimer_tests::{RedisServer, claim_when_due, due_entries, found_ids, key};
use eggtimer_tests::{noop_task as task, now_ms as now, store_on as store};

/// The sizes of a shard's keys: (due, scheduled, byowner, running, done, tasks); scheduled is the
/// sum of the per-plugin counts, running the count the claim batches keep, done the ids in the
/// `finished` log.
fn key_sizes(redis: &RedisServer, s: &Store, shard: u32) -> (u64, u64, u64, u64, u64, u64) {
    let k = s.keys().shard(shard);
    let mut c = redis.conn();
    let mut card =
        |cmd: &str, key: &str| -> u64 { redis::cmd(cmd).arg(key).query(&mut c).unwrap() };
    let running: Option<u64> = redis::cmd("HGET")
        .arg(&k.batches)
        .arg("running")
        .query(&mut redis.conn())
        .unwrap();
    let log: Vec<String> = redis::cmd("ZRANGE")
        .arg(&k.finished)
        .arg(0)
        .arg(-1)
        .query(&mut redis.conn())
        .unwrap();
    let per_plugin: Vec<u64> = redis::cmd("HVALS")
        .arg(&k.scheduled)
        .query(&mut redis.conn())
        .unwrap();
    let done = log
        .iter()
        .map(|e| e.split('\t').skip(1).count() as u64)
        .sum::<u64>();
    (
        due_entries(redis, &k).len() as u64,
        per_plugin.iter().sum(),
        card("ZCARD", &k.byowner),
        running.unwrap_or(0),
        done,
        card("HLEN", &k.tasks),
    )
}

/// The claim batches still holding a lease: (entries in `claim_leases`, fields of `batches` besides its
/// running count).
/// A plugin's running tasks as its shard counts them (for max_pending).
fn running_of(redis: &RedisServer, s: &Store, shard: u32, plugin: &str) -> Option<u64> {
    redis::cmd("HGET")
        .arg(&s.keys().shard(shard).batches)
        .arg(format!("running:{plugin}"))
        .query(&mut redis.conn())
        .unwrap()
}

/// The claims' leases, and the claims' fields of `batches` (not the running counts).
fn batches_left(redis: &RedisServer, s: &Store, shard: u32) -> (u64, u64) {
    let k = s.keys().shard(shard);
    let mut c = redis.conn();
    let leases: u64 = redis::cmd("ZCARD")
        .arg(&k.claim_leases)
        .query(&mut c)
        .unwrap();
    let fields: Vec<String> = redis::cmd("HKEYS").arg(&k.batches).query(&mut c).unwrap();
    (
        leases,
        fields.iter().filter(|f| !f.starts_with("running")).count() as u64,
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
    assert_eq!(s.get(&key("a")).await.unwrap().unwrap().run_at, far + 10);
    assert_eq!(key_sizes(&redis, &s, 0), (2, 2, 1, 0, 0, 2));
    assert!(s.owner_tasks("u1", 10, None).await.unwrap().0.is_empty());
    s.cancel(&key("a")).await.unwrap().unwrap();
    s.cancel(&key("b")).await.unwrap().unwrap();
    assert_eq!(key_sizes(&redis, &s, 0), (0, 0, 0, 0, 0, 0));

    // 5000 due tasks, claimed in one claim, renewed and finished in one call each
    let n = 5000;
    let tasks: Vec<NewTask> = (0..n).map(|i| task(&format!("t{i}"), 0)).collect();
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    assert_eq!(key_sizes(&redis, &s, 0), (n, n, 0, 0, 0, n));
    let b = s.claim(0, 10_000, 30_000).await.unwrap();
    assert_eq!(b.tasks.len() as u64, n);
    assert_eq!(key_sizes(&redis, &s, 0), (0, 0, 0, n, 0, n));
    // one lease for the whole claim: its token and its count
    assert_eq!(batches_left(&redis, &s, 0), (1, 2));
    assert_eq!(running_of(&redis, &s, 0, "noop"), Some(n));
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
    assert_eq!(batches_left(&redis, &s, 0), (0, 0));
    assert_eq!(running_of(&redis, &s, 0, "noop"), None, "none left running");
    assert_eq!(
        s.get(&key("t4999")).await.unwrap().unwrap().state,
        TaskState::Done
    );
}

/// A claim batch holds one lease. Its runner records the outcomes of some of its tasks and dies:
/// when the lease ends, the next claim puts back only the tasks still running under it, and the
/// batch leaves the lease keys once its last task's outcome is recorded.
#[tokio::test]
async fn a_batch_whose_runner_dies_half_done_gives_back_only_its_running_tasks() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    // a batch lists its ids tab-separated: an id with a tab is refused before anything is written
    let e = s
        .schedule(&[task("h\t1", 0)], ScheduleMode::Upsert)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("holds a tab"), "{e:#}");
    let tasks: Vec<NewTask> = (0..10).map(|i| task(&format!("h{i}"), 0)).collect();
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    let a = s.claim(0, 100, 300).await.unwrap();
    assert_eq!(a.tasks.len(), 10);
    let done = Finish::Done;
    let first: Vec<(&str, u64, &Finish)> = a.tasks[..6]
        .iter()
        .map(|t| (t.id.as_str(), t.token, &done))
        .collect();
    assert_eq!(s.finish(0, &first).await.unwrap(), vec![Finished::Done; 6]);
    assert_eq!(key_sizes(&redis, &s, 0).3, 4);
    assert_eq!(s.shard_counts().await.unwrap()[0].inflight, 4);
    assert_eq!(batches_left(&redis, &s, 0), (1, 2));
    assert_eq!(running_of(&redis, &s, 0, "noop"), Some(4));
    let rest: BTreeSet<String> = a.tasks[6..].iter().map(|t| t.id.clone()).collect();
    let running: BTreeSet<String> = found_ids(&s, TaskState::Running)
        .await
        .iter()
        .map(|id| key(id))
        .collect();
    assert_eq!(running, rest);
    // the runner is gone: after its lease, another claim takes over the four, and only them
    let b = claim_when_due(&s, 0, 100, "the batch's lease to end").await;
    let again: BTreeSet<String> = b.tasks.iter().map(|t| t.id.clone()).collect();
    assert_eq!(again, rest);
    assert_eq!(
        running_of(&redis, &s, 0, "noop"),
        Some(4),
        "reaped, claimed again"
    );
    assert!(b.tasks.iter().all(|t| t.attempt == 2));
    for t in &a.tasks[..6] {
        assert_eq!(s.get(&t.id).await.unwrap().unwrap().state, TaskState::Done);
    }
    // the dead claim's late outcome is refused; the new one's is recorded and ends its batch
    let t = &a.tasks[6];
    assert_eq!(
        s.finish(0, &[(t.id.as_str(), t.token, &done)])
            .await
            .unwrap(),
        vec![Finished::Stale]
    );
    assert_eq!(batches_left(&redis, &s, 0), (1, 2));
    let last: Vec<(&str, u64, &Finish)> = b
        .tasks
        .iter()
        .map(|t| (t.id.as_str(), t.token, &done))
        .collect();
    assert_eq!(s.finish(0, &last).await.unwrap(), vec![Finished::Done; 4]);
    assert_eq!(batches_left(&redis, &s, 0), (0, 0));
    assert_eq!(running_of(&redis, &s, 0, "noop"), None);
    assert_eq!(key_sizes(&redis, &s, 0), (0, 0, 0, 0, 10, 10));
}

/// Done tasks are logged one entry per finish script: find pages through them most recent first,
/// each task once, at the time its record says it finished (one finished twice, or replaced by a
/// new schedule since, is listed only as it is now).
#[tokio::test]
async fn done_tasks_are_found_through_the_finish_log_each_once() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    let run = |ids: Vec<String>| {
        let s = &s;
        async move {
            let done = Finish::Done;
            let tasks: Vec<NewTask> = ids.iter().map(|id| task(id, 0)).collect();
            s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
            let b = s.claim(0, 1000, 30_000).await.unwrap();
            assert_eq!(b.tasks.len(), ids.len());
            // recorded in batches of 7, so the log has many entries, some at the same time
            for part in b.tasks.chunks(7) {
                let items: Vec<(&str, u64, &Finish)> = part
                    .iter()
                    .map(|t| (t.id.as_str(), t.token, &done))
                    .collect();
                assert_eq!(
                    s.finish(0, &items).await.unwrap(),
                    vec![Finished::Done; part.len()]
                );
            }
        }
    };
    run((0..120).map(|i| format!("d{i}")).collect()).await;
    // d0..d9 run and finish again; d10 is scheduled anew (not done any more)
    run((0..10).map(|i| format!("d{i}")).collect()).await;
    s.schedule(&[task("d10", now() + 3_600_000)], ScheduleMode::Upsert)
        .await
        .unwrap();
    let q = FindQuery {
        plugin: None,
        state: Some(TaskState::Done),
        owner: None,
        due_after: None,
        due_before: None,
        limit: 25,
    };
    let (mut seen, mut cursor, mut pages) = (Vec::new(), None, 0);
    loop {
        let (page, next) = s.find(&q, cursor).await.unwrap();
        assert!(page.len() <= 25);
        seen.extend(page.into_iter().map(|r| (r.finished_at.unwrap(), r.id)));
        pages += 1;
        assert!(pages < 50, "find did not end");
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let ids: BTreeSet<&str> = seen.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(ids.len(), seen.len(), "a task listed twice");
    let want: BTreeSet<String> = (0..120)
        .filter(|i| *i != 10)
        .map(|i| format!("d{i}"))
        .collect();
    assert_eq!(ids, want.iter().map(String::as_str).collect());
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(seen, sorted, "most recent first");
    // the ten finished twice are listed at their second finish, the latest
    let twice = |id: &str| id.len() == 2;
    let last_once = seen
        .iter()
        .filter(|(_, id)| !twice(id))
        .map(|(k, _)| *k)
        .max();
    assert!(
        seen.iter()
            .filter(|(_, id)| twice(id))
            .all(|(k, _)| Some(*k) >= last_once)
    );
}

/// The check before a batch over several shards (`conflicts_among`) reads a shard's records only
/// when something there could refuse: it still finds a running id and an id inside its dedup
/// window, and finds nothing where nothing runs.
#[tokio::test]
async fn the_check_before_a_batch_finds_running_ids_and_dedup_windows() {
    let redis = RedisServer::start();
    let s = store(&redis, 4).await;
    let far = now() + 3_600_000;
    let ids: Vec<String> = (0..16).map(|i| format!("c{i}")).collect();
    let tasks: Vec<NewTask> = ids.iter().map(|id| task(id, far)).collect();
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    let mut asked: Vec<String> = ids.iter().map(|id| key(id)).collect();
    asked.extend([key("r"), key("u")]);
    let asked: Vec<&str> = asked.iter().map(String::as_str).collect();
    let shards: BTreeSet<u32> = asked.iter().map(|id| s.shard_of(id)).collect();
    assert_eq!(shards.len(), 4, "the ids asked about span every shard");
    assert_eq!(s.conflicts_among(&asked).await.unwrap(), vec![None; 18]);
    // a running task, claimed in a batch
    s.schedule(&[task("r", 0)], ScheduleMode::Upsert)
        .await
        .unwrap();
    let b = claim_when_due(&s, s.shard_of("r"), 10, "r to be due").await;
    assert_eq!(b.tasks.len(), 1);
    let mut want = vec![None; 18];
    want[16] = Some(Scheduled::Running);
    assert_eq!(s.conflicts_among(&asked).await.unwrap(), want);
    let done = Finish::Done;
    let t = &b.tasks[0];
    let outcome = [(t.id.as_str(), t.token, &done)];
    let fin = s.finish(s.shard_of("r"), &outcome).await.unwrap();
    assert_eq!(fin, vec![Finished::Done]);
    // an id inside its dedup window, where nothing runs
    let mut u = task("u", 0);
    u.unique_for_ms = 600_000;
    s.schedule(&[u], ScheduleMode::Upsert).await.unwrap();
    let b = claim_when_due(&s, s.shard_of("u"), 10, "u to be due").await;
    let outcome = [(b.tasks[0].id.as_str(), b.tasks[0].token, &done)];
    let fin = s.finish(s.shard_of("u"), &outcome).await.unwrap();
    assert_eq!(fin, vec![Finished::Done]);
    let mut want = vec![None; 18];
    want[17] = Some(Scheduled::Duplicate);
    assert_eq!(s.conflicts_among(&asked).await.unwrap(), want);
}
