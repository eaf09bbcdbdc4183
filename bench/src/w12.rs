//! W12 far: `--far` tasks a week ahead with 40-byte payloads, stored in the far tier (the bench's
//! store opened with a one-hour horizon), then W1 beside them; 1,000 of them cancelled by id,
//! timed, against 1,000 live tasks cancelled the same way; 1,000 more moved from a week ahead to
//! due now, one after another, while a runner runs (their lateness from the due time each move
//! set); an owner's 10,000 tasks shifted (live ones: an owned task stays live); shard 0's far
//! tasks moved into the live tier at once, timed (the rate a day falling due asks of the
//! promoter); then W0 through this store, so its tasks (a day ahead) all go far.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::recorder::{Recorder, count};
use crate::report::{self, lateness, round};
use crate::workloads::{Bench, schedule_all, tasks};
use eggtimer::clock::system_ms as now_ms;
use eggtimer::store::{Move, PROMOTE_CHUNK, Store, StoreOptions, task_key};

/// The far horizon W12's store has (ms).
pub const HORIZON_MS: u64 = 3_600_000;
/// A week (ms): the far tasks fall due evenly over the week after it.
const WEEK_MS: i64 = 7 * 86_400_000;
/// Tasks cancelled by id, in each tier; far tasks moved to due now.
const CANCELS: usize = 1000;
const MOVES: usize = 1000;
/// An owner's tasks shifted.
const OWNED: usize = 10_000;

impl Bench {
    /// W12 (the store must have been opened with `HORIZON_MS`).
    pub async fn w12(&self, w1_alone: Option<&report::W1>) -> Result<report::W12> {
        anyhow::ensure!(
            self.store.far_horizon_ms() == HORIZON_MS,
            "W12 wants a store with the far tier"
        );
        self.flush().await?;
        // a store without a horizon (it moves every far task), for the promotion below; opened
        // while Redis is empty (it records the data layout the flush took)
        let all = Store::open(
            self.store.target().clone(),
            StoreOptions {
                far_horizon_ms: 0,
                ..self.store.options().clone()
            },
        )
        .await?;
        let m = self.args.far;
        let before = self.info("memory", "used_memory").await?;
        let start = now_ms() + WEEK_MS;
        let t0 = Instant::now();
        let step = 200_000;
        for from in (0..m).step_by(step) {
            let k = step.min(m - from);
            let dues: Vec<i64> = (0..k)
                .map(|i| start + (from + i) as i64 * WEEK_MS / m as i64)
                .collect();
            let batch = tasks(0, &dues, "noop")
                .into_iter()
                .enumerate()
                .map(|(i, mut t)| {
                    let n = from + i;
                    t.id = format!("f{n}");
                    // 40 bytes
                    t.payload = format!(r#"{{"coupon":"c{n:08}","user":"u{n:07}"}}"#);
                    t
                })
                .collect();
            schedule_all(&self.store, batch).await?;
        }
        let fill_s = t0.elapsed().as_secs_f64();
        // the compaction a runner's promoter does each second, of the slots the fill appended to
        let t1 = Instant::now();
        for shard in 0..self.store.shards() {
            while self.store.compact_far(shard).await? > 0 {}
        }
        let compact_s = t1.elapsed().as_secs_f64();
        let after = self.info("memory", "used_memory").await?;
        let per_task = (after - before) / m as f64;
        // the cancels timed with Redis not rewriting its AOF after the fill (as W3's W1 is)
        let aof_waited_s = self.aof_quiet().await?;
        // 1,000 far tasks cancelled by id, one after another
        let far_ids = (0..m).step_by((m / CANCELS).max(1)).take(CANCELS);
        let far_cancel_us = self.cancel_each(far_ids.map(|i| format!("f{i}"))).await?;
        // 1,000 live ones (due in an hour less a minute: under the horizon) the same way
        let live_due = now_ms() + HORIZON_MS as i64 - 60_000;
        let live = tasks(0, &vec![live_due; CANCELS], "noop")
            .into_iter()
            .enumerate()
            .map(|(i, mut t)| {
                t.id = format!("l{i}");
                t
            })
            .collect();
        schedule_all(&self.store, live).await?;
        let live_cancel_us = self
            .cancel_each((0..CANCELS).map(|i| format!("l{i}")))
            .await?;
        let moved = self.far_moved_now(start).await?;
        // an owner's 10,000 tasks a week ahead (live: an owned task never goes far) shifted
        let owned = tasks(0, &vec![start; OWNED], "noop")
            .into_iter()
            .map(|mut t| {
                t.id = format!("o{}", t.id);
                t.owner = Some("w12-owner".into());
                t
            })
            .collect();
        schedule_all(&self.store, owned).await?;
        let t2 = Instant::now();
        let shifted = self.store.shift_owner("w12-owner", 60_000, None).await?;
        anyhow::ensure!(
            shifted == Ok(OWNED as u64),
            "the owner's shift: {shifted:?}"
        );
        let owner_shift_ms = t2.elapsed().as_secs_f64() * 1000.0;
        // shard 0's far tasks all moved into the live tier, one promotion call after another
        let t3 = Instant::now();
        let mut promoted = 0;
        loop {
            let n = all.promote_far(0).await?;
            promoted += n;
            if n < PROMOTE_CHUNK {
                break;
            }
        }
        let promoted_per_s = promoted as f64 / t3.elapsed().as_secs_f64();
        let w1 = self.w1("W12-W1").await?;
        let ratio = w1_alone
            .map(|a| a.lateness_ms.p99)
            .filter(|a| *a > 0.0)
            .map(|a| round(w1.lateness_ms.p99 / a));
        // W0 again on this store (its tasks a day ahead: all far), after a flush
        let w0_far = self.w0("noop-plain").await?;
        Ok(report::W12 {
            workload: "W12",
            far: m,
            fill_s: round(fill_s),
            compact_s: round(compact_s),
            scheduled_per_s: (m as f64 / fill_s).round(),
            bytes_per_far_task: per_task.round(),
            bytes_beyond_payload: (per_task - 40.0).round(),
            aof_waited_s: round(aof_waited_s),
            far_cancel_us_per_task: far_cancel_us.round(),
            live_cancel_us_per_task: live_cancel_us.round(),
            moved_now: MOVES,
            moved_now_lateness_ms: moved,
            owner_shifted: OWNED,
            owner_shift_ms: round(owner_shift_ms),
            promoted_on_shard_0: promoted,
            promoted_per_s: promoted_per_s.round(),
            w1_beside: w1,
            w0_far,
            p99_ratio_vs_w1_alone: ratio,
        })
    }

    /// `MOVES` far tasks (`b<i>`, due at `due`, a week ahead) moved to due now one after another
    /// while a runner runs; their lateness from the due time each move set.
    async fn far_moved_now(&self, due: i64) -> Result<report::Lateness> {
        schedule_all(&self.store, tasks(0, &vec![due; MOVES], "noop")).await?;
        let rec = Recorder::new(Arc::clone(&self.plugins), MOVES);
        let runner = self.runner(Arc::clone(&rec));
        let mut dues = Vec::with_capacity(MOVES);
        for i in 0..MOVES {
            let key = task_key("noop", &format!("b{i}"));
            match self.store.move_task(&key, Move::Now).await? {
                Ok(at) => dues.push(at),
                Err(e) => anyhow::bail!("the far task b{i} was not moved: {e}"),
            }
        }
        self.finish(runner, &rec, Duration::from_secs(30)).await?;
        let c = count(&rec, &dues);
        anyhow::ensure!(
            c.outcomes.missing == 0 && c.outcomes.duplicates == 0 && c.outcomes.early == 0,
            "far tasks moved to now: {:?}",
            c.outcomes
        );
        Ok(lateness(&c.lateness_ms))
    }

    /// Cancels the `noop` tasks `ids` one after another; µs per cancel.
    async fn cancel_each(&self, ids: impl Iterator<Item = String>) -> Result<f64> {
        let t = Instant::now();
        let mut n = 0;
        for id in ids {
            let r = self.store.cancel(&task_key("noop", &id)).await?;
            anyhow::ensure!(r.is_ok(), "the task {id} was not cancelled: {r:?}");
            n += 1;
        }
        Ok(t.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64)
    }
}
