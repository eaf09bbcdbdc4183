//! The owner index against a real redis-server: an owner-wide shift moves exactly that owner's
//! tasks, a large owner is shifted in chunks (each task once), and a shift that would leave the
//! time range moves nothing.

use eggtimer::store::{Move, NewTask, Refused, ScheduleMode};
use eggtimer_tests::{RedisServer, key, noop_task as task, store_on as store};

fn now() -> i64 {
    eggtimer::clock::system_ms()
}

#[tokio::test]
async fn owner_shift_moves_exactly_that_owners_tasks() {
    let redis = RedisServer::start();
    let s = store(&redis, 4).await;
    let base = now() + 10_000_000;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let mut t = task(&format!("t{i}"), base + i);
        t.owner = Some(if i % 2 == 0 { "alice" } else { "bob" }.into());
        if i % 4 == 0 {
            t.plugin = "auto-feed".into();
        }
        tasks.push(t);
    }
    // "ali" is a prefix of "alice": it must not match
    let mut t = task("prefix", base);
    t.owner = Some("ali".into());
    tasks.push(t);
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    assert_eq!(
        s.shift_owner("alice", -7_200_000, Some("auto-feed"))
            .await
            .unwrap(),
        Ok(5)
    );
    assert_eq!(s.shift_owner("alice", 1000, None).await.unwrap(), Ok(10));
    for i in 0..20i64 {
        let plugin = if i % 4 == 0 { "auto-feed" } else { "noop" };
        let t = s
            .get(&eggtimer::store::task_key(plugin, &format!("t{i}")))
            .await
            .unwrap()
            .unwrap();
        let want = match (i % 2 == 0, i % 4 == 0) {
            (true, true) => base + i - 7_200_000 + 1000,
            (true, false) => base + i + 1000,
            _ => base + i,
        };
        assert_eq!(t.run_at, want, "t{i}");
    }
    assert_eq!(s.get(&key("prefix")).await.unwrap().unwrap().run_at, base);
    let alice = s.owner_tasks("alice", 1000, None).await.unwrap().0;
    assert_eq!(alice.len(), 10);
    assert!(
        alice.windows(2).all(|w| w[0].run_at <= w[1].run_at),
        "soonest first"
    );
    assert_eq!(s.owner_tasks("ali", 1000, None).await.unwrap().0.len(), 1);
}

#[tokio::test]
async fn a_large_owner_is_shifted_in_chunks_each_task_exactly_once_and_pages_see_each_once() {
    let redis = RedisServer::start();
    let s = store(&redis, 2).await;
    let n = eggtimer::store::OWNER_CHUNK * 5 + 17; // several chunks per shard
    let base = now() + 10_000_000;
    let tasks: Vec<NewTask> = (0..n)
        .map(|i| {
            let mut t = task(&format!("big{i}"), base + i as i64);
            t.owner = Some("big".into());
            t
        })
        .collect();
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    for shift in [3_000i64, -5_000] {
        assert_eq!(
            s.shift_owner("big", shift, None).await.unwrap(),
            Ok(n as u64)
        );
    }
    for i in 0..n {
        let t = s.get(&key(&format!("big{i}"))).await.unwrap().unwrap();
        assert_eq!(
            t.run_at,
            base + i as i64 - 2_000,
            "big{i} shifted once each way"
        );
    }
    // pages of 100 see every task exactly once, in due order
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let (page, next) = s.owner_tasks("big", 100, cursor).await.unwrap();
        seen.extend(page.into_iter().map(|t| (t.run_at, t.id)));
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen.len(), n);
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "in due order, no repeats"
    );
}

#[tokio::test]
async fn a_shift_that_would_leave_the_time_range_moves_nothing() {
    let redis = RedisServer::start();
    let s = store(&redis, 4).await;
    let mut a = task("early", 1_000);
    a.owner = Some("o".into());
    let mut b = task("late", now() + 60_000);
    b.owner = Some("o".into());
    s.schedule(&[a, b], ScheduleMode::Upsert).await.unwrap();
    assert_eq!(
        s.shift_owner("o", -2_000, None).await.unwrap(),
        Err(Refused::OutOfRange)
    );
    assert_eq!(
        s.move_task(&key("early"), Move::Shift(-2_000))
            .await
            .unwrap(),
        Err(Refused::OutOfRange)
    );
    assert_eq!(s.get(&key("early")).await.unwrap().unwrap().run_at, 1_000);
    assert_eq!(
        s.move_task(&key("late"), Move::Shift(eggtimer::limits::MAX_TIME_MS))
            .await
            .unwrap(),
        Err(Refused::OutOfRange)
    );
}

/// Two shifts of one owner at once, in opposite directions, over more tasks than one chunk: each
/// task moves by the sum of the two, none twice and none left out (the walks would cross: the
/// shift up moves tasks the shift down walked past back into its way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_shifts_of_one_owner_each_move_every_task_once() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    let base = now() + 3_600_000;
    let tasks: Vec<NewTask> = (0..2000)
        .map(|i| NewTask {
            owner: Some("u1".into()),
            ..task(&format!("t{i:04}"), base + i)
        })
        .collect();
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    let (up, down) = tokio::join!(
        s.shift_owner("u1", 5000, None),
        s.shift_owner("u1", -1, None)
    );
    assert_eq!(up.unwrap().unwrap(), 2000);
    assert_eq!(down.unwrap().unwrap(), 2000);
    for (i, t) in tasks.iter().enumerate() {
        let got = s.get(&key(&t.id)).await.unwrap().unwrap().run_at;
        assert_eq!(got, base + i as i64 + 4999, "{}", t.id);
    }
}

/// `Store::owner_counts`: an owner's scheduled (paused ones too), running and dead tasks per
/// plugin, every shard walked in pieces (more scheduled and dead tasks per shard than one script
/// call walks), nothing of another owner counted (a prefix of the name either).
#[tokio::test]
async fn an_owners_counts_per_plugin_and_state_walk_every_shard_in_pieces() {
    use eggtimer::store::{Finish, PluginCounts};
    let redis = RedisServer::start();
    let s = store(&redis, 4).await;
    let (far, past) = (now() + 10_000_000, now() - 1_000);
    let owned = |id: String, plugin: &str, owner: &str, at: i64| {
        let mut t = task(&id, at);
        t.plugin = plugin.into();
        t.owner = Some(owner.into());
        t
    };
    // alice's auto-feed tasks are paused: parked, still scheduled
    s.set_owner_paused("alice", Some("auto-feed"), true)
        .await
        .unwrap();
    let mut tasks: Vec<_> = (0..9_000)
        .map(|i| owned(format!("s{i}"), "noop", "alice", far + i))
        .collect();
    tasks.extend((0..3).map(|i| owned(format!("a{i}"), "auto-feed", "alice", far)));
    tasks.extend((0..1_000).map(|i| owned(format!("d{i}"), "noop", "alice", past)));
    tasks.extend((0..4).map(|i| owned(format!("r{i}"), "noop", "alice", past)));
    tasks.extend((0..5).map(|i| owned(format!("b{i}"), "noop", "bob", past)));
    tasks.push(owned("p".into(), "noop", "ali", far));
    for chunk in tasks.chunks(1_000) {
        s.schedule(chunk, ScheduleMode::Upsert).await.unwrap();
    }
    // every due task claimed; alice's d* die, the others keep running
    let mut running = Vec::new();
    for shard in 0..4 {
        loop {
            let b = s.claim(shard, 256, 600_000).await.unwrap();
            if b.tasks.is_empty() {
                break;
            }
            let dead = Finish::Dead { error: "x".into() };
            let die: Vec<_> = b
                .tasks
                .iter()
                .filter(|t| t.task_id().starts_with('d'))
                .map(|t| (t.id.as_str(), t.token, &dead))
                .collect();
            s.finish(shard, &die).await.unwrap();
            running.extend(
                b.tasks
                    .into_iter()
                    .filter(|t| !t.task_id().starts_with('d')),
            );
        }
    }
    assert_eq!(running.len(), 9);
    let counts = |plugin: &str, scheduled, running, dead| PluginCounts {
        plugin: plugin.into(),
        scheduled,
        running,
        dead,
    };
    assert_eq!(
        s.owner_counts("alice").await.unwrap(),
        vec![
            counts("auto-feed", 3, 0, 0),
            counts("noop", 9_000, 4, 1_000)
        ]
    );
    assert_eq!(
        s.owner_counts("bob").await.unwrap(),
        vec![counts("noop", 0, 5, 0)]
    );
    assert_eq!(
        s.owner_counts("ali").await.unwrap(),
        vec![counts("noop", 1, 0, 0)]
    );
    assert_eq!(s.owner_counts("nobody").await.unwrap(), vec![]);
    // a finished run counts no more
    let done = Finish::Done;
    for t in &running {
        s.finish(t.shard, &[(t.id.as_str(), t.token, &done)])
            .await
            .unwrap();
    }
    assert_eq!(s.owner_counts("bob").await.unwrap(), vec![]);
}

/// `Store::owner_backlog` (the metrics per owner): the owners with tasks due and not started,
/// most first, counted over every shard; tasks not yet due and tasks claimed are not.
#[tokio::test]
async fn the_owners_due_backlog_counts_due_tasks_not_started_most_first() {
    let redis = RedisServer::start();
    let s = store(&redis, 4).await;
    let (far, past) = (now() + 10_000_000, now() - 1_000);
    let owned = |id: String, owner: &str, at: i64| {
        let mut t = task(&id, at);
        t.owner = Some(owner.into());
        t
    };
    let mut tasks: Vec<_> = (0..50).map(|i| owned(format!("a{i}"), "a", past)).collect();
    tasks.extend((0..5).map(|i| owned(format!("b{i}"), "b", past - i)));
    tasks.extend((0..7).map(|i| owned(format!("c{i}"), "c", far)));
    tasks.extend((0..3).map(|i| task(&format!("n{i}"), past)));
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    assert_eq!(
        s.owner_backlog().await.unwrap(),
        vec![("a".to_owned(), 50), ("b".to_owned(), 5)]
    );
    for shard in 0..4 {
        while !s.claim(shard, 256, 600_000).await.unwrap().tasks.is_empty() {}
    }
    assert_eq!(s.owner_backlog().await.unwrap(), vec![]);
}

/// Owned tasks of a build before the owners' heads (0.2.0) get them from the backfill a runner
/// starts with: each owner's earliest task per plugin in a due bucket (a paused owner's parked
/// tasks not), once per shard (a second backfill finds every shard done).
#[tokio::test]
async fn the_backfill_gives_an_earlier_builds_owned_tasks_their_heads_once() {
    let redis = RedisServer::start();
    let s = store(&redis, 2).await;
    let at = now() + 10_000_000;
    s.set_owner_paused("carol", None, true).await.unwrap();
    let mut tasks = Vec::new();
    for (owner, plugin, n) in [
        ("a", "noop", 700),
        ("a", "auto-feed", 3),
        ("b", "noop", 2),
        ("carol", "noop", 4),
    ] {
        for i in 0..n {
            let mut t = task(&format!("{owner}-{plugin}-{i}"), at + 10 * i as i64);
            t.plugin = plugin.into();
            t.owner = Some(owner.into());
            tasks.push(t);
        }
    }
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    let mut c = redis.conn();
    let heads = |c: &mut redis::Connection| -> Vec<(String, i64)> {
        let mut all: Vec<(String, i64)> = (0..2)
            .flat_map(|shard| {
                let key = format!("{}:due", s.keys().shard(shard).byowner);
                redis::cmd("ZRANGE")
                    .arg(key)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query::<Vec<(String, i64)>>(c)
                    .unwrap()
            })
            .collect();
        all.sort();
        all
    };
    let written = heads(&mut c);
    assert!(written.iter().any(|(w, _)| w == "noop\0a"), "{written:?}");
    // as 0.2.0 left them: no heads, no mark
    for shard in 0..2 {
        let k = s.keys().shard(shard);
        let _: () = redis::cmd("DEL")
            .arg(format!("{}:due", k.byowner))
            .query(&mut c)
            .unwrap();
        let _: () = redis::cmd("HDEL")
            .arg(&k.meta)
            .arg("owner-heads")
            .query(&mut c)
            .unwrap();
    }
    assert_eq!(heads(&mut c), vec![]);
    let lowered = s.backfill_owner_heads().await.unwrap();
    assert_eq!(
        heads(&mut c),
        written,
        "the heads a schedule writes, carol's parked ones none"
    );
    assert!(
        written.iter().all(|(w, _)| !w.ends_with("carol")),
        "{written:?}"
    );
    // a and auto-feed, a and noop, b and noop: once per shard holding some of them
    assert!((3..=6).contains(&lowered), "{lowered}");
    assert_eq!(
        s.backfill_owner_heads().await.unwrap(),
        0,
        "every shard marked done"
    );
}
