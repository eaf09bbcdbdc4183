//! Each shard counts its plugins' scheduled tasks instead of listing them in the plugin index:
//! the counts follow every change of a task's state, and pausing and resuming walk `parked`
//! itself.

use std::collections::BTreeSet;

use eggtimer::Store;
use eggtimer::store::{
    DeadAction, FindQuery, Finish, Finished, Move, NewTask, ScheduleMode, TaskState, task_key,
};
use eggtimer_tests::{RedisServer, claim_when_due, find_all, noop_task, now_ms, store_on};

/// A task of `plugin`.
fn task(id: &str, plugin: &str, run_at: i64) -> NewTask {
    NewTask {
        plugin: plugin.into(),
        ..noop_task(id, run_at)
    }
}

/// (scheduled, dead) of each plugin, as the API reports them.
async fn counts(s: &Store, plugins: &[&str]) -> Vec<(u64, u64)> {
    let names: Vec<String> = plugins.iter().map(|p| p.to_string()).collect();
    s.plugin_counts(&names)
        .await
        .unwrap()
        .iter()
        .map(|c| (c.scheduled, c.dead))
        .collect()
}

#[tokio::test]
async fn per_plugin_counts_follow_every_change_of_state() {
    let redis = RedisServer::start();
    let s = store_on(&redis, 1).await;
    let far = now_ms() + 3_600_000;
    let mut tasks: Vec<NewTask> = (0..30).map(|i| task(&format!("a{i}"), "a", far)).collect();
    tasks.extend((0..20).map(|i| task(&format!("b{i}"), "b", 0)));
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    assert_eq!(
        counts(&s, &["a", "b", "c"]).await,
        [(30, 0), (20, 0), (0, 0)]
    );
    // a task of another plugin with one of a's ids is a task of its own (a task id belongs to
    // its plugin); moving a task changes nothing
    s.schedule(&[task("a0", "b", far)], ScheduleMode::Upsert)
        .await
        .unwrap();
    s.move_task(&task_key("a", "a1"), Move::Shift(5))
        .await
        .unwrap()
        .unwrap();
    s.cancel(&task_key("a", "a2")).await.unwrap().unwrap();
    assert_eq!(counts(&s, &["a", "b"]).await, [(29, 0), (21, 0)]);
    // claimed tasks are no longer scheduled; their outcomes put some back or bury them
    let b = claim_when_due(&s, 0, 100, "b's due tasks").await;
    assert_eq!(b.tasks.len(), 20);
    assert_eq!(counts(&s, &["a", "b"]).await, [(29, 0), (1, 0)]);
    let retry = Finish::Retry {
        after_ms: 3_600_000,
        error: "later".into(),
    };
    let dead = Finish::Dead { error: "no".into() };
    let outcomes: Vec<(&str, u64, &Finish)> = b
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let f = match i % 4 {
                0 => &retry,
                1 => &dead,
                _ => &Finish::Done,
            };
            (t.id.as_str(), t.token, f)
        })
        .collect();
    let verdicts = s.finish(0, &outcomes).await.unwrap();
    assert!(!verdicts.contains(&Finished::Stale), "{verdicts:?}");
    assert_eq!(counts(&s, &["a", "b"]).await, [(29, 0), (6, 5)]);
    // dead letters replayed are scheduled again
    assert_eq!(s.dead_all(DeadAction::Retry, Some("b")).await.unwrap(), 5);
    assert_eq!(counts(&s, &["a", "b"]).await, [(29, 0), (11, 0)]);
    // a claim whose runner dies: its tasks come back when the lease ends
    let c = s.claim(0, 100, 200).await.unwrap();
    assert_eq!(c.tasks.len(), 5, "the replayed dead letters are due");
    assert_eq!(counts(&s, &["a", "b"]).await, [(29, 0), (6, 0)]);
    claim_when_due(&s, 0, 100, "the reaped tasks").await;
    assert_eq!(counts(&s, &["a", "b"]).await, [(29, 0), (6, 0)]);
    // nothing is listed per task in the plugin index any more: only the dead
    let k = s.keys().shard(0);
    let listed: u64 = redis::cmd("ZCARD")
        .arg(&k.byplugin)
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(listed, 0);
    // and find by plugin reads the scheduled tasks from the due buckets in pages, each once
    let q = FindQuery {
        plugin: Some("a".into()),
        state: Some(TaskState::Scheduled),
        limit: 7,
        ..FindQuery::default()
    };
    let found = find_all(&s, &q).await;
    assert_eq!(found.len(), 29);
    assert_eq!(found.iter().collect::<BTreeSet<_>>().len(), 29, "{found:?}");
    assert!(found.iter().all(|id| id.starts_with('a')), "{found:?}");
}

/// Resume walks `parked`, which holds the parked tasks of every paused plugin, a chunk at a
/// time: it moves back exactly the resumed plugin's, and the other's stay parked.
#[tokio::test]
async fn resume_puts_back_only_its_plugins_parked_tasks_across_chunks() {
    let redis = RedisServer::start();
    let s = store_on(&redis, 1).await;
    s.set_paused("a", true).await.unwrap();
    s.set_paused("b", true).await.unwrap();
    // interleaved due times, and many at one instant (the walk's places share scores)
    let due = now_ms() - 1000;
    let tasks: Vec<NewTask> = (0..1500)
        .map(|i| {
            let plugin = if i % 3 == 0 { "a" } else { "b" };
            task(&format!("p{i:04}"), plugin, due + (i % 2))
        })
        .collect();
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    assert!(s.claim(0, 2000, 30_000).await.unwrap().tasks.is_empty());
    assert_eq!(counts(&s, &["a", "b"]).await, [(500, 0), (1000, 0)]);
    assert_eq!(s.set_paused("a", false).await.unwrap(), 500);
    assert_eq!(counts(&s, &["a", "b"]).await, [(500, 0), (1000, 0)]);
    let a = s.claim(0, 2000, 30_000).await.unwrap();
    assert_eq!(a.tasks.len(), 500);
    assert!(a.tasks.iter().all(|t| t.plugin == "a"));
    assert_eq!(counts(&s, &["a", "b"]).await, [(0, 0), (1000, 0)]);
    assert_eq!(s.set_paused("b", false).await.unwrap(), 1000);
    assert_eq!(s.claim(0, 2000, 30_000).await.unwrap().tasks.len(), 1000);
    assert_eq!(counts(&s, &["a", "b"]).await, [(0, 0), (0, 0)]);
}

/// A pause asked for while a long resume is still walking the shard wins: the resume's later
/// chunks do not unmark the plugin again, so the settings and the shard both say paused, and no
/// task of it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_during_a_long_resume_is_not_undone_by_it() {
    let redis = RedisServer::start();
    let s = store_on(&redis, 1).await;
    s.set_paused("a", true).await.unwrap();
    let due = now_ms() - 1000;
    let n = 60_000;
    let tasks: Vec<NewTask> = (0..n)
        .map(|i| task(&format!("p{i:05}"), "a", due))
        .collect();
    for chunk in tasks.chunks(10_000) {
        s.schedule(chunk, ScheduleMode::Upsert).await.unwrap();
    }
    assert!(
        s.claim(0, n, 30_000).await.unwrap().tasks.is_empty(),
        "all parked"
    );
    let parked_key = s.keys().shard(0).parked;
    let resume = tokio::spawn({
        let s = s.clone();
        async move { s.set_paused("a", false).await.unwrap() }
    });
    // the resume is under way (some chunks moved back, not all): pause again
    let mut c = redis.conn();
    loop {
        let left: usize = redis::cmd("ZCARD").arg(&parked_key).query(&mut c).unwrap();
        if left < n {
            assert!(left > 0, "the resume ended before the pause was asked for");
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    s.set_paused("a", true).await.unwrap();
    resume.await.unwrap();
    assert!(s.plugin_settings("a").await.unwrap().paused);
    let claimed = s.claim(0, n, 30_000).await.unwrap().tasks;
    assert!(
        claimed.is_empty(),
        "{} tasks of a paused plugin were claimed",
        claimed.len()
    );
    // and a resume afterwards puts every one of them back: all run
    let parked: usize = redis::cmd("ZCARD").arg(&parked_key).query(&mut c).unwrap();
    assert_eq!(s.set_paused("a", false).await.unwrap() as usize, parked);
    // (a claim takes about 1 MiB of records: several claims)
    let mut claimed = std::collections::HashSet::new();
    loop {
        let tasks = s.claim(0, n, 30_000).await.unwrap().tasks;
        if tasks.is_empty() {
            break;
        }
        for t in tasks {
            assert!(claimed.insert(t.id), "a task claimed twice");
        }
    }
    assert_eq!(claimed.len(), n);
}
