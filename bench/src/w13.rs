//! W13 owners: one owner's burst of a plugin's tasks due at once, another owner's tasks of the
//! same plugin falling due while it runs. With owners' turns the other owner's tasks wait for a
//! few claims, not for the burst.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use eggtimer::clock::system_ms as now_ms;
use eggtimer::store::NewTask;

use crate::recorder::{Recorder, count};
use crate::report::{self, lateness, round};
use crate::w6::count_from;
use crate::workloads::{Bench, schedule_all};

/// Owner a's tasks, all due at once.
const BIG_N: usize = 200_000;
/// Owner b's tasks: the first due this long after a's, then one every 10 ms (over 2 s).
const SMALL_N: usize = 200;
const SMALL_AFTER_MS: i64 = 500;
const SMALL_EVERY_MS: i64 = 10;

fn task(i: usize, owner: &str, run_at: i64) -> NewTask {
    NewTask {
        // (the recorder counts the runs of tasks `b<i>`)
        id: format!("b{i}"),
        plugin: "noop".into(),
        payload: "null".into(),
        run_at,
        owner: Some(owner.into()),
        max_attempts: 5,
        ..Default::default()
    }
}

impl Bench {
    /// W13: owner a's 200,000 `noop` tasks due at once; from 0.5 s later owner b's 200, one
    /// every 10 ms. Default flags. b's lateness, a's rate.
    pub async fn w13(&self) -> Result<report::W13> {
        self.flush().await?;
        let start = now_ms() + 5_000;
        let mut dues = vec![start; BIG_N];
        dues.extend((0..SMALL_N as i64).map(|i| start + SMALL_AFTER_MS + i * SMALL_EVERY_MS));
        let specs: Vec<NewTask> = dues
            .iter()
            .enumerate()
            .map(|(i, &d)| task(i, if i < BIG_N { "a" } else { "b" }, d))
            .collect();
        let rec = Recorder::new(Arc::clone(&self.plugins), dues.len());
        schedule_all(&self.store, specs).await?;
        if now_ms() > start {
            bail!("scheduling W13's tasks took longer than 5 s");
        }
        let runner = self.runner(Arc::clone(&rec));
        self.finish(runner, &rec, Duration::from_secs(120)).await?;
        let c = count(&rec, &dues);
        let small = count_from(&rec, &dues, BIG_N);
        let big_span_s = (0..BIG_N)
            .filter_map(|i| rec.start_us(i))
            .fold((i64::MAX, 0), |(lo, hi), s| (lo.min(s), hi.max(s)));
        let span_s = (big_span_s.1 - big_span_s.0) as f64 / 1e6;
        Ok(report::W13 {
            workload: "W13",
            big_n: BIG_N,
            small_n: SMALL_N,
            small_lateness_ms: lateness(&small),
            big_per_s: round(BIG_N as f64 / span_s.max(1e-9)),
            outcomes: c.outcomes,
        })
    }
}
