//! Claim ahead: under a steady stream a runner claims what falls due within a few ms in one
//! script and starts each task at its due time. Never early (by Redis's clock, which decides what
//! is due), each task once, a cancel answered 204 means the task never runs, one answered 409
//! means it runs once, a cancel or a move of a task claimed ahead revokes it (it never starts at
//! its old time), a plugin's or an owner's pause holds back what was claimed ahead, and a
//! runner killed -9 with tasks claimed ahead loses and doubles none; a revocation request left by
//! a killed asker is swept by a later one, and a plugin's delete with its tasks revokes those
//! claimed ahead.
//! A real runner binary, a real redis-server, the `bench-record` plugin's own events.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use eggtimer_tests::{
    RedisServer, RunnerProcess, call, eventually, metric, now_ms, post_tasks, read_events_timed,
    runners_holding_shards,
};
use serde_json::{Value, json};

/// `n` tasks of `bench-record` due one a ms from `first` (ids `k0`…): a steady stream of
/// 1,000 a second on the runner's one shard.
async fn stream(base: &str, first: i64, n: usize) -> HashMap<String, i64> {
    let mut due = HashMap::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let specs: Vec<Value> = chunk
            .iter()
            .map(|&i| {
                let id = format!("k{i}");
                let at = first + i as i64;
                due.insert(id.clone(), at);
                json!({"plugin": "bench-record", "id": id, "run_at": at, "payload": {}})
            })
            .collect();
        post_tasks(base, json!(specs)).await;
    }
    due
}

/// Every `bench` event so far: task id → the Redis times (ms) of its events' XADDs (each after
/// its handler started).
fn runs(redis: &RedisServer) -> HashMap<String, Vec<i64>> {
    let mut runs: HashMap<String, Vec<i64>> = HashMap::new();
    for (at, _, data) in read_events_timed(&mut redis.conn(), &["bench-record"], "bench") {
        let id = data["id"]
            .as_str()
            .expect("the event names its task")
            .to_owned();
        runs.entry(id).or_default().push(at);
    }
    runs
}

/// Waits until `want` tasks have run.
async fn wait_runs(redis: &RedisServer, want: usize, limit: Duration) -> HashMap<String, Vec<i64>> {
    eventually(limit, &format!("{want} tasks to run"), || async {
        let r = runs(redis);
        (r.len() >= want).then_some(r)
    })
    .await
}

/// Asserts that no task of `cancelled` ran and every other task of `due` ran once, not before its
/// due time.
fn each_once_on_time(
    runs: &HashMap<String, Vec<i64>>,
    due: &HashMap<String, i64>,
    cancelled: &HashSet<String>,
) {
    for id in cancelled {
        assert!(
            !runs.contains_key(id),
            "{id} ran after its cancel was answered 204"
        );
    }
    for (id, at) in due {
        if cancelled.contains(id) {
            continue;
        }
        let ats = runs.get(id).unwrap_or_else(|| panic!("{id} never ran"));
        assert_eq!(ats.len(), 1, "{id} ran {} times", ats.len());
        assert!(ats[0] >= *at, "{id} started {} ms before {at}", at - ats[0]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_streams_tasks_claimed_ahead_start_at_their_due_time_and_a_204_cancel_never_runs()
{
    let redis = RedisServer::start();
    let runner = RunnerProcess::with_plugins(&redis, &["--shards", "1", "--claim-ahead", "50ms"]);
    let n = 2000;
    let first = now_ms() + 2000;
    let due = stream(&runner.url, first, n).await;
    // cancels sent 12 ms before their task's due time, one every 25 tasks: a claim ahead
    // under this stream takes about the next 16 ms, so some find their task claimed (revoked:
    // 204, or 409 where its runner had started it) and the others still scheduled (204)
    let mut cancelled = HashSet::new();
    let mut refused = HashSet::new();
    for i in (100..n).step_by(25) {
        let id = format!("k{i}");
        let send_at = due[&id] - 12;
        let wait = send_at - now_ms();
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        }
        let (s, b) = call("DELETE", &format!("{}/v1/tasks/{id}", runner.url), None).await;
        let answered = now_ms();
        let why = b["error"]["message"].as_str().unwrap_or_default();
        match s {
            204 => assert!(cancelled.insert(id)),
            // (a cancel that came late, on a loaded machine, may find its task done)
            409 if why.contains("running") || (why.contains("done") && answered >= due[&id]) => {
                assert!(refused.insert(id));
            }
            _ => panic!(
                "cancel of {id} answered at {answered}, due {}: {s} {b}",
                due[&id]
            ),
        }
    }
    let runs = wait_runs(&redis, n - cancelled.len(), Duration::from_secs(30)).await;
    let ahead = metric(&runner.url, "eggtimer_claimed_ahead_total")
        .await
        .unwrap_or(0.0);
    eprintln!(
        "claimed ahead: {ahead} of {n}; cancels 12 ms ahead: {} answered 204, {} 409",
        cancelled.len(),
        refused.len()
    );
    assert!(
        ahead >= (n / 4) as f64,
        "the stream was claimed ahead: {ahead} of {n} tasks"
    );
    let revoked = metric(&runner.url, "eggtimer_revoked_total")
        .await
        .unwrap_or(0.0);
    eprintln!("of them revoked while claimed ahead: {revoked}");
    assert!(
        revoked >= 1.0 && !cancelled.is_empty(),
        "cancels 12 ms ahead found some tasks claimed ahead and revoked them ({revoked}), 204: {}, 409: {}",
        cancelled.len(),
        refused.len()
    );
    each_once_on_time(&runs, &due, &cancelled);
}

/// A cancel or a move of a task claimed ahead is a revocation: a slow stream (one task every
/// 20 ms) is claimed about 320 ms ahead under `--claim-ahead 1s` by one of two runners (one
/// shard); of the tasks the store shows running with their due time 60 ms or more away (claimed
/// ahead, not started), every other one is cancelled and the rest moved 2 s later, through
/// either runner in turn (the one holding it, and the other). Each answers 204 / 200 (before
/// revocations, 409), the runners count each as revoked, a cancelled one never runs, a moved one
/// runs once, at its new time and not its old, and every other task once, none early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_or_a_move_of_a_task_claimed_ahead_revokes_it_before_it_starts() {
    let redis = RedisServer::start();
    let args = ["--shards", "1", "--claim-ahead", "1s"];
    let a = RunnerProcess::with_plugins(&redis, &args);
    let b = RunnerProcess::with_plugins(&redis, &args);
    let n = 150;
    let mut due = paced_stream(&[&a.url, &b.url], n, &|_| None).await;
    let turn = std::cell::Cell::new(0);
    let task = |id: &str| {
        turn.set(turn.get() + 1);
        let base = if turn.get() % 2 == 0 { &a.url } else { &b.url };
        format!("{base}/v1/tasks/{id}")
    };
    let mut ids: Vec<&String> = due.keys().collect();
    ids.sort_by_key(|id| due[*id]);
    let (mut cancelled, mut moved) = (HashSet::new(), HashMap::new());
    for id in ids {
        let (s, t) = call("GET", &task(id), None).await;
        assert_eq!(s, 200, "{t}");
        if t["state"] != "running" || due[id] < now_ms() + 60 {
            continue;
        }
        if cancelled.len() <= moved.len() {
            let (s, b) = call("DELETE", &task(id), None).await;
            assert_eq!(s, 204, "the cancel of {id}, claimed ahead: {b}");
            cancelled.insert(id.clone());
        } else {
            let (s, b) = call("PATCH", &task(id), Some(json!({"shift_ms": 2000}))).await;
            assert_eq!(s, 200, "the move of {id}, claimed ahead: {b}");
            assert_eq!(b["run_at"], due[id] + 2000, "{b}");
            moved.insert(id.clone(), due[id] + 2000);
        }
        if cancelled.len() + moved.len() == 6 {
            break;
        }
    }
    assert_eq!(
        cancelled.len() + moved.len(),
        6,
        "six tasks found claimed ahead, 60 ms or more before their due time"
    );
    let mut revoked = 0.0;
    for r in [&a, &b] {
        revoked += metric(&r.url, "eggtimer_revoked_total")
            .await
            .unwrap_or(0.0);
    }
    assert_eq!(revoked, 6.0, "each was revoked by the runner holding it");
    due.extend(moved.iter().map(|(id, at)| (id.clone(), *at)));
    let runs = wait_runs(&redis, n - cancelled.len(), Duration::from_secs(30)).await;
    each_once_on_time(&runs, &due, &cancelled);
}

/// The revocation requests in shard 0's `batches` (fields `rv` \x1f key).
fn revocation_requests(redis: &RedisServer) -> Vec<String> {
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg("{eggtimer:0}:batches")
        .query(&mut redis.conn())
        .unwrap();
    fields
        .into_iter()
        .filter(|f| f.starts_with("rv\x1f"))
        .collect()
}

/// A task of `due` that runs claimed ahead 60 ms or more before its due time (by the runner at
/// `base`), not one of `skip`.
async fn one_claimed_ahead(
    base: &str,
    due: &HashMap<String, i64>,
    skip: &HashSet<String>,
) -> String {
    eventually(Duration::from_secs(10), "a task claimed ahead", || async {
        let mut ids: Vec<&String> = due.keys().filter(|id| !skip.contains(*id)).collect();
        ids.sort_by_key(|id| due[*id]);
        for id in ids
            .into_iter()
            .filter(|id| due[*id] > now_ms() + 60)
            .take(40)
        {
            let (_, t) = call("GET", &format!("{base}/v1/tasks/{id}"), None).await;
            if t["state"] == "running" && due[id] >= now_ms() + 60 {
                return Some(id.clone());
            }
        }
        None
    })
    .await
}

/// A runner killed between asking for a revocation and reading its answer leaves its request in
/// Redis (applied by the holder, never read): a later request, once that one is 5 s past its
/// deadline, sweeps it, so dead askers leave nothing behind for good. The task the dead asker
/// cancelled runs at most once; the one cancelled after never runs; every other once, none early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_left_behind_by_a_killed_asker_is_swept_by_a_later_one() {
    let redis = RedisServer::start();
    let args = ["--shards", "1", "--claim-ahead", "1s"];
    let holder = RunnerProcess::with_plugins(&redis, &args);
    runners_holding_shards(&holder.url, 1).await;
    let mut asker = RunnerProcess::start_with_env(
        &redis.url(),
        &args,
        &[("EGGTIMER_FAILPOINT", "revocation-asked")],
    );
    let n = 500;
    let due = paced_stream(&[&holder.url], n, &|_| None).await;
    let first = one_claimed_ahead(&holder.url, &due, &HashSet::new()).await;
    let asked_at = now_ms();
    let dead = reqwest::Client::new()
        .delete(format!("{}/v1/tasks/{first}", asker.url))
        .send()
        .await;
    assert!(dead.is_err(), "the asker answered: {dead:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !asker.child_exited() {
        assert!(
            std::time::Instant::now() < deadline,
            "the asker did not abort at its failpoint"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let left = revocation_requests(&redis);
    assert_eq!(left.len(), 1, "the dead asker's request: {left:?}");
    // stale once its deadline (200 ms after the ask) is 5 s past, by Redis's clock
    eventually(
        Duration::from_secs(10),
        "the request gone stale",
        || async { (now_ms() > asked_at + 5_400).then_some(()) },
    )
    .await;
    let second = one_claimed_ahead(&holder.url, &due, &HashSet::from([first.clone()])).await;
    let (s, b) = call("DELETE", &format!("{}/v1/tasks/{second}", holder.url), None).await;
    assert_eq!(s, 204, "the cancel of {second}, claimed ahead: {b}");
    assert_eq!(
        revocation_requests(&redis),
        Vec::<String>::new(),
        "the later request swept the dead asker's, and its own was read and dropped"
    );
    let mut runs = eventually(
        Duration::from_secs(30),
        "every other task to run",
        || async {
            let r = runs(&redis);
            let all = due
                .keys()
                .all(|id| *id == first || *id == second || r.contains_key(id));
            all.then_some(r)
        },
    )
    .await;
    let firsts = runs.remove(&first).unwrap_or_default();
    assert!(firsts.len() <= 1, "{first} ran {} times", firsts.len());
    let mut rest = due.clone();
    rest.remove(&first);
    each_once_on_time(&runs, &rest, &HashSet::from([second]));
}

/// A plugin deleted with its tasks (`?tasks=cancel`) while its runner holds some of them claimed
/// ahead: those are revoked with the rest, so none starts after the delete (it would fail as a
/// task of an unknown plugin into a retry or a dead letter under a name that is gone). Once the
/// stream's last due time has passed, the shard holds no scheduled, running or dead task (a done
/// one is a run that started before the delete and finished).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_delete_with_its_tasks_revokes_those_claimed_ahead() {
    let redis = RedisServer::start();
    let runner = RunnerProcess::with_plugins(&redis, &["--shards", "1", "--claim-ahead", "1s"]);
    let due = paced_stream(&[&runner.url], 150, &|_| None).await;
    one_claimed_ahead(&runner.url, &due, &HashSet::new()).await;
    let url = format!("{}/v1/plugins/bench-record?tasks=cancel", runner.url);
    let (s, b) = call("DELETE", &url, None).await;
    assert_eq!(s, 204, "{b}");
    eventually(Duration::from_secs(5), "revocations counted", || async {
        let revoked = metric(&runner.url, "eggtimer_revoked_total").await;
        (revoked.unwrap_or(0.0) >= 1.0).then_some(())
    })
    .await;
    let last = *due.values().max().unwrap();
    eventually(
        Duration::from_secs(10),
        "the stream's end passed",
        || async { (now_ms() > last + 1_000).then_some(()) },
    )
    .await;
    let records: HashMap<String, String> = redis::cmd("HGETALL")
        .arg("{eggtimer:0}:tasks")
        .query(&mut redis.conn())
        .unwrap();
    let left: Vec<String> = records
        .iter()
        .filter_map(|(key, rec)| {
            let t = eggtimer_tests::eggtimer::store::TaskRecord::decode(key, rec)
                .unwrap_or_else(|| panic!("{key}'s record {rec:?} does not decode"));
            (t.state != eggtimer_tests::eggtimer::store::TaskState::Done)
                .then(|| format!("{key} {:?}", t.state))
        })
        .collect();
    assert_eq!(
        left,
        Vec::<String>::new(),
        "tasks of the deleted plugin left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_with_tasks_claimed_ahead_loses_none_and_doubles_none() {
    let redis = RedisServer::start();
    let args = [
        "--shards",
        "1",
        "--claim-ahead",
        "50ms",
        "--shard-lease",
        "1s",
        "--lease",
        "1s",
    ];
    let mut a = RunnerProcess::with_plugins(&redis, &args);
    runners_holding_shards(&a.url, 1).await;
    let b = RunnerProcess::with_plugins(&redis, &args);
    let n = 3000;
    let first = now_ms() + 1500;
    let due = stream(&a.url, first, n).await;
    // killed in the middle of the stream, while it holds tasks claimed ahead
    eventually(Duration::from_secs(20), "tasks claimed ahead", || async {
        let ahead = metric(&a.url, "eggtimer_claimed_ahead_total").await;
        (ahead.unwrap_or(0.0) >= 200.0).then_some(())
    })
    .await;
    a.kill();
    let runs = wait_runs(&redis, n, Duration::from_secs(40)).await;
    each_once_on_time(&runs, &due, &HashSet::new());
    drop(b);
}

/// `n` tasks of `bench-record` due one every 20 ms from a second on (ids `k0`…, of the owner
/// `owner(i)` where it names one), scheduled through the first of the runners at `bases`, once
/// they have claimed 20 of them ahead: their due times.
async fn paced_stream(
    bases: &[&str],
    n: usize,
    owner: &dyn Fn(usize) -> Option<&'static str>,
) -> HashMap<String, i64> {
    let first = now_ms() + 1000;
    let mut due = HashMap::new();
    let specs: Vec<Value> = (0..n)
        .map(|i| {
            let id = format!("k{i}");
            let at = first + i as i64 * 20;
            due.insert(id.clone(), at);
            let mut spec = json!({"plugin": "bench-record", "id": id, "run_at": at, "payload": {}});
            if let Some(o) = owner(i) {
                spec["owner"] = json!(o);
            }
            spec
        })
        .collect();
    post_tasks(bases[0], json!(specs)).await;
    eventually(Duration::from_secs(20), "tasks claimed ahead", || async {
        let mut ahead = 0.0;
        for base in bases {
            ahead += metric(base, "eggtimer_claimed_ahead_total")
                .await
                .unwrap_or(0.0);
        }
        (ahead >= 20.0).then_some(())
    })
    .await;
    due
}

/// An owner's shift and an owner's cancel reach its tasks claimed ahead as well (revoked from the
/// runner holding them): a slow stream of two owners' tasks claimed about a second ahead; `acme`'s
/// tasks are shifted 3 s later and `zeta`'s cancelled. None of acme's tasks starts at its old time
/// after the shift was answered (beyond 50 ms, for a start already under way), each runs once at
/// its old time before that or at its new time after; none of zeta's starts after its cancel was
/// answered; the runner counts the revocations; every task runs once, none early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owners_shift_and_cancel_revoke_its_tasks_claimed_ahead() {
    let redis = RedisServer::start();
    let runner = RunnerProcess::with_plugins(&redis, &["--shards", "1", "--claim-ahead", "1s"]);
    let n = 150;
    let owner_of = |i: usize| if i.is_multiple_of(2) { "acme" } else { "zeta" };
    let due = paced_stream(&[&runner.url], n, &|i| Some(owner_of(i))).await;
    let owner = |o: &str| format!("{}/v1/owners/{o}", runner.url);
    let (s, b) = call(
        "POST",
        &format!("{}/shift", owner("acme")),
        Some(json!({"shift_ms": 3000})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let shifted_at = now_ms();
    let (s, b) = call("DELETE", &format!("{}/tasks", owner("zeta")), None).await;
    assert_eq!(s, 200, "{b}");
    let cancelled_at = now_ms();
    let revoked = metric(&runner.url, "eggtimer_revoked_total").await;
    assert!(
        revoked.unwrap_or(0.0) >= 10.0,
        "the shift and the cancel revoked the tasks claimed ahead: {revoked:?}"
    );
    let acme = (0..n).filter(|&i| owner_of(i) == "acme").count();
    // every acme task runs, once; the zeta tasks that started before the cancel ran
    let runs = eventually(Duration::from_secs(30), "acme's tasks to run", || async {
        let r = runs(&redis);
        let ran = (0..n)
            .filter(|&i| owner_of(i) == "acme" && r.contains_key(&format!("k{i}")))
            .count();
        (ran == acme).then_some(r)
    })
    .await;
    for i in 0..n {
        let id = format!("k{i}");
        let Some(ats) = runs.get(&id) else {
            assert_eq!(owner_of(i), "zeta", "{id} never ran");
            continue;
        };
        assert_eq!(ats.len(), 1, "{id} ran {} times", ats.len());
        let (at, old) = (ats[0], due[&id]);
        assert!(at >= old, "{id} started {} ms early", old - at);
        if owner_of(i) == "acme" {
            assert!(
                at < shifted_at + 50 || at >= old + 3000,
                "{id} started at {at}, its old time {old}, after the shift was answered at {shifted_at}"
            );
        } else {
            assert!(
                at < cancelled_at + 50,
                "{id} started at {at}, after its owner's cancel was answered at {cancelled_at}"
            );
        }
    }
}

/// A pause reaches tasks already claimed: a slow stream (one task every 20 ms) is claimed
/// about 320 ms ahead under `--claim-ahead 1s`; none of it starts once the pause is answered
/// (beyond the moment the runner takes to hear of it), and after the resume every task runs
/// once, none early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_holds_back_tasks_already_claimed_ahead() {
    let redis = RedisServer::start();
    let runner = RunnerProcess::with_plugins(&redis, &["--shards", "1", "--claim-ahead", "1s"]);
    let n = 150;
    let due = paced_stream(&[&runner.url], n, &|_| None).await;
    let plugin = format!("{}/v1/plugins/bench-record", runner.url);
    let (s, b) = call("POST", &format!("{plugin}/pause"), None).await;
    assert_eq!(s, 200, "{b}");
    let paused_at = now_ms();
    // what it held ahead would have started within the next ~320 ms
    tokio::time::sleep(Duration::from_millis(600)).await;
    let started = runs(&redis);
    let late: Vec<(&String, i64)> = started
        .iter()
        .map(|(id, ats)| (id, ats[0]))
        .filter(|&(_, at)| at > paused_at + 50)
        .collect();
    assert!(
        late.is_empty(),
        "started more than 50 ms after the pause was answered: {late:?}"
    );
    let before = started.len();
    assert!(
        before < n - 20,
        "the pause came with most of the stream to go: {before}"
    );
    let (s, b) = call("POST", &format!("{plugin}/resume"), None).await;
    assert_eq!(s, 200, "{b}");
    let runs = wait_runs(&redis, n, Duration::from_secs(30)).await;
    each_once_on_time(&runs, &due, &HashSet::new());
}

/// An owner's pause holds back its tasks already claimed, as a plugin's does: a stream of two
/// owners' tasks claimed ~320 ms ahead; after `acme`'s pause is answered none of its tasks
/// starts later than 50 ms after it, while `zeta`'s keep starting; after the resume each of the
/// 150 runs once, none early. (Before every runner kept the owners' pauses, a task claimed
/// before the pause ran anyway.)
#[tokio::test]
async fn an_owners_pause_holds_back_its_tasks_already_claimed_ahead() {
    let redis = RedisServer::start();
    let runner = RunnerProcess::with_plugins(&redis, &["--shards", "1", "--claim-ahead", "1s"]);
    let n = 150;
    let owner_of = |i: usize| if i.is_multiple_of(2) { "acme" } else { "zeta" };
    let due = paced_stream(&[&runner.url], n, &|i| Some(owner_of(i))).await;
    let owner = format!("{}/v1/owners/acme", runner.url);
    let (s, b) = call("POST", &format!("{owner}/pause"), None).await;
    assert_eq!(s, 200, "{b}");
    let paused_at = now_ms();
    // what it held ahead would have started within the next ~320 ms
    tokio::time::sleep(Duration::from_millis(600)).await;
    let started = runs(&redis);
    let first_start = |i: usize| started.get(&format!("k{i}")).map(|ats| ats[0]);
    let late: Vec<(usize, i64)> = (0..n)
        .filter(|&i| owner_of(i) == "acme")
        .filter_map(|i| Some((i, first_start(i)?)))
        .filter(|&(_, at)| at > paused_at + 50)
        .collect();
    assert!(
        late.is_empty(),
        "acme's tasks started more than 50 ms after its pause was answered: {late:?}"
    );
    let others = (0..n)
        .filter(|&i| owner_of(i) == "zeta")
        .filter_map(first_start)
        .filter(|&at| at > paused_at + 50)
        .count();
    assert!(others > 0, "zeta's tasks kept starting");
    assert!(
        started.len() < n - 20,
        "the pause came with most of the stream to go: {}",
        started.len()
    );
    let (s, b) = call("POST", &format!("{owner}/resume"), None).await;
    assert_eq!(s, 200, "{b}");
    let runs = wait_runs(&redis, n, Duration::from_secs(30)).await;
    each_once_on_time(&runs, &due, &HashSet::new());
}
