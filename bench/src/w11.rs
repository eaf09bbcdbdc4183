//! W11 steady maximum: tasks due evenly for 30 s at rising rates (10k, 20k, 40k, 60k, 80k,
//! 100k tasks/s), each rate a W1 of its own; the highest rate whose tasks all ran once, none
//! early, with a lateness p99 of at most 10 ms. Stops at the first rate that misses.

use std::sync::Arc;

use anyhow::Result;

use crate::recorder::Recorder;
use crate::report;
use crate::workloads::Bench;

/// The rates tried, tasks/s, in order.
const RATES: [usize; 6] = [10_000, 20_000, 40_000, 60_000, 80_000, 100_000];
/// How long each rate's tasks fall due.
const SPREAD_S: u32 = 30;
/// The lateness p99 a rate must keep (ms).
const P99_MS: f64 = 10.0;

impl Bench {
    /// W11: each rate's tasks due evenly for 30 s, until one misses.
    pub async fn w11(&self) -> Result<report::W11> {
        let mut steps = Vec::new();
        let mut max_steady_per_s = 0;
        for rate in RATES {
            self.flush().await?;
            let n = rate * SPREAD_S as usize;
            let rec = Recorder::new(Arc::clone(&self.plugins), n);
            let r = self.steady("W11", "noop", rec, n, SPREAD_S).await?;
            let o = &r.outcomes;
            let ok =
                o.missing == 0 && o.duplicates == 0 && o.early == 0 && r.lateness_ms.p99 <= P99_MS;
            steps.push(report::W11Step {
                per_s: rate,
                ok,
                lateness_ms: r.lateness_ms,
                missing: o.missing,
                duplicates: o.duplicates,
                early: o.early,
                redis_cpu_share: r.redis_cpu_share,
                runner_cpu_share: r.runner_cpu_share,
                scripts_per_task: r.scripts_per_task,
            });
            if !ok {
                break;
            }
            max_steady_per_s = rate;
        }
        Ok(report::W11 {
            workload: "W11",
            spread_s: SPREAD_S,
            max_steady_per_s,
            steps,
        })
    }
}
