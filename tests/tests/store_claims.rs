//! The claim token fences every outcome: attempts that repeat, claims Redis lost, and renewals
//! that keep a slow task from being reaped, against a real redis-server (the other store scripts
//! are in `store.rs`).

use std::time::Duration;

use eggtimer::store::{Finish, Finished, ScheduleMode, Share};
use eggtimer_tests::{
    RedisServer, claim_when_due, key, noop_task as task, now_ms, store_on as store,
};

#[tokio::test]
async fn a_claim_is_fenced_by_its_token_even_when_attempts_repeat() {
    // run-again resets attempts to 0, so the next claim is attempt 1 again: only the token tells
    // the two claims apart.
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    s.schedule(&[task("a", 0)], ScheduleMode::Upsert)
        .await
        .unwrap();
    let first = s.claim(0, 10, 30_000).await.unwrap().tasks.remove(0);
    let again = Finish::Again { at: 0 };
    assert_eq!(
        s.finish(0, &[(key("a").as_str(), first.token, &again)])
            .await
            .unwrap(),
        vec![Finished::Again]
    );
    let second = s.claim(0, 10, 30_000).await.unwrap().tasks.remove(0);
    assert_eq!((first.attempt, second.attempt), (1, 1));
    assert_ne!(first.token, second.token);
    assert!(
        second.created >= first.created,
        "run-again starts a new occurrence"
    );
    assert_eq!(
        s.renew(
            0,
            &[
                (key("a").as_str(), first.token),
                (key("a").as_str(), second.token)
            ],
            30_000
        )
        .await
        .unwrap(),
        vec![false, true]
    );
    assert_eq!(
        s.finish(0, &[(key("a").as_str(), first.token, &Finish::Done)])
            .await
            .unwrap(),
        vec![Finished::Stale],
        "the first claim's late outcome is refused"
    );
    assert_eq!(
        s.finish(0, &[(key("a").as_str(), second.token, &Finish::Done)])
            .await
            .unwrap(),
        vec![Finished::Done]
    );
}

/// Redis loses the writes of a claim (an AOF `everysec` restart, a failover before the replica
/// had them) while the claim's runner still runs the task: the claim made after the loss gets
/// another token, so the first runner's outcome is refused and only the second's counts.
#[tokio::test]
async fn a_claim_after_redis_lost_writes_never_repeats_a_live_claims_token() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    s.schedule(&[task("a", 0)], ScheduleMode::Upsert)
        .await
        .unwrap();
    // the shard as it was before the claim: what Redis will "lose" is everything after it
    let mut c = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("{eggtimer:0}*")
        .query(&mut c)
        .unwrap();
    let before: Vec<(String, Vec<u8>)> = keys
        .iter()
        .map(|k| (k.clone(), redis::cmd("DUMP").arg(k).query(&mut c).unwrap()))
        .collect();
    let lost = claim_when_due(&s, 0, 10, "a to be due")
        .await
        .tasks
        .remove(0);
    // the loss: the shard's keys back as they were (time goes on, as it does across a restart)
    let now: Vec<String> = redis::cmd("KEYS")
        .arg("{eggtimer:0}*")
        .query(&mut c)
        .unwrap();
    for k in now {
        let _: () = redis::cmd("DEL").arg(k).query(&mut c).unwrap();
    }
    for (k, dump) in &before {
        let _: () = redis::cmd("RESTORE")
            .arg(k)
            .arg(0)
            .arg(dump)
            .query(&mut c)
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(5));
    let again = s.claim(0, 10, 30_000).await.unwrap().tasks.remove(0);
    assert_eq!(again.id, key("a"));
    assert_ne!(again.token, lost.token, "a token repeated after the loss");
    assert_eq!(
        s.finish(0, &[(key("a").as_str(), lost.token, &Finish::Done)])
            .await
            .unwrap(),
        vec![Finished::Stale],
        "the lost claim's outcome is refused"
    );
    assert_eq!(
        s.finish(0, &[(key("a").as_str(), again.token, &Finish::Done)])
            .await
            .unwrap(),
        vec![Finished::Done]
    );
}

#[tokio::test]
async fn renewing_keeps_a_slow_task_from_being_reaped() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    s.schedule(&[task("slow", 0)], ScheduleMode::Upsert)
        .await
        .unwrap();
    let t = s.claim(0, 10, 300).await.unwrap().tasks.remove(0);
    // renew for well over the original lease; another claimer never gets the task
    let until = std::time::Instant::now() + Duration::from_millis(1200);
    while std::time::Instant::now() < until {
        assert_eq!(
            s.renew(0, &[(key("slow").as_str(), t.token)], 300)
                .await
                .unwrap(),
            vec![true]
        );
        assert!(s.claim(0, 10, 300).await.unwrap().tasks.is_empty());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        s.finish(0, &[(key("slow").as_str(), t.token, &Finish::Done)])
            .await
            .unwrap(),
        vec![Finished::Done]
    );
}

/// A claim for a runner one plugin crowds walks past its size, setting aside what it does not
/// take, only where another plugin may have tasks due: another plugin's tasks a day away cost a
/// burst nothing, and the claim says when the first of them may fall due. A plugin whose tasks
/// were written without a head (the data of a build that kept none) counts as due.
#[tokio::test]
async fn a_crowded_claim_sets_aside_nothing_for_another_plugins_later_tasks() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    let k = s.keys().shard(0);
    let burst: Vec<_> = (0..2_000).map(|i| task(&format!("b{i}"), 0)).collect();
    s.schedule(&burst, ScheduleMode::Upsert).await.unwrap();
    let day = eggtimer_tests::now_ms() + 86_400_000;
    let later: Vec<_> = (0..10)
        .map(|i| eggtimer::store::NewTask {
            plugin: "coupon-expiry".into(),
            ..task(&format!("c{i}"), day + i)
        })
        .collect();
    s.schedule(&later, ScheduleMode::Upsert).await.unwrap();
    let head = |plugin: &str| -> Option<i64> {
        redis::cmd("HGET")
            .arg(&k.meta)
            .arg(format!("hd:{plugin}"))
            .query(&mut redis.conn())
            .unwrap()
    };
    assert_eq!((head("noop"), head("coupon-expiry")), (Some(0), Some(day)));
    // the runner holds 100 `noop` tasks: it crowds; the claim may walk 512 past its size
    let crowded = |headroom| Share {
        held: vec![("noop".into(), 100, 1)],
        headroom,
        part: 10,
        extra: 512,
        ..Default::default()
    };
    let b = s.claim_shared(0, 50, 30_000, &crowded(0)).await.unwrap();
    assert_eq!((b.tasks.len(), b.set_aside), (50, 0));
    assert!(!b.others_here, "no plugin under its part has a task due");
    assert_eq!(b.others_due, Some(day), "when the coupons may fall due");
    // with 8 of its places headroom, the crowding plugin takes the 42 others and nothing waits
    let b = s.claim_shared(0, 50, 30_000, &crowded(8)).await.unwrap();
    assert_eq!((b.tasks.len(), b.set_aside, b.waiting), (42, 0, false));
    // without the coupons' head they may be due: the claim walks and sets aside as before
    let _: i64 = redis::cmd("HDEL")
        .arg(&k.meta)
        .arg("hd:coupon-expiry")
        .query(&mut redis.conn())
        .unwrap();
    let b = s.claim_shared(0, 50, 30_000, &crowded(0)).await.unwrap();
    assert_eq!((b.tasks.len(), b.set_aside), (50, 512));
    assert!(b.others_here);
    // a plugin's head goes with its last scheduled task and is exact for its next one
    let mut left = 2_000 - 50 - 42 - 50;
    while left > 0 {
        let got = s.claim(0, 1_000, 30_000).await.unwrap().tasks.len();
        assert!(got > 0, "{left} noop tasks left that no claim takes");
        left -= got;
    }
    assert_eq!(head("noop"), None);
    s.schedule(&[task("n", day + 5)], ScheduleMode::Upsert)
        .await
        .unwrap();
    s.schedule(&[task("m", day + 3)], ScheduleMode::Upsert)
        .await
        .unwrap();
    assert_eq!(head("noop"), Some(day + 3));
}

/// A claim takes at most 512 KiB of records past its first task: 200 tasks of 60 KB due at once
/// are claimed 8 at a time (a claim of 256 copied 15 MB in one call, 40 ms of Redis), in due
/// order, each once; what a claim leaves is due at once (its answer's next due time is now or
/// earlier), and a task larger than the bound is still claimed, alone.
#[tokio::test]
async fn a_claim_takes_at_most_half_a_mebibyte_of_records() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    let pad = "x".repeat(60_000);
    let tasks: Vec<_> = (0..200)
        .map(|i| eggtimer::store::NewTask {
            payload: format!("{{\"i\":{i},\"pad\":\"{pad}\"}}"),
            ..task(&format!("big-{i:03}"), i)
        })
        .collect();
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    let mut claimed = Vec::new();
    for _ in 0..40 {
        let b = s.claim(0, 256, 30_000).await.unwrap();
        if b.tasks.is_empty() {
            break;
        }
        assert!(b.tasks.len() <= 9, "one claim took {} tasks", b.tasks.len());
        if claimed.len() + b.tasks.len() < 200 {
            assert!(
                b.next_due.is_some_and(|d| d <= b.now),
                "tasks left due, next due {:?} at {}",
                b.next_due,
                b.now
            );
        }
        claimed.extend(b.tasks.into_iter().map(|t| t.id));
    }
    let want: Vec<String> = (0..200).map(|i| key(&format!("big-{i:03}"))).collect();
    assert_eq!(claimed, want, "every task once, in due order");
    // one task past the bound is claimed all the same
    let huge = eggtimer::store::NewTask {
        payload: format!("\"{}\"", "y".repeat(1_100_000)),
        ..task("huge", 0)
    };
    s.schedule(&[huge], ScheduleMode::Upsert).await.unwrap();
    let b = claim_when_due(&s, 0, 256, "the huge task").await;
    assert_eq!(b.tasks.len(), 1);
}

/// A claim that walks past its size for fair share reads about 512 KiB of records, each plugin's
/// next in turn, and sets aside the walked tasks it did not read (a walk of 562 among 60 KB
/// records read 34 MB in one call, ~100 ms of Redis): the other plugin's 5 tasks, walked among
/// 600 of the crowding plugin's, are read and taken by the first claim; the crowding plugin's
/// unread ones wait, and every task is claimed once in the end.
#[tokio::test]
async fn a_claims_walk_for_fair_share_reads_a_bounded_share_of_large_records() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    let pad = "x".repeat(60_000);
    let mut tasks: Vec<_> = (0..600)
        .map(|i| eggtimer::store::NewTask {
            payload: format!("{{\"i\":{i},\"pad\":\"{pad}\"}}"),
            ..task(&format!("big-{i:03}"), i)
        })
        .collect();
    tasks.extend((0..5).map(|i| eggtimer::store::NewTask {
        plugin: "coupon-expiry".into(),
        ..task(&format!("small-{i}"), 300 + i)
    }));
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    let crowded = Share {
        held: vec![("noop".into(), 100, 1)],
        part: 10,
        extra: 512,
        ..Default::default()
    };
    let b = s.claim_shared(0, 50, 30_000, &crowded).await.unwrap();
    let small = b
        .tasks
        .iter()
        .filter(|t| t.plugin == "coupon-expiry")
        .count();
    assert_eq!(
        small, 5,
        "the other plugin's tasks are read and taken first"
    );
    assert!(b.tasks.len() <= 5 + 9, "{} tasks taken", b.tasks.len());
    assert!(b.waiting, "the crowding plugin's walked tasks wait");
    assert!(
        b.set_aside >= 500,
        "walked and not read: set aside ({})",
        b.set_aside
    );
    let mut claimed: Vec<String> = b.tasks.into_iter().map(|t| t.id).collect();
    for _ in 0..200 {
        let b = s.claim(0, 256, 30_000).await.unwrap();
        if b.tasks.is_empty() && !b.waiting {
            break;
        }
        claimed.extend(b.tasks.into_iter().map(|t| t.id));
    }
    claimed.sort();
    let mut want: Vec<String> = (0..600).map(|i| key(&format!("big-{i:03}"))).collect();
    want.extend((0..5).map(|i| eggtimer::store::task_key("coupon-expiry", &format!("small-{i}"))));
    want.sort();
    assert_eq!(claimed, want, "every task once");
}

/// What a claim takes and does not read goes back by what its walk noted: 120 tasks of 60 KB,
/// half of priority 5, all late (by less than the priority's aging), are claimed 8 or so at a
/// time, each once, every priority-5 task before any of priority 0 (the put-back keeps their
/// place in the priority index); the same tasks of two owners (so owners take turns: priority
/// orders each owner's turn) go each owner's priority-5 tasks first, and leave no owner's head
/// behind.
#[tokio::test]
async fn large_records_a_claim_does_not_read_go_back_with_their_priority_and_owner() {
    for owned in [false, true] {
        let redis = RedisServer::start();
        let s = store(&redis, 1).await;
        let pad = "x".repeat(60_000);
        let late = now_ms() - 5_000;
        let owner = |i: usize| if i.is_multiple_of(2) { "a" } else { "b" };
        let high = |i: usize| i % 4 < 2;
        let tasks: Vec<_> = (0..120)
            .map(|i| eggtimer::store::NewTask {
                payload: format!("{{\"i\":{i},\"pad\":\"{pad}\"}}"),
                owner: owned.then(|| owner(i).into()),
                priority: if high(i) { 5 } else { 0 },
                ..task(&format!("big-{i:03}"), late + i as i64)
            })
            .collect();
        s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
        let mut order: Vec<usize> = Vec::new();
        for _ in 0..60 {
            let b = s.claim(0, 256, 30_000).await.unwrap();
            if b.tasks.is_empty() && !b.waiting {
                break;
            }
            assert!(b.tasks.len() <= 9, "one claim took {} tasks", b.tasks.len());
            order.extend(
                b.tasks
                    .iter()
                    .map(|t| t.id.rsplit('-').next().unwrap().parse::<usize>().unwrap()),
            );
        }
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, (0..120).collect::<Vec<_>>(), "every task once");
        let groups: Vec<Vec<usize>> = if owned {
            ["a", "b"]
                .iter()
                .map(|o| order.iter().copied().filter(|&i| owner(i) == *o).collect())
                .collect()
        } else {
            vec![order.clone()]
        };
        for g in groups {
            let last_high = g.iter().rposition(|&i| high(i)).unwrap();
            let first_low = g.iter().position(|&i| !high(i)).unwrap();
            assert!(
                last_high < first_low,
                "priority-5 tasks before those of priority 0 (owners: {owned}): {g:?}"
            );
        }
        let heads: i64 = redis::cmd("ZCARD")
            .arg(format!("{}:due", s.keys().shard(0).byowner))
            .query(&mut redis.conn())
            .unwrap();
        assert_eq!(heads, 0, "no owner's head left behind");
    }
}

/// Owners take turns: one owner's backlog of due tasks does not hold another owner's due tasks
/// behind it, a paused owner's tasks are not taken by a turn, and every task is claimed once.
#[tokio::test]
async fn owners_take_turns_so_one_owners_backlog_does_not_hold_up_anothers() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    let base = eggtimer::clock::system_ms() - 60_000;
    // 3,000 tasks of "big" due at one instant, then 20 of "small" due 1 ms later (behind all of
    // big's in due order), 10 of "paused" and 10 without an owner, due 2 ms later
    let mut tasks = Vec::new();
    let mut add = |id: String, due: i64, owner: Option<&str>| {
        let mut t = task(&id, due);
        t.owner = owner.map(Into::into);
        tasks.push(t);
    };
    for i in 0..3_000 {
        add(format!("big-{i}"), base, Some("big"));
    }
    for i in 0..20 {
        add(format!("small-{i}"), base + 1, Some("small"));
    }
    for i in 0..10 {
        add(format!("paused-{i}"), base + 2, Some("paused"));
        add(format!("none-{i}"), base + 2, None);
    }
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    assert_eq!(s.set_owner_paused("paused", None, true).await.unwrap(), 0);
    // claims of 16, as a busy runner makes them: small's come in the first claims
    let mut order: Vec<String> = Vec::new();
    loop {
        let batch = s.claim(0, 16, 30_000).await.unwrap();
        if batch.tasks.is_empty() {
            break;
        }
        order.extend(batch.tasks.iter().map(|t| t.task_id().to_owned()));
    }
    let last_small = order
        .iter()
        .rposition(|id| id.starts_with("small-"))
        .expect("small's tasks claimed");
    eprintln!(
        "small's last task was claimed {}th of {}",
        last_small + 1,
        order.len()
    );
    // in due order it would be 3,020th; in turns (big, small, the due order) small takes up to
    // 5 of each claim of 16
    assert!(
        last_small < 16 * 6,
        "small waited for big's backlog: {last_small}"
    );
    let mut unique = order.clone();
    unique.sort();
    unique.dedup();
    assert_eq!((order.len(), unique.len()), (3_030, 3_030), "each once");
    assert!(
        !order.iter().any(|id| id.starts_with("paused-")),
        "a paused owner's task was taken"
    );
    // resumed, the paused owner's tasks are claimed, once
    assert_eq!(s.set_owner_paused("paused", None, false).await.unwrap(), 10);
    let batch = s.claim(0, 16, 30_000).await.unwrap();
    let mut ids: Vec<String> = batch.tasks.iter().map(|t| t.task_id().to_owned()).collect();
    ids.sort();
    let mut want: Vec<String> = (0..10).map(|i| format!("paused-{i}")).collect();
    want.sort();
    assert_eq!(ids, want);
}

/// An owner's weight is its share of a claim's places against the other owners taking turns.
#[tokio::test]
async fn an_owners_weight_is_its_share_of_a_claims_places() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    let base = eggtimer::clock::system_ms() - 60_000;
    let mut tasks = Vec::new();
    for owner in ["a", "b"] {
        for i in 0..200 {
            let mut t = task(&format!("{owner}-{i}"), base);
            t.owner = Some(owner.into());
            tasks.push(t);
        }
    }
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    let count = |batch: &eggtimer::store::ClaimBatch, owner: &str| {
        batch
            .tasks
            .iter()
            .filter(|t| t.task_id().starts_with(&format!("{owner}-")))
            .count()
    };
    // equal: each owner's turn is a third of the places (the due order's turn the rest)
    let batch = s.claim(0, 30, 30_000).await.unwrap();
    let (a, b) = (count(&batch, "a"), count(&batch, "b"));
    assert!(a >= 10 && b >= 10 && a + b == 30, "a {a}, b {b}");
    // a at 4: four places of a's for each of b's turn's and the due order's
    s.set_owner_weight("noop", "a", Some(4)).await.unwrap();
    assert_eq!(s.owner_weight("noop", "a").await.unwrap(), Some(4));
    let batch = s.claim(0, 30, 30_000).await.unwrap();
    let (a, b) = (count(&batch, "a"), count(&batch, "b"));
    assert!(a >= 20 && a + b == 30, "a {a}, b {b}");
    s.set_owner_weight("noop", "a", None).await.unwrap();
    assert_eq!(s.owner_weight("noop", "a").await.unwrap(), None);
}

/// A claim ahead takes the tasks falling due within its window (by Redis's clock, which its
/// answer carries), none later, and leaves none of the window behind; the window is at most a
/// second whatever the runner asks.
#[tokio::test]
async fn a_claim_ahead_takes_what_falls_due_within_its_window_and_nothing_later() {
    let redis = RedisServer::start();
    let s = store(&redis, 1).await;
    let t = now_ms();
    let tasks = [
        task("a", t + 1500),
        task("b", t + 1800),
        task("c", t + 600_000),
    ];
    s.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    let ahead = |ahead_ms| Share {
        ahead_ms,
        ..Default::default()
    };
    let now = s.claim_shared(0, 10, 30_000, &ahead(0)).await.unwrap();
    assert!(now.tasks.is_empty(), "nothing is due yet: {:?}", now.tasks);
    let mut claimed = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while claimed.len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "a and b claimed ahead within 10 s: {claimed:?}"
        );
        // asking for a minute ahead gets a second at most
        let b = s.claim_shared(0, 10, 30_000, &ahead(60_000)).await.unwrap();
        for task in &b.tasks {
            assert!(
                task.due <= b.now + 1000,
                "{} claimed {} ms ahead",
                task.id,
                task.due - b.now
            );
        }
        if let Some(next) = b.next_due {
            assert!(
                next > b.now + 1000,
                "a task due within the window was left: {next} at {}",
                b.now
            );
        }
        claimed.extend(b.tasks.into_iter().map(|task| (task.id, task.due > b.now)));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ids: Vec<&str> = claimed.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, [key("a"), key("b")]);
    assert!(
        claimed.iter().all(|&(_, ahead)| ahead),
        "each was claimed before its due time: {claimed:?}"
    );
}
