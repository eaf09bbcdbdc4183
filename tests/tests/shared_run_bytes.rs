//! What a team's plugins' runs make Redis keep, their kv and their emitted streams, is bounded
//! per team (`--team-kv-bytes`, `--team-emitted-bytes`) however many plugins the team uploads,
//! tried as a team with a developer key of its own; another team's runs meanwhile keep what their
//! own bounds allow. (Before, each plugin had its bounds and a team as many plugins as its key's
//! patterns let it upload.)

use std::time::Duration;

use eggtimer_tests::as_key::{ADMIN, make_key, req, upload_as};
use eggtimer_tests::{RedisServer, RunnerProcess, eventually, plugin_wasm};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(60);

/// Schedules `n` tasks of `plugin` (ids `<prefix><i>`, one attempt each) as `bearer`, due in
/// 300 ms: past the 250 ms a runner trusts its read of a team's bytes, so their runs see what
/// the runs before them left.
async fn schedule(
    base: &str,
    bearer: &str,
    plugin: &str,
    prefix: &str,
    n: usize,
    payload: &dyn Fn(usize) -> Value,
) {
    let tasks: Vec<Value> = (0..n)
        .map(|i| {
            json!({"plugin": plugin, "id": format!("{prefix}{i}"), "max_attempts": 1,
                        "delay_ms": 300, "payload": payload(i)})
        })
        .collect();
    let (s, t) = req(
        "POST",
        &format!("{base}/v1/tasks"),
        Some(bearer),
        Some(json!(tasks)),
    )
    .await;
    assert_eq!(s, 201, "{t}");
}

/// Waits until the `n` tasks `<prefix><i>` have ended; their records, done or dead.
async fn ended(base: &str, prefix: &str, n: usize) -> Vec<Value> {
    eventually(T, &format!("the tasks {prefix}* to end"), || async {
        let mut out = Vec::new();
        for i in 0..n {
            let (s, t) = req(
                "GET",
                &format!("{base}/v1/tasks/{prefix}{i}"),
                Some(ADMIN),
                None,
            )
            .await;
            if s != 200 || !(t["state"] == "done" || t["state"] == "dead") {
                return None;
            }
            out.push(t);
        }
        Some(out)
    })
    .await
}

fn done(tasks: &[Value]) -> usize {
    tasks.iter().filter(|t| t["state"] == "done").count()
}

fn kv_bytes(redis: &RedisServer, plugin: &str) -> u64 {
    redis::cmd("GET")
        .arg(format!("{{eggtimer}}:plugin:kv-bytes:{plugin}"))
        .query::<Option<u64>>(&mut redis.conn())
        .unwrap()
        .unwrap_or(0)
}

/// The bytes of a plugin's `bench` stream's entries (fields and values), as Redis holds them.
fn stream_bytes(redis: &RedisServer, plugin: &str) -> usize {
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(format!("{{eggtimer}}:events:{plugin}:bench"))
        .arg("-")
        .arg("+")
        .query(&mut redis.conn())
        .unwrap();
    entries
        .iter()
        .flat_map(|(_, fields)| fields.iter().map(|(k, v)| k.len() + v.len()))
        .sum()
}

/// A team's two plugins write 64 KiB kv entries under `--team-kv-bytes 1MiB` (each plugin's own
/// bound, `--kv-max-bytes`, 64 MiB): the first keeps 12, the second only the 3 that fit beside
/// them, its other runs failing with an error naming the team's budget and nothing of them
/// written; another team's plugin keeps all 12 of its own. Deleting the first plugin gives the
/// room back.
#[tokio::test]
async fn a_teams_plugins_keep_no_more_kv_together_than_its_budget() {
    let redis = RedisServer::start();
    let r = RunnerProcess::start(
        &redis.url(),
        &["--token", ADMIN, "--team-kv-bytes", "1048576"],
    );
    let base = r.url.as_str();
    let (_, dev) = make_key(base, "team-a", "developer", &["fl-*"]).await;
    for p in ["fl-1", "fl-2"] {
        let (s, up) = upload_as(base, &dev, p, plugin_wasm("test-flood")).await;
        assert_eq!(s, 201, "{up}");
    }
    let (s, up) = upload_as(base, ADMIN, "other", plugin_wasm("test-flood")).await;
    assert_eq!(s, 201, "{up}");
    let one = |i: usize| json!({"what": "kv-one", "id": format!("k{i:02}")});

    schedule(base, &dev, "fl-1", "a", 12, &one).await;
    assert_eq!(done(&ended(base, "a", 12).await), 12);
    schedule(base, &dev, "fl-2", "b", 12, &one).await;
    schedule(base, ADMIN, "other", "c", 12, &one).await;
    let b = ended(base, "b", 12).await;
    assert_eq!(
        done(&b),
        3,
        "fl-2 kept what fits beside fl-1's 12 entries: {b:?}"
    );
    for t in b.iter().filter(|t| t["state"] == "dead") {
        let error = t["last_error"].as_str().unwrap_or_default();
        assert!(
            error.contains("--team-kv-bytes") && error.contains("1048576"),
            "the error names the team's budget: {error}"
        );
    }
    assert_eq!(
        done(&ended(base, "c", 12).await),
        12,
        "another team keeps its own"
    );
    let team = kv_bytes(&redis, "fl-1") + kv_bytes(&redis, "fl-2");
    assert!(team <= 1 << 20, "team a keeps {team} bytes of kv");
    assert!(
        team > (1 << 20) - 2 * 65_600,
        "team a keeps only {team} bytes of kv"
    );
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("{eggtimer}:kv:fl-2:*")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(
        keys.len(),
        3,
        "what a refused run would have written is not there"
    );
    assert!(kv_bytes(&redis, "other") > 12 * 65_536);

    // the first plugin deleted (its kv with it): the second writes again
    let (s, t) = req(
        "DELETE",
        &format!("{base}/v1/plugins/fl-1"),
        Some(&dev),
        None,
    )
    .await;
    assert_eq!(s, 204, "{t}");
    eventually(T, "fl-1's kv to be deleted", || async {
        (kv_bytes(&redis, "fl-1") == 0).then_some(())
    })
    .await;
    schedule(
        base,
        &dev,
        "fl-2",
        "d",
        10,
        &|i| json!({"what": "kv-one", "id": format!("again{i}")}),
    )
    .await;
    assert_eq!(done(&ended(base, "d", 10).await), 10);
}

/// A team's two plugins emit 50 KB events under `--team-emitted-bytes 1MiB` (each plugin's own
/// bound 64 MiB): the first alone keeps 1 MiB; the second, beside it, keeps its equal share
/// (512 KiB) and every run of it is done; when the first emits again it drops its oldest entries
/// down to what the second leaves, so the team's streams hold at most the budget again. Another
/// team's only plugin keeps its own team's 1 MiB of its 1.5 MB.
#[tokio::test]
async fn a_teams_emitted_streams_hold_no_more_together_than_its_budget() {
    let redis = RedisServer::start();
    let r = RunnerProcess::start(
        &redis.url(),
        &["--token", ADMIN, "--team-emitted-bytes", "1048576"],
    );
    let base = r.url.as_str();
    let (_, dev) = make_key(base, "team-a", "developer", &["rec-*"]).await;
    for p in ["rec-1", "rec-2"] {
        let (s, up) = upload_as(base, &dev, p, plugin_wasm("bench-record")).await;
        assert_eq!(s, 201, "{up}");
    }
    let (s, up) = upload_as(base, ADMIN, "other", plugin_wasm("bench-record")).await;
    assert_eq!(s, 201, "{up}");
    let blob = "e".repeat(50_000);
    let big = |_: usize| json!({"blob": blob});

    schedule(base, &dev, "rec-1", "a", 30, &big).await;
    assert_eq!(done(&ended(base, "a", 30).await), 30);
    let first = stream_bytes(&redis, "rec-1");
    assert!(
        first <= 1 << 20 && first > (1 << 20) - 60_000,
        "rec-1 alone keeps {first} bytes"
    );

    schedule(base, &dev, "rec-2", "b", 30, &big).await;
    schedule(base, ADMIN, "other", "c", 30, &big).await;
    assert_eq!(
        done(&ended(base, "b", 30).await),
        30,
        "every run of rec-2 is done"
    );
    let second = stream_bytes(&redis, "rec-2");
    assert!(
        second <= 1 << 19 && second > (1 << 19) - 60_000,
        "rec-2 keeps its equal share: {second} bytes"
    );
    assert_eq!(done(&ended(base, "c", 30).await), 30);
    // the admin's plugin is a team of its own: its own budget, whatever team a holds
    let other = stream_bytes(&redis, "other");
    assert!(
        other <= 1 << 20 && other > (1 << 20) - 60_000,
        "another team keeps its own budget: {other} bytes"
    );

    // the first emits again: it drops its own oldest down to what the second leaves
    schedule(base, &dev, "rec-1", "d", 5, &big).await;
    assert_eq!(done(&ended(base, "d", 5).await), 5);
    let first = stream_bytes(&redis, "rec-1");
    let team = first + stream_bytes(&redis, "rec-2");
    assert!(
        team <= 1 << 20,
        "team a's streams hold {team} bytes (rec-1 {first})"
    );
}

/// An admin gives one team budgets of its own on its key (`kv_bytes`, `emitted_bytes`), below the
/// flags' 64 MiB: the team's only plugin keeps 7 kv entries of 64 KiB under 512 KiB, its other
/// runs failing with an error naming the key's budget; its stream holds at most 256 KiB. The
/// key's budget lifted (`null`), the flag's applies again at once (the runner that took the
/// change forgets what it read). Another team meanwhile keeps what the flags allow.
#[tokio::test]
async fn a_keys_own_kv_and_emitted_budgets_bound_its_team_and_null_gives_the_flags_back() {
    let redis = RedisServer::start();
    let r = RunnerProcess::start(&redis.url(), &["--token", ADMIN]);
    let base = r.url.as_str();
    let (id, dev) = make_key(base, "team-b", "developer", &["b-*"]).await;
    let (s, k) = req(
        "PATCH",
        &format!("{base}/v1/keys/{id}"),
        Some(ADMIN),
        Some(json!({"kv_bytes": 524_288, "emitted_bytes": 262_144})),
    )
    .await;
    assert_eq!(s, 200, "{k}");
    assert_eq!(
        (&k["kv_bytes"], &k["emitted_bytes"]),
        (&json!(524_288), &json!(262_144))
    );
    // a developer can't give itself more
    let (s, t) = req(
        "PATCH",
        &format!("{base}/v1/keys/{id}"),
        Some(&dev),
        Some(json!({"kv_bytes": null})),
    )
    .await;
    assert_eq!(s, 403, "{t}");
    for (p, wasm) in [("b-kv", "test-flood"), ("b-rec", "bench-record")] {
        let (s, up) = upload_as(base, &dev, p, plugin_wasm(wasm)).await;
        assert_eq!(s, 201, "{up}");
    }
    let (s, up) = upload_as(base, ADMIN, "other", plugin_wasm("test-flood")).await;
    assert_eq!(s, 201, "{up}");
    let one = |i: usize| json!({"what": "kv-one", "id": format!("k{i:02}")});

    schedule(base, &dev, "b-kv", "a", 12, &one).await;
    schedule(base, ADMIN, "other", "c", 12, &one).await;
    let a = ended(base, "a", 12).await;
    assert_eq!(done(&a), 7, "b-kv kept what fits in 512 KiB: {a:?}");
    for t in a.iter().filter(|t| t["state"] == "dead") {
        let error = t["last_error"].as_str().unwrap_or_default();
        assert!(
            error.contains("kv_bytes") && error.contains("524288"),
            "the error names the key's budget: {error}"
        );
    }
    assert!(kv_bytes(&redis, "b-kv") <= 524_288);
    assert_eq!(
        done(&ended(base, "c", 12).await),
        12,
        "another team keeps its own"
    );

    let blob = "e".repeat(50_000);
    schedule(base, &dev, "b-rec", "e", 12, &|_| json!({"blob": blob})).await;
    assert_eq!(done(&ended(base, "e", 12).await), 12);
    let held = stream_bytes(&redis, "b-rec");
    assert!(
        held <= 262_144 && held > 262_144 - 60_000,
        "b-rec's stream holds {held} bytes"
    );

    // lifted: the flag's 64 MiB again
    let (s, k) = req(
        "PATCH",
        &format!("{base}/v1/keys/{id}"),
        Some(ADMIN),
        Some(json!({"kv_bytes": null, "emitted_bytes": null})),
    )
    .await;
    assert_eq!(s, 200, "{k}");
    assert!(
        k.get("kv_bytes").is_none() && k.get("emitted_bytes").is_none(),
        "{k}"
    );
    schedule(
        base,
        &dev,
        "b-kv",
        "d",
        5,
        &|i| json!({"what": "kv-one", "id": format!("again{i}")}),
    )
    .await;
    assert_eq!(done(&ended(base, "d", 5).await), 5);
}
