//! Every store script against a real redis-server.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use eggtimer::store::{
    Finish, Finished, Move, NewTask, Refused, ScheduleMode, Scheduled, StoreOptions, TaskState,
};
use eggtimer::{RedisTarget, Store};
use eggtimer_tests::{RedisServer, due_entries, eventually};

use eggtimer_tests::{claim_when_due, key, noop_task as task, store_on as store};

fn now() -> i64 {
    eggtimer::clock::system_ms()
}

#[tokio::test]
async fn schedule_is_an_idempotent_upsert() {
    let redis = RedisServer::start();
    let s = store(&redis, 4).await;
    let t0 = now() + 60_000;
    let mut t = task("a", t0);
    t.owner = Some("u1".into());
    assert_eq!(
        s.schedule(&[t.clone(), t.clone()], ScheduleMode::Upsert)
            .await
            .unwrap(),
        vec![Scheduled::Ok; 2]
    );
    let mut t2 = t.clone();
    t2.run_at = t0 + 5;
    t2.payload = "[1,2]".into();
    t2.owner = Some("u2".into());
    s.schedule(&[t2], ScheduleMode::Upsert).await.unwrap();
    let got = s.get(&key("a")).await.unwrap().unwrap();
    assert_eq!(
        (got.run_at, got.payload.as_str(), got.owner.as_deref()),
        (t0 + 5, "[1,2]", Some("u2"))
    );
    assert_eq!(got.state, TaskState::Scheduled);
    // the owner index followed the replacement
    assert!(s.owner_tasks("u1", 1000, None).await.unwrap().0.is_empty());
    assert_eq!(s.owner_tasks("u2", 1000, None).await.unwrap().0.len(), 1);
    // only one entry in due
    let shard = s.shard_of("a");
    let entries = due_entries(&redis, &s.keys().shard(shard));
    assert_eq!(entries, vec![(key("a"), t0 + 5)]);
    // IfAbsent leaves it alone
    let mut t3 = task("a", 1);
    t3.payload = "3".into();
    assert_eq!(
        s.schedule(&[t3], ScheduleMode::IfAbsent).await.unwrap(),
        vec![Scheduled::Exists]
    );
    assert_eq!(s.get(&key("a")).await.unwrap().unwrap().payload, "[1,2]");
}

#[tokio::test]
async fn never_claims_early_and_reports_the_next_due_time() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    let due = now() + 300;
    s.schedule(&[task("later", due)], ScheduleMode::Upsert)
        .await
        .unwrap();
    let b = s.claim(0, 10, 30_000).await.unwrap();
    assert!(b.tasks.is_empty());
    assert_eq!(b.next_due, Some(due));
    let b = claim_when_due(&s, 0, 10, "the task to become due").await;
    assert!(b.now >= due, "claimed at {} before due {}", b.now, due);
    assert_eq!(b.tasks[0].attempt, 1);
    assert_eq!(b.next_due, None);
    assert_eq!(
        s.get(&key("later")).await.unwrap().unwrap().state,
        TaskState::Running
    );
}

#[tokio::test]
async fn running_tasks_refuse_moves_cancels_and_replacement() {
    let redis = RedisServer::start();
    let s = store(&redis, 2).await;
    s.schedule(
        &[task("r", 0), task("m", now() + 100_000)],
        ScheduleMode::Upsert,
    )
    .await
    .unwrap();
    let shard = s.shard_of("r");
    let b = s.claim(shard, 10, 30_000).await.unwrap();
    assert!(b.tasks.iter().any(|t| t.id == key("r")));
    let claimed_token = b.tasks[0].token;
    assert_eq!(
        s.move_task(&key("r"), Move::Now).await.unwrap(),
        Err(Refused::Running)
    );
    assert_eq!(s.cancel(&key("r")).await.unwrap(), Err(Refused::Running));
    assert_eq!(
        s.schedule(&[task("r", 5)], ScheduleMode::Upsert)
            .await
            .unwrap(),
        vec![Scheduled::Running]
    );
    // moves of a scheduled task
    let base = s.get(&key("m")).await.unwrap().unwrap().run_at;
    assert_eq!(
        s.move_task(&key("m"), Move::Shift(-1000)).await.unwrap(),
        Ok(base - 1000)
    );
    assert_eq!(
        s.move_task(&key("m"), Move::At(base + 7)).await.unwrap(),
        Ok(base + 7)
    );
    let t = s.move_task(&key("m"), Move::Now).await.unwrap().unwrap();
    assert!(t <= now() + 5);
    assert_eq!(
        s.move_task(&key("nope"), Move::Now).await.unwrap(),
        Err(Refused::Missing)
    );
    assert_eq!(s.cancel(&key("m")).await.unwrap(), Ok(()));
    assert!(s.get(&key("m")).await.unwrap().is_none());
    assert_eq!(s.cancel(&key("m")).await.unwrap(), Err(Refused::Missing));
    // done: readable, and refuses moves
    let f = Finish::Done;
    let token = claimed_token;
    assert_eq!(
        s.finish(shard, &[(key("r").as_str(), token, &f)])
            .await
            .unwrap(),
        vec![Finished::Done]
    );
    let done = s.get(&key("r")).await.unwrap().unwrap();
    assert_eq!(done.state, TaskState::Done);
    assert!(done.finished_at.is_some());
    assert_eq!(
        s.move_task(&key("r"), Move::Now).await.unwrap(),
        Err(Refused::Done)
    );
}

#[tokio::test]
async fn an_expired_lease_is_run_again_and_the_late_ack_is_refused() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    s.schedule(&[task("x", 0)], ScheduleMode::Upsert)
        .await
        .unwrap();
    // runner A claims with a short lease and "dies"
    let a = s.claim(0, 10, 100).await.unwrap();
    assert_eq!(a.tasks.len(), 1);
    assert_eq!(a.next_lease_expiry.map(|l| l - a.now), Some(100));
    // runner B's claims reap it after the lease
    let b = claim_when_due(&s, 0, 10, "the lease to expire").await;
    assert_eq!(b.tasks[0].id, key("x"));
    assert_eq!(b.tasks[0].attempt, 2);
    assert_ne!(a.tasks[0].token, b.tasks[0].token);
    // A can't renew or finish any more; B's ack is accepted once
    assert_eq!(
        s.renew(0, &[(key("x").as_str(), a.tasks[0].token)], 30_000)
            .await
            .unwrap(),
        vec![false]
    );
    let done = Finish::Done;
    assert_eq!(
        s.finish(0, &[(key("x").as_str(), a.tasks[0].token, &done)])
            .await
            .unwrap(),
        vec![Finished::Stale]
    );
    assert_eq!(
        s.finish(0, &[(key("x").as_str(), b.tasks[0].token, &done)])
            .await
            .unwrap(),
        vec![Finished::Done]
    );
    assert_eq!(
        s.finish(0, &[(key("x").as_str(), b.tasks[0].token, &done)])
            .await
            .unwrap(),
        vec![Finished::Stale]
    );
}

#[tokio::test]
async fn retries_back_off_then_dead_letter_then_replay_and_drop() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    s.schedule(&[task("f", 0)], ScheduleMode::Upsert)
        .await
        .unwrap();
    for attempt in 1..=3u32 {
        let b = claim_when_due(&s, 0, 10, "the retry to become due").await;
        assert_eq!(b.tasks[0].attempt, attempt);
        let retry = Finish::Retry {
            after_ms: 50,
            error: format!("boom\t{attempt}"),
        };
        let v = s
            .finish(0, &[(key("f").as_str(), b.tasks[0].token, &retry)])
            .await
            .unwrap();
        if attempt < 3 {
            assert_eq!(v, vec![Finished::Retry]);
            let t = s.get(&key("f")).await.unwrap().unwrap();
            assert_eq!(t.state, TaskState::Scheduled);
            assert_eq!(
                t.last_error.as_deref(),
                Some(format!("boom {attempt}").as_str())
            );
            assert!(t.run_at >= b.now + 50);
        } else {
            assert_eq!(v, vec![Finished::Dead]);
        }
    }
    let (dead, cursor) = s.dead(10, None).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(cursor, None);
    assert_eq!(dead[0].state, TaskState::Dead);
    assert_eq!(dead[0].attempts, 3);
    assert_eq!(
        s.move_task(&key("f"), Move::Now).await.unwrap(),
        Err(Refused::Dead)
    );
    // replay: due now, attempts reset
    s.revive(&key("f")).await.unwrap().unwrap();
    let t = s.get(&key("f")).await.unwrap().unwrap();
    assert_eq!((t.state, t.attempts), (TaskState::Scheduled, 0));
    assert_eq!(s.revive(&key("f")).await.unwrap(), Err(Refused::NotDead));
    assert!(s.dead(10, None).await.unwrap().0.is_empty());
    // dead again through Fail, then dropped
    let b = s.claim(0, 10, 30_000).await.unwrap();
    let dead_now = Finish::Dead {
        error: "bad payload".into(),
    };
    assert_eq!(
        s.finish(0, &[(key("f").as_str(), b.tasks[0].token, &dead_now)])
            .await
            .unwrap(),
        vec![Finished::Dead]
    );
    assert_eq!(s.drop_dead(&key("f")).await.unwrap(), Ok(()));
    assert!(s.get(&key("f")).await.unwrap().is_none());
}

#[tokio::test]
async fn run_again_and_release_put_the_task_back() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    s.schedule(&[task("g", 0), task("h", 0)], ScheduleMode::Upsert)
        .await
        .unwrap();
    let b = s.claim(0, 10, 30_000).await.unwrap();
    assert_eq!(b.tasks.len(), 2);
    let later = now() + 100_000;
    let again = Finish::Again { at: later };
    let release = Finish::Release;
    let v = s
        .finish(
            0,
            &[
                (key("g").as_str(), b.tasks[0].token, &again),
                (key("h").as_str(), b.tasks[0].token, &release),
            ],
        )
        .await
        .unwrap();
    assert_eq!(v, vec![Finished::Again, Finished::Release]);
    let g = s.get(&key("g")).await.unwrap().unwrap();
    assert_eq!(
        (g.state, g.run_at, g.attempts),
        (TaskState::Scheduled, later, 0)
    );
    let h = s.get(&key("h")).await.unwrap().unwrap();
    assert_eq!(
        (h.state, h.run_at, h.attempts),
        (TaskState::Scheduled, 0, 0)
    );
}

#[tokio::test]
async fn tasks_survive_a_redis_kill_and_restart_with_aof() {
    let mut redis = RedisServer::start();
    let s = store(&redis, 4).await;
    let tasks: Vec<NewTask> = (0..500)
        .map(|i| task(&format!("p{i}"), now() + 1_000_000 + i))
        .collect();
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    redis.kill();
    redis.start_again();
    let s = store(&redis, 4).await;
    for want in &tasks {
        let t = s.get(&key(&want.id)).await.unwrap().expect("survived");
        assert_eq!(t.run_at, want.run_at);
    }
    // a runner started with another shard count refuses, saying why
    let err = Store::open(
        RedisTarget::Single(redis.url()),
        StoreOptions {
            shards: 8,
            ..StoreOptions::default()
        },
    )
    .await
    .err()
    .expect("refused");
    assert!(format!("{err:#}").contains("has 4 shards"), "{err:#}");
}

/// Schedules task `id` due now on a store of one shard, claims it and finishes it done.
async fn done(s: &Store, id: &str) {
    s.schedule(&[task(id, 0)], ScheduleMode::Upsert)
        .await
        .unwrap();
    let b = s.claim(0, 1, 30_000).await.unwrap();
    s.finish(0, &[(key(id).as_str(), b.tasks[0].token, &Finish::Done)])
        .await
        .unwrap();
}

#[tokio::test]
async fn done_records_expire_after_the_retention_window() {
    let redis = RedisServer::start();
    let s = eggtimer_tests::store_keeping_done(&redis, 1, 200).await;
    done(&s, "d").await;
    assert_eq!(
        s.get(&key("d")).await.unwrap().unwrap().state,
        TaskState::Done
    );
    eventually(
        Duration::from_secs(5),
        "the done record to expire",
        || async { s.get(&key("d")).await.unwrap().is_none().then_some(()) },
    )
    .await;
    // the next finish on the shard deletes it (done records are not kept forever)
    let tasks = s.keys().shard(0).tasks;
    let kept: bool = redis::cmd("HEXISTS")
        .arg(&tasks)
        .arg(key("d"))
        .query(&mut redis.conn())
        .unwrap();
    assert!(kept, "past its window but not yet swept");
    done(&s, "e").await;
    let kept: bool = redis::cmd("HEXISTS")
        .arg(&tasks)
        .arg(key("d"))
        .query(&mut redis.conn())
        .unwrap();
    assert!(
        !kept,
        "a finish sweeps done records past the retention window"
    );
}

/// A store's clock is a handle a test can move: a done record kept a minute is hidden once the
/// clock is moved past that minute, without waiting for it, and shown again when moved back; a
/// store with a clock of its own on the same Redis is not moved.
#[tokio::test]
async fn a_moved_clock_hides_done_records_past_their_window_without_waiting() {
    let redis = RedisServer::start();
    let s = eggtimer_tests::store_keeping_done(&redis, 1, 60_000).await;
    let other = eggtimer_tests::store_keeping_done(&redis, 1, 60_000).await;
    done(&s, "d").await;
    let state = |st: &eggtimer::Store| {
        let st = st.clone();
        async move { st.get(&key("d")).await.unwrap().map(|r| r.state) }
    };
    assert_eq!(state(&s).await, Some(TaskState::Done));
    s.clock().advance(61_000);
    assert_eq!(state(&s).await, None, "past keep_done by the moved clock");
    assert_eq!(
        state(&other).await,
        Some(TaskState::Done),
        "another store's clock"
    );
    s.clock().advance(-61_000);
    assert_eq!(state(&s).await, Some(TaskState::Done));
}

/// Several schedulers and claimers hammer one shard; a model of the expected state checks that no
/// task is lost and none is claimed twice in one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_schedulers_and_claimers_never_lose_or_double_claim() {
    use rand::Rng;
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    const SCHEDULERS: usize = 4;
    const PER: usize = 500;
    let mut handles = Vec::new();
    for w in 0..SCHEDULERS {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            let mut cancelled = Vec::new();
            let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_os_rng();
            for i in 0..PER {
                let id = format!("w{w}-{i}");
                let due = now() + rng.random_range(0..200);
                s.schedule(&[task(&id, due)], ScheduleMode::Upsert)
                    .await
                    .unwrap();
                // sometimes move or cancel it again, racing the claimers
                let dice = rng.random_range(0..10);
                if dice == 0 && s.cancel(&id).await.unwrap().is_ok() {
                    cancelled.push(id);
                } else if dice == 1 {
                    let shift = Move::Shift(rng.random_range(-50..50));
                    let _ = s.move_task(&id, shift).await.unwrap();
                }
            }
            cancelled
        }));
    }
    let claimed = std::sync::Arc::new(std::sync::Mutex::new(HashMap::<String, Vec<u32>>::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut claimers = Vec::new();
    for c in 0..3 {
        let s = s.clone();
        let claimed = claimed.clone();
        let stop = stop.clone();
        claimers.push(tokio::spawn(async move {
            let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_os_rng();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let b = s.claim(0, rng.random_range(1..50), 30_000).await.unwrap();
                for t in &b.tasks {
                    claimed
                        .lock()
                        .unwrap()
                        .entry(t.id.clone())
                        .or_default()
                        .push(t.attempt);
                    // claimer 0 fails some first attempts, to exercise retries
                    let f = if c == 0 && t.attempt == 1 && rng.random_bool(0.2) {
                        Finish::Retry {
                            after_ms: 1,
                            error: "flaky".into(),
                        }
                    } else {
                        Finish::Done
                    };
                    let v = s.finish(0, &[(&t.id, t.token, &f)]).await.unwrap();
                    assert_ne!(
                        v[0],
                        Finished::Stale,
                        "{} attempt {} lost its lease",
                        t.id,
                        t.attempt
                    );
                }
                if b.tasks.is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        }));
    }
    let mut cancelled = HashSet::new();
    for h in handles {
        cancelled.extend(h.await.unwrap());
    }
    let expected = SCHEDULERS * PER - cancelled.len();
    eventually(Duration::from_secs(30), "every task to be done", || async {
        let done = claimed.lock().unwrap().len();
        let pending = s.shard_counts().await.unwrap()[0];
        (done == expected && pending == eggtimer::store::ShardCounts::default()).then_some(())
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in claimers {
        c.await.unwrap();
    }
    let claimed = claimed.lock().unwrap().clone();
    for (id, attempts) in claimed.iter() {
        assert!(!cancelled.contains(id), "{id} was cancelled but ran");
        let mut sorted = attempts.clone();
        sorted.dedup();
        assert_eq!(
            &sorted, attempts,
            "{id} claimed twice in one attempt: {attempts:?}"
        );
        assert_eq!(
            s.get(id).await.unwrap().unwrap().state,
            TaskState::Done,
            "{id}"
        );
    }
}

/// Every script loads into Redis as a function library (`FUNCTION LOAD`): each part's top level
/// runs at load, so a part that read a run's keys or arguments there would fail here, and so
/// would a script past Lua's limits (60 upvalues per function).
#[test]
fn every_script_loads_as_a_redis_function() {
    let redis = RedisServer::start();
    let mut c = redis.conn();
    let libraries = eggtimer::store::script_libraries();
    for (script, library) in &libraries {
        let loaded: redis::RedisResult<String> = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg(library)
            .query(&mut c);
        assert!(loaded.is_ok(), "{script}.lua: {loaded:?}");
    }
    let listed: Vec<redis::Value> = redis::cmd("FUNCTION").arg("LIST").query(&mut c).unwrap();
    assert_eq!(listed.len(), libraries.len());
}

/// A Redis that lost its functions (flushed, or restarted without persistence) gets each again
/// at its first call; one that can't load them (`FUNCTION LOAD` is refused while Redis is out of
/// memory) runs the scripts' text instead, so the runs already claimed still renew and finish.
#[tokio::test]
async fn scripts_run_where_redis_lost_its_functions_or_cannot_load_them() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    s.schedule(&[task("a", 0), task("b", 0)], ScheduleMode::Upsert)
        .await
        .unwrap();
    let mut c = redis.conn();
    let functions = |c: &mut redis::Connection| -> usize {
        let listed: Vec<redis::Value> = redis::cmd("FUNCTION").arg("LIST").query(c).unwrap();
        listed.len()
    };
    assert!(functions(&mut c) > 0, "the schedule ran as a function");
    let () = redis::cmd("FUNCTION").arg("FLUSH").query(&mut c).unwrap();
    let claimed = claim_when_due(&s, 0, 10, "both tasks").await;
    assert_eq!(claimed.tasks.len(), 2);
    assert_eq!(functions(&mut c), 1, "the claim's library was loaded again");

    // full: nothing may be added, FUNCTION LOAD included
    let () = redis::cmd("FUNCTION").arg("FLUSH").query(&mut c).unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query(&mut c)
        .unwrap();
    let refused: redis::RedisResult<String> = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&eggtimer::store::script_libraries()[0].1)
        .query(&mut c);
    assert!(
        refused.as_ref().is_err_and(|e| e.code() == Some("OOM")),
        "{refused:?}"
    );
    let (a, b) = (&claimed.tasks[0], &claimed.tasks[1]);
    assert_eq!(
        s.renew(0, &[(a.id.as_str(), a.token)], 30_000)
            .await
            .unwrap(),
        vec![true]
    );
    assert_eq!(
        s.finish(
            0,
            &[
                (a.id.as_str(), a.token, &Finish::Done),
                (b.id.as_str(), b.token, &Finish::Done)
            ]
        )
        .await
        .unwrap(),
        vec![Finished::Done; 2]
    );
    assert_eq!(functions(&mut c), 0, "nothing was loaded while full");
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .unwrap();
    assert!(
        stats.contains("cmdstat_eval:calls=2,"),
        "the renewal and the finish ran as EVAL: {stats}"
    );
}
