//! The `finished` log (a shard's done tasks, one entry per finish script) as this build and the
//! previous main write it.

use std::time::Duration;

use eggtimer::store::{Finish, Finished, ScheduleMode, TaskState};
use eggtimer_tests::{RedisServer, claim_when_due, eventually, found_ids, script_at};
use eggtimer_tests::{noop_task as task, now_ms as now};

/// The `finished` log's entries begin with a field every reader skips: the main before this
/// build wrote a counter there (meta's 'finished'), this one the finish time. Done tasks
/// logged by that main are still found, and swept once past the retention window.
#[tokio::test]
async fn done_tasks_logged_by_the_previous_main_are_found_and_swept() {
    const PREVIOUS_MAIN: &str = "0e78b80ad9d9db9e32ac7fc859ef508b2bed0067";
    let redis = RedisServer::start();
    let s = eggtimer_tests::store_keeping_done(&redis, 1, 300).await;
    s.schedule(&[task("old", 0), task("new", 0)], ScheduleMode::Upsert)
        .await
        .unwrap();
    let b = claim_when_due(&s, 0, 10, "both").await;
    let token = b.tasks[0].token;
    // `old` is recorded done by the previous main's finish script
    let k = s.keys().shard(0);
    let mut c = redis.conn();
    let letters: String = redis::cmd("EVAL")
        .arg(script_at(PREVIOUS_MAIN, "finish"))
        .arg(15)
        .arg(&k.all()[..15])
        .arg("")
        .arg(0)
        .arg(300)
        .arg("done")
        .arg(token)
        .arg(0)
        .arg("")
        .arg(1)
        .arg("old")
        .query(&mut c)
        .unwrap();
    assert_eq!(letters, "d");
    let log = log_of(&mut c, &k.finished);
    assert_eq!(
        log,
        ["1\told"],
        "the previous main's entry: its counter, then the ids"
    );
    let done = found_ids(&s, TaskState::Done).await;
    assert_eq!(done, ["old"]);
    // past the window, this build's next finish on the shard sweeps it
    eventually(Duration::from_secs(5), "old's window to pass", || async {
        s.get("old").await.unwrap().is_none().then_some(())
    })
    .await;
    let out = s.finish(0, &[("new", token, &Finish::Done)]).await.unwrap();
    assert_eq!(out, [Finished::Done]);
    let kept: bool = redis::cmd("HEXISTS")
        .arg(&k.tasks)
        .arg("old")
        .query(&mut c)
        .unwrap();
    assert!(!kept, "the previous main's entry was swept");
    let log = log_of(&mut c, &k.finished);
    assert_eq!(log.len(), 1, "{log:?}");
    let (at, ids) = log[0].split_once('\t').unwrap();
    assert_eq!(ids, "new");
    assert!(
        at.parse::<i64>().unwrap() >= now() - 60_000,
        "this build logs the time: {at}"
    );
    assert_eq!(found_ids(&s, TaskState::Done).await, ["new"]);
}

/// The entries of a shard's `finished` log, oldest first.
fn log_of(c: &mut redis::Connection, key: &str) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query(c)
        .unwrap()
}
