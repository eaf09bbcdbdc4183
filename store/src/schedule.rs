//! Scheduling: a batch's tasks written per shard by the schedule script, all or none, in calls
//! no bigger than [`SCHEDULE_CALL_TASKS`] tasks and about [`SCHEDULE_CALL_BYTES`] of payloads,
//! so no call holds Redis long whatever one request brings.

use anyhow::{Context, Result, bail};
use futures::future::try_join_all;
use redis::Value;

use super::tasks::{letters, string};
use super::{Met, NewTask, ScheduleMode, Scheduled, Store, task_key};

/// Most tasks, and about the most payload bytes, one call of the schedule script takes: a
/// request's tasks of one shard past them go in several calls, one after another, so no call
/// holds Redis longer than these cost on our 2-core machine (256 KiB of payloads: about 1 ms;
/// 1,000 small tasks took 10–11 ms, 500 take about half of that).
pub const SCHEDULE_CALL_TASKS: usize = 500;
pub const SCHEDULE_CALL_BYTES: usize = 256 << 10;

/// One shard's tasks `ix` cut into calls of the schedule script.
fn schedule_calls<'a>(tasks: &[NewTask], ix: &'a [usize]) -> Vec<&'a [usize]> {
    super::calls_by_size(tasks, ix, SCHEDULE_CALL_TASKS, SCHEDULE_CALL_BYTES)
}

impl Store {
    /// Schedules a batch as one (upserts): every task, or none when one of them is running or
    /// inside its dedup window; then the index of the first such and why. Each call's part is
    /// all or nothing in its script; a batch of several calls (several shards, or more than one
    /// call's worth of tasks: [`SCHEDULE_CALL_BYTES`]) is also checked before anything is written
    /// (per shard, a round trip to learn whether anything there runs or has a dedup window, and
    /// only then a read of the ids), so only a task claimed in the instant between the check and
    /// the write can leave the other calls' part written. Scheduled, the events
    /// of their lookback that some of them met at once (cancelled, or run now).
    pub async fn schedule_all_or_none(
        &self,
        tasks: &[NewTask],
    ) -> Result<Result<Vec<Met>, (usize, Scheduled)>> {
        let Some(first) = tasks.first().map(|t| self.shard_of(&t.id)) else {
            return Ok(Ok(Vec::new()));
        };
        let all: Vec<usize> = (0..tasks.len()).collect();
        if tasks.iter().any(|t| self.shard_of(&t.id) != first)
            || schedule_calls(tasks, &all).len() > 1
        {
            let keys: Vec<String> = tasks.iter().map(|t| task_key(&t.plugin, &t.id)).collect();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            let conflicts = self.conflicts_among(&keys).await?;
            if let Some(refused) = conflicts
                .iter()
                .enumerate()
                .find_map(|(i, c)| c.map(|c| (i, c)))
            {
                return Ok(Err(refused));
            }
        }
        let (verdicts, met) = self.schedule_meeting(tasks, ScheduleMode::Upsert).await?;
        // a running id first, as the check above finds it
        for why in [Scheduled::Running, Scheduled::Duplicate] {
            if let Some(i) = verdicts.iter().position(|v| *v == why) {
                return Ok(Err((i, why)));
            }
        }
        Ok(Ok(met))
    }

    /// Schedules tasks (any number, any shards): one script per shard, sent concurrently.
    /// The verdicts come back in the order of `tasks`.
    pub async fn schedule(&self, tasks: &[NewTask], mode: ScheduleMode) -> Result<Vec<Scheduled>> {
        Ok(self.schedule_meeting(tasks, mode).await?.0)
    }

    /// [`Store::schedule`], and the events of their lookback that tasks met at once (their
    /// listeners are registered, and such an event handed over, before this returns).
    async fn schedule_meeting(
        &self,
        tasks: &[NewTask],
        mode: ScheduleMode,
    ) -> Result<(Vec<Scheduled>, Vec<Met>)> {
        // a claim batch lists its ids tab-separated (the API refuses every control character)
        if let Some(t) = tasks.iter().find(|t| t.id.contains('\t')) {
            bail!("the task id {:?} holds a tab, which no task id may", t.id);
        }
        let groups = self.by_shard(tasks.iter().map(|t| t.id.as_str()));
        // each shard's calls one after another (a later task of an id wins), the shards at once
        let shards = groups.iter().map(|(shard, ix)| async move {
            let mut done = Vec::new();
            for part in schedule_calls(tasks, ix) {
                done.push(self.schedule_call(tasks, *shard, part, mode).await?);
            }
            Ok::<_, anyhow::Error>(done)
        });
        let mut out = vec![Scheduled::Ok; tasks.len()];
        let mut listens = Vec::new();
        for (ix, verdicts, shard, ls) in try_join_all(shards).await?.into_iter().flatten() {
            for (&i, v) in ix.iter().zip(verdicts) {
                out[i] = v;
            }
            if !ls.is_empty() {
                listens.push((shard, ls));
            }
        }
        // the listeners registered (and events of the lookback handed over) before this returns
        if !listens.is_empty() {
            eggtimer_base::failpoint::hit("listeners-written");
        }
        let delivered = try_join_all(
            listens
                .into_iter()
                .map(|(shard, ls)| self.deliver_from(shard, ls)),
        )
        .await?;
        Ok((out, delivered.into_iter().flat_map(|d| d.met).collect()))
    }

    /// One call of the schedule script: the tasks `ix` of `shard`. Returns them with their
    /// verdicts and the listen messages it wrote.
    async fn schedule_call<'a>(
        &self,
        tasks: &[NewTask],
        shard: u32,
        ix: &'a [usize],
        mode: ScheduleMode,
    ) -> Result<(&'a [usize], Vec<Scheduled>, u32, Vec<String>)> {
        let channel = self.keys().wake_channel();
        let mut inv = self.shard_script(&self.inner.scripts.schedule, shard);
        inv.arg(&channel).arg(shard).arg(match mode {
            ScheduleMode::Upsert => "upsert",
            ScheduleMode::IfAbsent => "absent",
        });
        inv.arg(self.inner.opts.far_horizon_ms);
        // runs of consecutive tasks sharing max_attempts, plugin and unique_for_ms: those
        // are sent once per run (the order of the tasks is kept: a later one of an id wins)
        let mut rest = ix;
        while let Some(&first) = rest.first() {
            let f = &tasks[first];
            let len = rest
                .iter()
                .take_while(|&&i| {
                    let t = &tasks[i];
                    (t.max_attempts, &t.plugin, t.unique_for_ms)
                        == (f.max_attempts, &f.plugin, f.unique_for_ms)
                })
                .count();
            inv.arg(len)
                .arg(f.max_attempts)
                .arg(&f.plugin)
                .arg(0)
                .arg(f.unique_for_ms);
            for &i in &rest[..len] {
                let t = &tasks[i];
                inv.arg(task_key(&t.plugin, &t.id))
                    .arg(t.run_at.max(0))
                    .arg(t.owner.as_deref().unwrap_or(""))
                    .arg(
                        super::record::LastField {
                            traceparent: t.traceparent.as_deref(),
                            start_by: t.start_by,
                            extras: super::extras::Extras::of_new(&t.on, t.lookback_ms, t.priority)
                                .as_deref(),
                            payload: &t.payload,
                        }
                        .join()
                        .as_ref(),
                    );
            }
            rest = &rest[len..];
        }
        let answer: Value = inv
            .invoke_async(&mut self.conn())
            .await
            .context("schedule script")?;
        // listening tasks written: {letters, L message...}
        let (answer, listens) = match answer {
            Value::Array(v) if !v.is_empty() => (string(&v[0])?, v[1..].to_vec()),
            other => (string(&other)?, Vec::new()),
        };
        let verdicts = letters("schedule", &answer, ix.len(), Scheduled::from_letter)?;
        let listens = listens.iter().map(string).collect::<Result<Vec<_>>>()?;
        Ok((ix, verdicts, shard, listens))
    }
}
