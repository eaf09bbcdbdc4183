//! Priority among a plugin's due tasks: the higher starts first, never before its due time, and a
//! task due for longer than the aging counts as the highest. In a claim (the store against a real
//! redis-server) and among the runs waiting for a concurrency slot (real runners, a real plugin).

use std::time::Duration;

use eggtimer::store::{NewTask, ScheduleMode, StoreOptions};
use eggtimer_tests::{
    RedisServer, call, eventually, key, noop_task, now_ms, owner_priorities, post_tasks,
    read_events_timed, runner_fast_retry as start, wait_state,
};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);

async fn store(redis: &RedisServer, aging_ms: u64) -> eggtimer::Store {
    let opts = StoreOptions {
        shards: 1,
        priority_aging_ms: aging_ms,
        ..StoreOptions::default()
    };
    eggtimer::Store::open(eggtimer::RedisTarget::Single(redis.url()), opts)
        .await
        .unwrap()
}

fn task(id: &str, run_at: i64, priority: u8) -> NewTask {
    NewTask {
        priority,
        ..noop_task(id, run_at)
    }
}

/// The ids (public) of what one claim of up to `limit` took, in its order.
async fn claim(s: &eggtimer::Store, limit: usize) -> Vec<String> {
    let batch = s.claim(0, limit, 30_000).await.unwrap();
    batch.tasks.iter().map(|t| t.task_id().to_owned()).collect()
}

/// The entries of the shard's priority index (its members), read from Redis.
fn index_entries(redis: &RedisServer) -> Vec<String> {
    let mut c = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*:p").query(&mut c).unwrap();
    let mut all = Vec::new();
    for k in keys {
        let m: Vec<String> = redis::cmd("ZRANGE")
            .arg(&k)
            .arg(0)
            .arg(-1)
            .query(&mut c)
            .unwrap();
        all.extend(m);
    }
    all
}

#[tokio::test]
async fn a_claim_takes_the_highest_priority_first_in_due_order_and_nothing_before_its_time() {
    let redis = RedisServer::start();
    let s = store(&redis, 600_000).await;
    let t = now_ms();
    s.schedule(
        &[
            task("a", t - 3, 0),
            task("b", t - 2, 5),
            task("c", t - 1, 9),
            task("d", t - 5, 5),
            task("e", t - 9, 0),
            // due later: not taken, whatever its priority
            task("f", t + 60_000, 9),
        ],
        ScheduleMode::Upsert,
    )
    .await
    .unwrap();
    assert_eq!(index_entries(&redis).len(), 4, "b, c, d and f are indexed");
    // one at a time, then the rest together
    assert_eq!(claim(&s, 1).await, ["c"]);
    assert_eq!(claim(&s, 2).await, ["d", "b"]);
    assert_eq!(claim(&s, 10).await, ["e", "a"]);
    assert!(claim(&s, 10).await.is_empty(), "f is not due");
    // the claimed tasks left the index; f is still in it, and still scheduled
    assert_eq!(index_entries(&redis).len(), 1);
    let f = s.get(&key("f")).await.unwrap().unwrap();
    assert_eq!(
        (f.priority, f.state),
        (9, eggtimer::store::TaskState::Scheduled)
    );
    // moved and cancelled, its entry follows: moved to now, it is claimed first again
    s.schedule(
        &[task("g", t - 100, 0), task("f", now_ms() - 1, 9)],
        ScheduleMode::Upsert,
    )
    .await
    .unwrap();
    assert_eq!(claim(&s, 1).await, ["f"]);
    assert_eq!(claim(&s, 1).await, ["g"]);
    s.schedule(&[task("h", t + 60_000, 7)], ScheduleMode::Upsert)
        .await
        .unwrap();
    assert_eq!(index_entries(&redis).len(), 1);
    assert!(s.cancel(&key("h")).await.unwrap().is_ok());
    assert!(
        index_entries(&redis).is_empty(),
        "a cancelled task leaves the index"
    );
}

#[tokio::test]
async fn a_task_due_longer_than_the_aging_goes_before_any_priority() {
    let redis = RedisServer::start();
    let s = store(&redis, 1_000).await;
    let t = now_ms();
    s.schedule(
        &[
            task("fresh-9", t, 9),
            task("old-0", t - 5_000, 0),
            task("old-3", t - 4_000, 3),
            task("fresh-0", t - 10, 0),
        ],
        ScheduleMode::Upsert,
    )
    .await
    .unwrap();
    // the two aged ones first, in due order (old-3's priority counts no more once aged), then
    // by priority
    assert_eq!(claim(&s, 2).await, ["old-0", "old-3"]);
    assert_eq!(claim(&s, 2).await, ["fresh-9", "fresh-0"]);
    assert!(
        index_entries(&redis).is_empty(),
        "every claimed task left the index"
    );
}

/// A paused plugin's priority tasks are parked out of their buckets (their entries found stale
/// and dropped by a claim); resumed, they get their entries again and keep their order.
#[tokio::test]
async fn a_parked_task_keeps_its_priority_when_resumed() {
    let redis = RedisServer::start();
    let s = store(&redis, 600_000).await;
    let t = now_ms();
    s.schedule(
        &[task("low", t - 50, 1), task("high", t - 10, 8)],
        ScheduleMode::Upsert,
    )
    .await
    .unwrap();
    s.set_paused("noop", true).await.unwrap();
    assert!(claim(&s, 10).await.is_empty(), "paused: parked");
    s.set_paused("noop", false).await.unwrap();
    assert_eq!(index_entries(&redis).len(), 2, "both indexed again");
    assert_eq!(claim(&s, 1).await, ["high"]);
    assert_eq!(claim(&s, 1).await, ["low"]);
}

fn sleep_spec(id: &str, ms: u64, run_at: i64, priority: u8) -> Value {
    json!({"plugin": "test-sleep", "id": id, "run_at": run_at, "priority": priority,
           "payload": {"ms": ms, "tag": id}})
}

/// Tags of the `sleep` events, in the order their runs started.
fn started_in_order(redis: &RedisServer) -> Vec<String> {
    let mut ev = read_events_timed(&mut redis.conn(), &["test-sleep"], "sleep");
    ev.sort_by_key(|(_, _, d)| d["started_at"].as_i64().unwrap());
    ev.iter()
        .map(|(_, _, d)| d["tag"].as_str().unwrap().to_owned())
        .collect()
}

async fn one_at_a_time(url: &str) {
    let (s, p) = call(
        "PATCH",
        &format!("{url}/v1/plugins/test-sleep"),
        Some(json!({"max_concurrency": 1})),
    )
    .await;
    assert_eq!((s, &p["max_concurrency"]), (200, &json!(1)), "{p}");
}

/// Under `max_concurrency 1`, ten tasks of priorities 0 to 9 that fell due while another run held
/// the slot start the highest first, one at a time, each once.
#[tokio::test]
async fn under_max_concurrency_1_the_waiting_runs_start_the_highest_priority_first() {
    let redis = RedisServer::start();
    let r = start(&redis, &["--plugin-timeout", "10s"]);
    one_at_a_time(&r.url).await;
    let t = now_ms();
    let mut specs = vec![sleep_spec("blocker", 1_500, t, 0)];
    // scheduled in a shuffled order of priorities
    for p in [3u8, 9, 0, 6, 1, 8, 4, 7, 2, 5] {
        specs.push(sleep_spec(&format!("p{p}"), 30, t + 400, p));
    }
    post_tasks(&r.url, json!(specs)).await;
    let (_, got) = call(
        "GET",
        &format!("{}/v1/tasks/p7?plugin=test-sleep", r.url),
        None,
    )
    .await;
    assert_eq!(got["priority"], 7, "{got}");
    eventually(T, "eleven runs", || async {
        (started_in_order(&redis).len() >= 11).then_some(())
    })
    .await;
    let order = started_in_order(&redis);
    let want: Vec<String> = std::iter::once("blocker".to_owned())
        .chain((0..10).rev().map(|p| format!("p{p}")))
        .collect();
    assert_eq!(order, want, "the highest priority first, each once");
}

/// A task left waiting past `--priority-aging-ms` goes before higher-priority tasks that have not
/// waited as long.
#[tokio::test]
async fn a_run_waiting_past_the_aging_goes_before_a_higher_priority() {
    let redis = RedisServer::start();
    let r = start(
        &redis,
        &["--priority-aging-ms", "1500", "--plugin-timeout", "10s"],
    );
    one_at_a_time(&r.url).await;
    let t = now_ms();
    // the blocker holds the slot 3 s; `old` waits from t+100 (past the aging from t+1600), the
    // 9s from t+2000 (not past it when the slot comes free, about t+3000)
    post_tasks(
        &r.url,
        json!([
            sleep_spec("blocker", 3_000, t, 0),
            sleep_spec("old", 30, t + 100, 0),
            sleep_spec("high-a", 30, t + 2_000, 9),
            sleep_spec("high-b", 30, t + 2_000, 9),
        ]),
    )
    .await;
    eventually(T, "four runs", || async {
        (started_in_order(&redis).len() >= 4).then_some(())
    })
    .await;
    let order = started_in_order(&redis);
    assert_eq!(order[..2], ["blocker", "old"], "{order:?}");
    for id in ["old", "high-a", "high-b"] {
        wait_state(&r.url, &format!("{id}?plugin=test-sleep"), "done", T).await;
    }
}

/// A priority out of 0..=9 (400), or with debounce (422), is refused with what is wrong; a schedule carries
/// its priority to its firings.
#[tokio::test]
async fn a_priority_out_of_range_is_refused_and_a_schedule_carries_one() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    for bad in [json!(10), json!(-1), json!("high"), json!(i64::MAX)] {
        let (s, b) = call(
            "POST",
            &format!("{}/v1/tasks", r.url),
            Some(json!({"plugin": "noop", "priority": bad})),
        )
        .await;
        assert_eq!(s, 400, "{bad}: {b}");
        let msg = b["error"]["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains("priority must be an integer from 0 to 9"),
            "{bad}: {b}"
        );
    }
    let (s, b) = call(
        "POST",
        &format!("{}/v1/tasks", r.url),
        Some(json!({"plugin": "noop", "priority": 3,
                    "debounce": {"key": "k", "quiet_ms": 1000, "max_wait_ms": 5000}})),
    )
    .await;
    assert_eq!(
        (s, &b["error"]["code"]),
        (422, &json!("invalid_task")),
        "{b}"
    );
    assert!(
        b.to_string()
            .contains("priority can't be given with debounce"),
        "{b}"
    );
    let (s, b) = call(
        "PUT",
        &format!("{}/v1/schedules/tick", r.url),
        Some(json!({"plugin": "noop", "every_ms": 1000, "priority": 6})),
    )
    .await;
    assert!(s == 201, "{s} {b}");
    let (_, got) = call("GET", &format!("{}/v1/schedules/tick", r.url), None).await;
    assert_eq!(got["priority"], 6, "{got}");
    let first: Value = eventually(T, "a firing", || async {
        let (_, list) = call(
            "GET",
            &format!("{}/v1/tasks?plugin=noop&state=done", r.url),
            None,
        )
        .await;
        list["tasks"].as_array().and_then(|a| a.first().cloned())
    })
    .await;
    assert_eq!(
        first["priority"], 6,
        "a firing has its schedule's priority: {first}"
    );
}

/// A follow-up has the priority of the task that scheduled it unless the plugin gives its own
/// (`FollowUp::priority`); above 9 the host answers the plugin an error naming the rule.
#[tokio::test]
async fn a_follow_up_inherits_its_tasks_priority_or_has_its_own() {
    let redis = RedisServer::start();
    let r = start(&redis, &[]);
    post_tasks(
        &r.url,
        json!([{"id": "parent", "plugin": "test-flood", "owner": "prio-owner", "priority": 4,
                "payload": {"what": "priorities"}}]),
    )
    .await;
    wait_state(&r.url, "parent", "done", T).await;
    let got = owner_priorities(&r.url, "prio-owner", |t| &t["payload"]["id"]).await;
    assert_eq!(
        got,
        [
            ("inherits".to_owned(), json!(4)),
            ("nine".to_owned(), json!(9)),
            // the refusal's text, scheduled without a priority: the parent's
            (
                "priority must be an integer from 0 to 9".to_owned(),
                json!(4)
            ),
        ],
        "{got:?}"
    );
}
