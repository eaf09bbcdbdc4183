//! Recurring schedules as stored: each on its home shard (the shard of its id), a definition
//! (JSON, opaque here), its latest firing and whether it is paused, and its next fire time in the
//! shard's `sched` ZSET (see `lua/recurring.lua`). Firings are created by `lua/fire.lua`, at most once.

use std::collections::HashMap;

use anyhow::{Context, Result, bail};
use futures::future::try_join_all;

use super::{NewTask, Store};

/// A stored schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleRow {
    pub id: String,
    /// The definition, JSON as the caller stored it.
    pub def: String,
    /// The task id of its latest firing.
    pub last: Option<String>,
    pub paused: bool,
    /// When it fires next (None: paused, or it will not fire again).
    pub next: Option<i64>,
}

/// What `schedule_put` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedulePut {
    Created,
    Replaced,
    /// The same definition was there: nothing changed.
    Same,
}

/// A change to a stored schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleOp {
    Pause,
    /// Resume, firing next at this time (None: never).
    Resume(Option<i64>),
    Delete,
}

/// How long a firing stays marked as created when its schedule never recorded it (a runner died
/// between the two steps and no runner came back for this long).
const KEEP_FIRED_MS: i64 = 40 * 24 * 3_600_000;

impl Store {
    fn sched_call(&self, id: &str) -> redis::ScriptInvocation<'_> {
        let shard = self.shard_of(id);
        let mut inv = self.inner.scripts.recurring.prepare_invoke();
        inv.key(self.keys().schedules(shard))
            .key(self.keys().schedule_next(shard));
        inv
    }

    /// Creates or replaces a schedule (a paused one stays paused).
    pub async fn schedule_put(
        &self,
        id: &str,
        def: &str,
        next: Option<i64>,
    ) -> Result<SchedulePut> {
        let mut inv = self.sched_call(id);
        inv.arg("put").arg(id).arg(def).arg(next.unwrap_or(-1));
        let w: String = inv
            .invoke_async(&mut self.conn())
            .await
            .context("schedule put script")?;
        if w != "same" {
            self.wake_scheduler(id).await?;
        }
        Ok(match w.as_str() {
            "created" => SchedulePut::Created,
            "replaced" => SchedulePut::Replaced,
            "same" => SchedulePut::Same,
            other => {
                bail!("the schedule script answered {other:?}, which this runner does not know")
            }
        })
    }

    /// Pauses, resumes or deletes a schedule; false when there is no such schedule.
    pub async fn schedule_op(&self, id: &str, op: ScheduleOp) -> Result<bool> {
        let mut inv = self.sched_call(id);
        match op {
            ScheduleOp::Pause => inv.arg("pause").arg(id),
            ScheduleOp::Resume(next) => inv.arg("resume").arg(id).arg(next.unwrap_or(-1)),
            ScheduleOp::Delete => inv.arg("delete").arg(id),
        };
        let w: String = inv
            .invoke_async(&mut self.conn())
            .await
            .context("schedule script")?;
        if w == "ok" && matches!(op, ScheduleOp::Resume(_)) {
            self.wake_scheduler(id).await?;
        }
        match w.as_str() {
            "ok" => Ok(true),
            "missing" => Ok(false),
            other => {
                bail!("the schedule script answered {other:?}, which this runner does not know")
            }
        }
    }

    /// Tells every runner's scheduler that a schedule changed (it reads the next fire times
    /// again at once).
    async fn wake_scheduler(&self, id: &str) -> Result<()> {
        let _: i64 = redis::cmd("PUBLISH")
            .arg(self.keys().wake_channel())
            .arg(format!("s{}:0", self.shard_of(id)))
            .query_async(&mut self.conn())
            .await
            .context("waking the schedulers")?;
        Ok(())
    }

    /// Moves a schedule from `expected` to its next fire time, recording its latest firing;
    /// false when it was moved meanwhile (another runner, or it was replaced, paused, deleted).
    pub async fn schedule_advance(
        &self,
        id: &str,
        def: &str,
        expected: i64,
        next: Option<i64>,
        last: Option<&str>,
    ) -> Result<bool> {
        let mut inv = self.sched_call(id);
        inv.arg("advance")
            .arg(id)
            .arg(def)
            .arg(expected)
            .arg(next.unwrap_or(-1))
            .arg(last.unwrap_or(""));
        let w: String = inv
            .invoke_async(&mut self.conn())
            .await
            .context("schedule advance script")?;
        match w.as_str() {
            "ok" => Ok(true),
            "moved" | "missing" => Ok(false),
            other => {
                bail!("the schedule script answered {other:?}, which this runner does not know")
            }
        }
    }

    /// One schedule.
    pub async fn schedule_get(&self, id: &str) -> Result<Option<ScheduleRow>> {
        let shard = self.shard_of(id);
        let (def, last, paused, next): (Option<String>, Option<String>, bool, Option<f64>) =
            redis::pipe()
                .cmd("HGET")
                .arg(self.keys().schedules(shard))
                .arg(format!("d:{id}"))
                .cmd("HGET")
                .arg(self.keys().schedules(shard))
                .arg(format!("l:{id}"))
                .cmd("HEXISTS")
                .arg(self.keys().schedules(shard))
                .arg(format!("p:{id}"))
                .cmd("ZSCORE")
                .arg(self.keys().schedule_next(shard))
                .arg(id)
                .query_async(&mut self.conn())
                .await
                .context("reading a schedule")?;
        Ok(def.map(|def| ScheduleRow {
            id: id.to_owned(),
            def,
            last,
            paused,
            next: next.map(|n| n as i64),
        }))
    }

    /// Every schedule of the namespace, by id.
    pub async fn schedule_list(&self) -> Result<Vec<ScheduleRow>> {
        let calls = (0..self.shards()).map(|shard| {
            let mut conn = self.conn();
            async move {
                let (fields, next): (HashMap<String, String>, Vec<(String, f64)>) = redis::pipe()
                    .cmd("HGETALL")
                    .arg(self.keys().schedules(shard))
                    .cmd("ZRANGE")
                    .arg(self.keys().schedule_next(shard))
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query_async(&mut conn)
                    .await?;
                let next: HashMap<String, f64> = next.into_iter().collect();
                let rows: Vec<ScheduleRow> = fields
                    .iter()
                    .filter_map(|(f, def)| {
                        let id = f.strip_prefix("d:")?;
                        Some(ScheduleRow {
                            id: id.to_owned(),
                            def: def.clone(),
                            last: fields.get(&format!("l:{id}")).cloned(),
                            paused: fields.contains_key(&format!("p:{id}")),
                            next: next.get(id).map(|n| *n as i64),
                        })
                    })
                    .collect();
                Ok::<_, anyhow::Error>(rows)
            }
        });
        let mut all = try_join_all(calls)
            .await
            .context("listing schedules")?
            .concat();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(all)
    }

    /// The schedules of `shard` due now by Redis's clock (up to `limit`), with that time and the
    /// shard's earliest next fire time: `(now, [(id, fire time)], earliest)`.
    pub async fn schedules_due(
        &self,
        shard: u32,
        limit: usize,
    ) -> Result<(i64, Vec<(String, i64)>, Option<i64>)> {
        let reply: Vec<redis::Value> = self
            .inner
            .scripts
            .recurring_due
            .key(self.keys().schedule_next(shard))
            .arg(limit)
            .invoke_async(&mut self.conn())
            .await
            .context("reading due schedules")?;
        let int = |v: &redis::Value| -> Result<i64> { Ok(redis::from_redis_value_ref(v)?) };
        let [now, head, rest @ ..] = reply.as_slice() else {
            bail!("the recurring_due script answered {reply:?}, which this runner does not know");
        };
        let due = rest
            .chunks(2)
            .map(|p| match p {
                [id, at] => Ok((redis::from_redis_value_ref::<String>(id)?, int(at)?)),
                _ => bail!("the recurring_due script answered an id without a time"),
            })
            .collect::<Result<_>>()?;
        let head = int(head)?;
        Ok((int(now)?, due, (head >= 0).then_some(head)))
    }

    /// Creates one firing as a scheduled task unless it was created before; true if created now.
    pub async fn fire(&self, task: &NewTask) -> Result<bool> {
        let shard = self.shard_of(&task.id);
        let mut inv = self.shard_script(&self.inner.scripts.fire, shard);
        inv.key(self.keys().fired(shard));
        inv.arg(self.keys().wake_channel())
            .arg(shard)
            .arg(super::task_key(&task.plugin, &task.id))
            .arg(task.run_at)
            .arg(task.max_attempts)
            .arg(&task.plugin)
            .arg(task.owner.as_deref().unwrap_or(""))
            .arg(
                super::record::LastField {
                    extras: super::extras::Extras::of_new(&[], 0, task.priority).as_deref(),
                    traceparent: task.traceparent.as_deref(),
                    start_by: task.start_by,
                    payload: &task.payload,
                }
                .join()
                .as_ref(),
            )
            .arg(KEEP_FIRED_MS);
        let w: String = inv
            .invoke_async(&mut self.conn())
            .await
            .context("fire script")?;
        match w.as_str() {
            "ok" => Ok(true),
            "exists" => Ok(false),
            other => bail!("the fire script answered {other:?}, which this runner does not know"),
        }
    }

    /// Forgets the creation mark of a firing (by its key) its schedule has recorded.
    pub async fn unfire(&self, id: &str) -> Result<()> {
        let shard = self.shard_of(id);
        let _: i64 = redis::cmd("ZREM")
            .arg(self.keys().fired(shard))
            .arg(id)
            .query_async(&mut self.conn())
            .await
            .context("clearing a firing mark")?;
        Ok(())
    }
}
