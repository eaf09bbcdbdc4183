//! Where and when runs started: a plugin whose events carry each run's start, the wait until
//! every runner holds shards, and how many tasks one runner fired.

use std::time::Duration;

use serde_json::Value;

use crate::{call, eventually, metric, plugin_wasm, read_events, upload};

/// Uploads the `test-sleep` plugin's bytes under `name`: a run sleeps `payload.ms` and emits, on
/// the `sleep` topic, its `tag` and `started_at`, its handler's first instant by the runner's
/// clock (which follows Redis's) — when it started, not when its effects were written.
pub async fn upload_start_reporter(base: &str, name: &str) {
    let (s, b) = upload(base, name, plugin_wasm("test-sleep")).await;
    assert_eq!(s, 201, "uploading {name}: {b}");
}

/// The handler starts of `plugin`'s runs as (tag, started_at), in the order their events were
/// written (a tag seen twice ran twice).
pub fn starts(conn: &mut redis::Connection, plugin: &str) -> Vec<(String, i64)> {
    read_events(conn, &[plugin], "sleep")
        .into_iter()
        .map(|(_, _, d)| {
            let tag = d["tag"].as_str().unwrap_or_default().to_owned();
            let at = d["started_at"].as_i64();
            (tag, at.unwrap_or_else(|| panic!("no started_at in {d}")))
        })
        .collect()
}

/// Waits until `n` runners are listed and each holds at least one shard, so that a test about
/// several runners has every one of them claiming.
pub async fn runners_holding_shards(base: &str, n: usize) {
    let what = format!("{n} runners holding shards");
    eventually(Duration::from_secs(30), &what, || async {
        let (_, rs) = call("GET", &format!("{base}/v1/runners"), None).await;
        let rs = rs.as_array()?;
        let holding = |r: &Value| r["shards"].as_array().is_some_and(|s| !s.is_empty());
        (rs.len() == n && rs.iter().all(holding)).then_some(())
    })
    .await;
}

/// Asserts that each of the two runners at `a` and `b` ran some of `plugin`'s tasks and that
/// together they ran `n` (each runner's own count, from its `/metrics`).
pub async fn both_ran(a: &str, b: &str, plugin: &str, n: u32) {
    let series = format!("eggtimer_tasks_fired_total{{plugin=\"{plugin}\"}}");
    let one = metric(a, &series).await.unwrap_or(0.0);
    let two = metric(b, &series).await.unwrap_or(0.0);
    assert!(
        one > 0.0 && two > 0.0 && one + two == f64::from(n),
        "each runner ran some of the {n}: {one} and {two}"
    );
}
