//! The far tier: tasks due beyond `--far-horizon` are stored packed (no record, no due index
//! entry), read by id, dry-run and found as any task, cancelled, moved, run now and replaced as
//! any task (each of those brings the task back first), moved into the live tier ahead of their
//! due time by the shard's owner, and run once, never early. A runner killed -9 right after a
//! promotion loses and doubles nothing; a runner without a far tier moves every far task back.
//! A move racing a cancel ends as one order of the two.
//! A real runner binary, a real redis-server, the `bench-record` plugin's own events.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use eggtimer_tests::{
    RedisServer, RunnerProcess, call, eventually, now_ms, plugins_dir, post_tasks,
    read_events_timed, runners_holding_shards,
};
use serde_json::{Value, json};

const TASKS: &str = "{eggtimer:0}:tasks";

/// `n` tasks of `bench-record` (ids `<prefix><i>`), task i due at `due(i)`, payload `{"n": i}`.
async fn schedule(
    base: &str,
    prefix: &str,
    n: usize,
    due: impl Fn(usize) -> i64,
) -> HashMap<String, i64> {
    let mut at = HashMap::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let specs: Vec<Value> = chunk
            .iter()
            .map(|&i| {
                let id = format!("{prefix}{i}");
                at.insert(id.clone(), due(i));
                json!({"plugin": "bench-record", "id": id, "run_at": due(i), "payload": {"n": i}})
            })
            .collect();
        post_tasks(base, json!(specs)).await;
    }
    at
}

/// Every `bench` event so far: task id → the Redis times (ms) of its runs' events.
fn runs(redis: &RedisServer) -> HashMap<String, Vec<i64>> {
    let mut runs: HashMap<String, Vec<i64>> = HashMap::new();
    for (at, _, data) in read_events_timed(&mut redis.conn(), &["bench-record"], "bench") {
        let id = data["id"].as_str().expect("the event names its task");
        runs.entry(id.to_owned()).or_default().push(at);
    }
    runs
}

/// Waits until every task of `due` but `cancelled` has run; asserts each ran once, not before its
/// due time, and no cancelled one ran.
async fn each_once_on_time(
    redis: &RedisServer,
    due: &HashMap<String, i64>,
    cancelled: &HashSet<String>,
    limit: Duration,
) {
    let runs = eventually(limit, "every task to run", || async {
        let r = runs(redis);
        due.keys()
            .all(|id| cancelled.contains(id) || r.contains_key(id))
            .then_some(r)
    })
    .await;
    for id in cancelled {
        assert!(!runs.contains_key(id), "{id} ran after its cancel");
    }
    for (id, at) in due {
        if cancelled.contains(id) {
            continue;
        }
        let ats = &runs[id];
        assert_eq!(ats.len(), 1, "{id} ran {} times", ats.len());
        assert!(ats[0] >= *at, "{id} started {} ms before {at}", at - ats[0]);
    }
}

fn far_keys(redis: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("{eggtimer:0}:tasks:f*")
        .query(&mut redis.conn())
        .unwrap();
    keys.sort();
    keys
}

fn live_records(redis: &RedisServer) -> usize {
    redis::cmd("HLEN")
        .arg(TASKS)
        .query(&mut redis.conn())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn far_tasks_are_read_found_cancelled_moved_run_now_and_replaced_and_run_once_on_time() {
    let redis = RedisServer::start();
    let runner = RunnerProcess::with_plugins(&redis, &["--shards", "1", "--far-horizon", "10s"]);
    let first = now_ms() + 20_000;
    let made = now_ms();
    let mut due = schedule(&runner.url, "k", 300, |i| first + 10 * i as i64).await;
    let made_by = now_ms();
    assert_eq!(live_records(&redis), 0, "every task went far");
    assert!(!far_keys(&redis).is_empty(), "the far tier holds them");
    let task = |id: &str| format!("{}/v1/tasks/{id}", runner.url);

    // read as any task, and reading leaves it far
    let (s, t) = call("GET", &task("k5"), None).await;
    assert_eq!(s, 200, "{t}");
    assert_eq!(t["state"], "scheduled", "{t}");
    assert_eq!(t["run_at"], first + 50, "{t}");
    assert_eq!(t["payload"], json!({"n": 5}), "{t}");
    assert_eq!(t["plugin"], "bench-record", "{t}");
    assert_eq!(t["max_attempts"], 5, "{t}");
    let created = t["created_at"].as_i64().unwrap();
    assert!((made..=made_by).contains(&created), "{t}");
    assert_eq!(live_records(&redis), 0, "a read brings nothing back");
    // another plugin's live task of the same id (under the horizon): the id is ambiguous, the
    // far task one of the two
    post_tasks(
        &runner.url,
        json!([{"plugin": "noop", "id": "k5", "run_at": now_ms() + 8_000, "payload": null}]),
    )
    .await;
    let (s, b) = call("GET", &task("k5"), None).await;
    assert_eq!(
        (s, &b["error"]["code"]),
        (409, &json!("ambiguous_id")),
        "{b}"
    );
    let (s, t) = call("GET", &format!("{}?plugin=bench-record", task("k5")), None).await;
    assert_eq!((s, &t["run_at"]), (200, &json!(first + 50)), "{t}");
    let (s, b) = call("DELETE", &format!("{}?plugin=noop", task("k5")), None).await;
    assert_eq!(s, 204, "{b}");
    // a dry run of a far task runs its payload and leaves it far
    let (s, r) = call("POST", &format!("{}/dry-run", task("k5")), Some(json!({}))).await;
    assert_eq!((s, &r["outcome"]), (200, &json!({"done": true})), "{r}");
    assert_eq!(live_records(&redis), 0, "a dry run brings nothing back");

    // found, page by page, soonest first, each once (with a live task of the plugin among them)
    post_tasks(
        &runner.url,
        json!([{"plugin": "bench-record", "id": "live", "run_at": first + 55, "payload": {}}]),
    )
    .await;
    let mut listed = Vec::new();
    let mut cursor = String::new();
    loop {
        let (s, page) = call(
            "GET",
            &format!(
                "{}/v1/tasks?state=scheduled&plugin=bench-record&limit=64&cursor={cursor}",
                runner.url
            ),
            None,
        )
        .await;
        assert_eq!(s, 200, "{page}");
        for t in page["tasks"].as_array().unwrap() {
            listed.push((
                t["run_at"].as_i64().unwrap(),
                t["id"].as_str().unwrap().to_owned(),
            ));
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = c.to_owned(),
            None => break,
        }
    }
    let mut want: Vec<(i64, String)> = due.iter().map(|(id, at)| (*at, id.clone())).collect();
    want.push((first + 55, "live".into()));
    want.sort();
    assert_eq!(
        listed, want,
        "find lists far tasks with the live one, in due order"
    );
    due.insert("live".into(), first + 55);

    // cancelled
    let (s, b) = call("DELETE", &task("k7"), None).await;
    assert_eq!(s, 204, "{b}");
    let (s, _) = call("GET", &task("k7"), None).await;
    assert_eq!(s, 404, "a cancelled far task is gone");
    let cancelled = HashSet::from(["k7".to_owned()]);

    // moved later (stays beyond the horizon) and into it
    let (s, b) = call("PATCH", &task("k9"), Some(json!({"shift_ms": 3000}))).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["run_at"], first + 90 + 3000, "{b}");
    due.insert("k9".into(), first + 90 + 3000);
    let soon = now_ms() + 1500;
    let (s, b) = call("PATCH", &task("k13"), Some(json!({"run_at": soon}))).await;
    assert_eq!(s, 200, "{b}");
    due.insert("k13".into(), soon);

    // run now
    let (s, b) = call("POST", &format!("{}/run", task("k15")), Some(json!({}))).await;
    assert_eq!(s, 202, "{b}");
    due.insert("k15".into(), 0);

    // replaced: one task of the id, at its new time
    let later = first + 4000;
    post_tasks(
        &runner.url,
        json!([{"plugin": "bench-record", "id": "k17", "run_at": later, "payload": {"n": -1}}]),
    )
    .await;
    due.insert("k17".into(), later);
    let (s, t) = call("GET", &task("k17"), None).await;
    assert_eq!((s, &t["payload"]), (200, &json!({"n": -1})), "{t}");

    // the one moved into the horizon and the one run now start before the far ones are due
    let early = eventually(Duration::from_secs(10), "k13 and k15 to run", || async {
        let r = runs(&redis);
        (r.contains_key("k13") && r.contains_key("k15")).then_some(r)
    })
    .await;
    assert!(
        early.len() == 2,
        "only k13 and k15 ran before the far tasks were due: {:?}",
        early.keys().collect::<Vec<_>>()
    );
    each_once_on_time(&redis, &due, &cancelled, Duration::from_secs(40)).await;
    assert_eq!(
        far_keys(&redis),
        Vec::<String>::new(),
        "the far tier is empty once its tasks moved"
    );
}

/// A cancel racing a move of the same far task (moved later, still far, or into the horizon),
/// both sent at once for each of 200 tasks: each pair ends as one order of the two. The cancel
/// finds the task either way; the move finds it only before the cancel; nothing is left of any
/// task (no record, no far entry, no index entry, no count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_racing_a_cancel_of_a_far_task_ends_as_one_order_of_the_two() {
    let redis = RedisServer::start();
    let runner = RunnerProcess::with_plugins(&redis, &["--shards", "1", "--far-horizon", "10s"]);
    let at = now_ms() + 3_600_000;
    let due = schedule(&runner.url, "r", 200, |i| at + i as i64).await;
    assert_eq!(live_records(&redis), 0, "every task went far");
    let task = |id: &str| format!("{}/v1/tasks/{id}", runner.url);
    let soon = now_ms() + 5_000;
    let races = due.keys().enumerate().map(|(i, id)| {
        let (t, id) = (task(id), id.clone());
        // half moved later (still far), half into the horizon
        let change = if i % 2 == 0 {
            json!({"shift_ms": 60_000})
        } else {
            json!({"run_at": soon})
        };
        async move {
            let (cancel, moved) = tokio::join!(
                tokio::spawn({
                    let t = t.clone();
                    async move { call("DELETE", &t, None).await }
                }),
                tokio::spawn(async move { call("PATCH", &t, Some(change)).await })
            );
            (id, cancel.unwrap(), moved.unwrap())
        }
    });
    let mut moved_first = 0;
    for (id, (cs, cb), (ms, mb)) in futures::future::join_all(races).await {
        assert_eq!(
            cs, 204,
            "{id}: the cancel finds the task whatever came first: {cb}"
        );
        match ms {
            200 => moved_first += 1,
            404 => {}
            _ => panic!("{id}: a move either moves or finds nothing: {ms} {mb}"),
        }
        let (s, _) = call("GET", &task(&id), None).await;
        assert_eq!(s, 404, "{id} is gone");
    }
    println!("moves that came first: {moved_first} of 200");
    assert_eq!(live_records(&redis), 0, "no record is left");
    // the slot, every task of it marked brought back, goes at its compaction (the promoter's)
    eventually(
        Duration::from_secs(10),
        "the far tier empty once compacted",
        || async { far_keys(&redis).is_empty().then_some(()) },
    )
    .await;
    let (_, stats) = call("GET", &format!("{}/v1/stats", runner.url), None).await;
    assert_eq!(
        (&stats["scheduled"], &stats["running"]),
        (&json!(0), &json!(0)),
        "{stats}"
    );
}

/// A runner killed -9 right after a promotion call (its failpoint `far-promoted`: a call that
/// moved a full chunk) leaves the rest far; the next owner of the shard, a runner without a far
/// tier, moves every far task back at once. Each task runs once, none early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_after_a_promotion_loses_and_doubles_nothing() {
    let redis = RedisServer::start();
    let dir = plugins_dir();
    let common = [
        "--plugins-dir",
        dir.to_str().unwrap(),
        "--shards",
        "1",
        "--shard-lease",
        "1s",
    ];
    let mut args = common.to_vec();
    args.extend(["--far-horizon", "10s"]);
    let mut a = RunnerProcess::start_with_env(
        &redis.url(),
        &args,
        &[("EGGTIMER_FAILPOINT", "far-promoted")],
    );
    runners_holding_shards(&a.url, 1).await;
    // 2,500 tasks in one second (one far slot: a promotion call moves them all, a full chunk),
    // then 1,000 in each of the next three seconds
    let first = (now_ms() / 1000 + 16) * 1000;
    let due = schedule(&a.url, "p", 5500, |i| {
        if i < 2500 {
            first + (i as i64 % 1000)
        } else {
            first + 1000 + (i as i64 - 2500) / 1000 * 1000 + i as i64 % 1000
        }
    })
    .await;
    assert_eq!(live_records(&redis), 0, "every task went far");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !a.child_exited() {
        assert!(
            std::time::Instant::now() < deadline,
            "the promoter did not abort at its failpoint"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        now_ms() < first,
        "the promoter died before the tasks fell due"
    );
    // the next owner, started only now: a runner beside A from the start could take the shard
    // whenever a loaded machine delays A's lease renewal, and promote without the failpoint
    let b = RunnerProcess::start(&redis.url(), &common);
    each_once_on_time(&redis, &due, &HashSet::new(), Duration::from_secs(60)).await;
    assert_eq!(far_keys(&redis), Vec::<String>::new());
    drop(b);
}

/// The tier's scripts on a Redis Cluster of three masters (the shards spread over them): tasks an
/// hour ahead go far on every shard, are found, read, cancelled and moved by key, and a store
/// without a far tier brings every one back into the live tier, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_far_tier_works_on_a_cluster() {
    use eggtimer::store::{FindQuery, Move, NewTask, ScheduleMode, StoreOptions, TaskState};
    use eggtimer::{RedisTarget, Store};
    use eggtimer_tests::{RedisCluster, key};

    let cluster = RedisCluster::start(3, 0);
    let target = RedisTarget::parse(&cluster.url()).unwrap();
    let far = Store::open(
        target.clone(),
        StoreOptions {
            far_horizon_ms: 60_000,
            ..StoreOptions::default()
        },
    )
    .await
    .unwrap();
    let at = now_ms() + 3_600_000;
    let tasks: Vec<NewTask> = (0..200)
        .map(|i| NewTask {
            id: format!("c{i}"),
            plugin: "noop".into(),
            payload: format!("{{\"n\":{i}}}"),
            run_at: at + i,
            max_attempts: 2,
            ..Default::default()
        })
        .collect();
    far.schedule(&tasks, ScheduleMode::Upsert).await.unwrap();
    let mut in_tier = 0;
    for shard in 0..far.shards() {
        let (found, _) = far.far_waiting_chunk(shard, "noop", 0).await.unwrap();
        in_tier += found.len();
    }
    assert_eq!(in_tier, 200, "every task went far, on every master");
    let q = FindQuery {
        plugin: Some("noop".into()),
        state: Some(TaskState::Scheduled),
        limit: 1000,
        ..Default::default()
    };
    assert_eq!(far.find(&q, None).await.unwrap().0.len(), 200);
    let got = far.get(&key("c7")).await.unwrap().expect("c7 read");
    assert_eq!((got.run_at, got.payload.as_str()), (at + 7, "{\"n\":7}"));
    far.cancel(&key("c8")).await.unwrap().unwrap();
    assert!(far.get(&key("c8")).await.unwrap().is_none());
    let moved = far
        .move_task(&key("c9"), Move::Shift(1000))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(moved, at + 9 + 1000);
    // a store without a far tier moves every far task back
    let live = Store::open(target, StoreOptions::default()).await.unwrap();
    for shard in 0..live.shards() {
        while live.promote_far(shard).await.unwrap() >= eggtimer::store::PROMOTE_CHUNK {}
        let (left, _) = live.far_waiting_chunk(shard, "noop", 0).await.unwrap();
        assert!(left.is_empty(), "shard {shard} still holds far tasks");
    }
    let (found, _) = live.find(&q, None).await.unwrap();
    let mut ids: Vec<String> = found.iter().map(|t| t.id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(
        (found.len(), ids.len()),
        (199, 199),
        "each task once, c8 gone"
    );
    assert!(found.iter().all(|t| t.id != "c8"));
    let c9 = found.iter().find(|t| t.id == "c9").unwrap();
    assert_eq!(c9.run_at, at + 9 + 1000);
}
