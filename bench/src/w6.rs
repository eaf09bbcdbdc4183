//! W6 neighbours: one plugin's backlog of slow runs, another plugin's quick tasks falling due
//! behind it. With fair share the quick tasks wait for a free worker, not for the backlog.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use eggtimer::clock::system_ms as now_ms;
use eggtimer::store::NewTask;

use crate::recorder::{Recorder, count};
use crate::report::{self, lateness, round};
use crate::workloads::{Bench, schedule_all};

/// The slow plugin's runs, each this long (under the default 1 s time limit).
const SLOW_MS: u64 = 800;
const SLOW_N: usize = 640;
/// The quick tasks: the first due this long after the backlog, then one every 10 ms.
const QUICK_N: usize = 200;
const QUICK_AFTER_MS: i64 = 1_500;
const QUICK_EVERY_MS: i64 = 10;

fn task(i: usize, plugin: &str, payload: String, run_at: i64) -> NewTask {
    NewTask {
        id: format!("b{i}"),
        plugin: plugin.into(),
        payload,
        run_at,
        owner: None,
        max_attempts: 5,
        unique_for_ms: 0,
        traceparent: None,
        start_by: None,
        ..Default::default()
    }
}

impl Bench {
    /// W6: `test-sleep` has 640 runs of 0.8 s due at once; 1.5 s later `noop`'s 200 tasks fall
    /// due, one every 10 ms. Default flags. The quick tasks' lateness, the slow plugin's rate.
    pub async fn w6(&self) -> Result<report::W6> {
        self.flush().await?;
        let start = now_ms() + 1_000;
        let mut dues = vec![start; SLOW_N];
        dues.extend((0..QUICK_N as i64).map(|i| start + QUICK_AFTER_MS + i * QUICK_EVERY_MS));
        let specs: Vec<NewTask> = dues
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                if i < SLOW_N {
                    task(i, "test-sleep", format!(r#"{{"ms":{SLOW_MS}}}"#), d)
                } else {
                    task(i, "noop", "null".into(), d)
                }
            })
            .collect();
        let rec = Recorder::new(Arc::clone(&self.plugins), dues.len());
        schedule_all(&self.store, specs).await?;
        if now_ms() > start {
            bail!("scheduling W6's tasks took longer than a second");
        }
        let runner = self.runner(Arc::clone(&rec));
        // the backlog takes SLOW_N / workers rounds of SLOW_MS
        let rounds = SLOW_N.div_ceil(self.args.workers.max(1)) as u64;
        self.finish(
            runner,
            &rec,
            Duration::from_millis(rounds * SLOW_MS + 60_000),
        )
        .await?;
        let c = count(&rec, &dues);
        let quick = count_from(&rec, &dues, SLOW_N);
        let span_s = (c.last_start_us - c.first_start_us) as f64 / 1e6;
        Ok(report::W6 {
            workload: "W6",
            slow_n: SLOW_N,
            slow_ms: SLOW_MS,
            quick_n: QUICK_N,
            quick_lateness_ms: lateness(&quick),
            slow_per_s: round(SLOW_N as f64 / span_s.max(1e-9)),
            outcomes: c.outcomes,
        })
    }
}

/// The sorted lateness (ms) of tasks `from..` of `dues`.
pub(crate) fn count_from(rec: &Recorder, dues: &[i64], from: usize) -> Vec<f64> {
    let mut late: Vec<f64> = (from..dues.len())
        .filter_map(|i| rec.start_us(i).map(|s| s as f64 / 1000.0 - dues[i] as f64))
        .collect();
    late.sort_by(|a, b| a.total_cmp(b));
    late
}
