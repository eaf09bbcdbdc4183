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
