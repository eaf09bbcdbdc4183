//! The claim token fences every outcome: attempts that repeat, claims Redis lost, and renewals
//! that keep a slow task from being reaped, against a real redis-server (the other store scripts
//! are in `store.rs`).

use std::time::Duration;

use eggtimer::store::{Finish, Finished, ScheduleMode};
use eggtimer_tests::{RedisServer, claim_when_due, key, noop_task as task, store_on as store};

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
