//! Events in, and the tasks that listen for them (`lua/lib/extras.lua` has the model): each
//! event and each listener lives in the shard of its topic and key (the event shard), each task
//! in its own; what one shard owes another is a message in its `outbox`, written by the script
//! that made it owed and deleted here once delivered. Delivery is at once by the caller, and
//! after [`OUTBOX_GRACE_MS`] by [`Store::sweep_outbox`] when the caller died. Every message's
//! effect is idempotent, so one delivered twice acts once. An event for more listeners than one
//! script hands over is a drain: its listeners are taken aside and handed it a call at a time
//! (`lua/drain.lua`), by the caller, or by the sweeper when the caller died.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use futures::future::try_join_all;
use redis::Value;

use super::tasks::{int, string};
use super::{Debounce, NewTask, Store, cut_calls, public_id, shard_of, task_key};

/// A message older than this is presumed orphaned (its writer died before delivering it).
pub const OUTBOX_GRACE_MS: i64 = 1_000;

/// How many outbox messages one sweep of a shard reads.
const SWEEP_CHUNK: usize = 500;

/// Most messages one call of the listen, deliver or unlisten script takes, and about the most
/// bytes of them (a larger message goes alone): a schedule call's tasks may bring 8
/// listeners each, each message is a task's or a listener's work, and a D message carries its
/// event (500 run deliveries were one call of ~25 ms).
const DELIVER_CHUNK: usize = 100;
const DELIVER_CALL_BYTES: usize = 128 << 10;

/// Most events one call of the publish script takes, and about the most bytes of them (topics,
/// keys and data): 250 events of 60 KB were one call of ~90 ms.
const PUBLISH_CALL_EVENTS: usize = 250;
const PUBLISH_CALL_BYTES: usize = 128 << 10;

/// One event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub topic: String,
    pub key: String,
    /// JSON text.
    pub data: String,
}

/// What a publish did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Published {
    /// Events stored (all of them).
    pub stored: u64,
    /// Events no task listened for when they arrived.
    pub unmatched: u64,
    /// Tasks cancelled or started by them.
    pub acted: u64,
}

/// An event of a task's lookback that was already there when the task was scheduled: the task
/// was cancelled at once, or runs now (a D message a listen answered with).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Met {
    /// The task's key ([`task_key`]).
    pub task: String,
    pub topic: String,
    pub key: String,
    pub then: super::extras::Then,
}

impl Met {
    /// A D message's task, event and what it does (`D<then>\x1e<task>\x1e<stamp>\x1e<topic>\x1e<key>\x1e<event>`).
    fn of(d: &str) -> Option<Met> {
        let rest = d.strip_prefix('D')?;
        let mut f = rest.splitn(6, '\x1e');
        let then = match f.next()? {
            "c" => super::extras::Then::Cancel,
            "r" => super::extras::Then::Run,
            _ => return None,
        };
        let task = f.next()?.to_owned();
        let _stamp = f.next()?;
        Some(Met {
            task,
            topic: f.next()?.to_owned(),
            key: f.next()?.to_owned(),
            then,
        })
    }
}

/// What a delivery of outbox messages did.
#[derive(Debug, Default)]
pub(super) struct Delivered {
    /// How many tasks D messages cancelled or started.
    pub acted: u64,
    /// The events L messages found already there (their tasks' lookback).
    pub met: Vec<Met>,
}

/// What a debounced schedule did with one task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Debounced {
    /// A new window: a task due in quiet_ms.
    New,
    /// Joined the waiting task, which moved.
    Merged,
    /// The task runs: kept for its next window.
    Queued,
    /// A task of that id that is not debounced runs: nothing written.
    Running,
}

/// A message's target shard: the event shard of L and U, the task's shard of D.
fn target(msg: &str, shards: u32) -> Option<u32> {
    let mut f = msg.get(1..)?.split('\x1e');
    match msg.as_bytes()[0] {
        b'L' | b'D' => {
            let task = f.nth(1)?;
            if msg.starts_with('D') {
                return Some(shard_of(public_id(task), shards));
            }
            let (topic, key) = (f.nth(1)?, f.next()?);
            Some(event_shard(topic, key, shards))
        }
        b'U' => {
            let (topic, key) = (f.next()?, f.next()?);
            Some(event_shard(topic, key, shards))
        }
        _ => None,
    }
}

/// The shard that holds a topic and key's events and listeners.
pub fn event_shard(topic: &str, key: &str, shards: u32) -> u32 {
    shard_of(&format!("{topic}\x1f{key}"), shards)
}

fn strings(v: &[Value]) -> Result<Vec<String>> {
    v.iter().map(string).collect()
}

impl Store {
    /// Publishes events: stored for the lookback, and handed to the tasks listening for them
    /// (cancelled or started before this returns). One script per event shard, then one per
    /// task shard for all their deliveries, then the delivered messages struck from the event
    /// shards' outboxes.
    pub async fn publish(&self, events: &[Event]) -> Result<Published> {
        let mut groups: BTreeMap<u32, Vec<&Event>> = BTreeMap::new();
        for e in events {
            groups
                .entry(event_shard(&e.topic, &e.key, self.shards()))
                .or_default()
                .push(e);
        }
        let retention = self.options().event_retention_ms;
        // each shard's events in calls of at most PUBLISH_CALL_EVENTS and about
        // PUBLISH_CALL_BYTES, one after another (a later event of a topic and key replaces an
        // earlier one), the shards at once
        let calls = groups.into_iter().map(|(shard, evs)| async move {
            let mut out = Vec::new();
            let size = |e: &&Event| e.topic.len() + e.key.len() + e.data.len();
            for call in cut_calls(evs, PUBLISH_CALL_EVENTS, PUBLISH_CALL_BYTES, size) {
                let mut inv = self.shard_script(&self.inner.scripts.publish, shard);
                inv.arg(shard).arg(retention);
                for e in call {
                    inv.arg(&e.topic).arg(&e.key).arg(&e.data);
                }
                let v: Vec<Value> = inv
                    .invoke_async(&mut self.conn())
                    .await
                    .context("publish script")?;
                if v.len() < 2 {
                    anyhow::bail!("the publish script answered {} values", v.len());
                }
                let stored = int(&v[0])? as u64;
                let unmatched = int(&v[1])? as u64;
                out.push((shard, stored, unmatched, strings(&v[2..])?));
            }
            Ok::<_, anyhow::Error>(out)
        });
        let mut recorded: Vec<_> = try_join_all(calls).await?.into_iter().flatten().collect();
        let mut out = Published::default();
        let mut ds = Vec::new();
        let mut drains = Vec::new();
        for (shard, stored, unmatched, d) in &mut recorded {
            out.stored += *stored;
            out.unmatched += *unmatched;
            // an event for more listeners than one call hands over: a drain (P) of its own
            let at = d.iter().position(|m| m.starts_with('P')).unwrap_or(d.len());
            drains.extend(d.split_off(at).into_iter().map(|p| (*shard, p)));
            ds.extend(d.iter().cloned());
        }
        if ds.is_empty() && drains.is_empty() {
            return Ok(out);
        }
        eggtimer_base::failpoint::hit("events-recorded");
        out.acted = self.deliver(&ds).await?.acted;
        try_join_all(
            recorded
                .iter()
                .filter(|r| !r.3.is_empty())
                .map(|(shard, _, _, d)| self.outbox_done(*shard, d)),
        )
        .await?;
        for (shard, p) in drains {
            out.acted += self.drain(shard, &p).await?;
        }
        Ok(out)
    }

    /// Hands an event to the listeners a publish took aside (its P message on the event shard
    /// `shard`), `lua/drain.lua`'s number at a time, until none is left; how many tasks it
    /// cancelled or started. A caller that dies midway leaves the rest to the outbox sweeper.
    async fn drain(&self, shard: u32, p: &str) -> Result<u64> {
        let mut acted = 0;
        loop {
            let v: Vec<Value> = self
                .shard_script(&self.inner.scripts.drain, shard)
                .arg(p)
                .invoke_async(&mut self.conn())
                .await
                .context("drain script")?;
            let done = string(v.first().context("an empty drain reply")?)? == "1";
            let ds = strings(&v[1..])?;
            if !ds.is_empty() {
                acted += self.deliver(&ds).await?.acted;
                self.outbox_done(shard, &ds).await?;
                eggtimer_base::failpoint::hit("events-drained");
            }
            if done {
                return Ok(acted);
            }
        }
    }

    /// Strikes delivered messages from a shard's outbox.
    async fn outbox_done(&self, shard: u32, msgs: &[String]) -> Result<()> {
        let () = redis::cmd("ZREM")
            .arg(&self.keys().shard(shard).outbox)
            .arg(msgs)
            .query_async(&mut self.conn())
            .await?;
        Ok(())
    }

    /// Charges `bytes` of events to the API key `key_id`'s budget, `limit` bytes within the
    /// event retention: Ok(bytes within it now), or Err(bytes within it already) with nothing
    /// charged when this would pass the limit.
    pub async fn charge_events(
        &self,
        key_id: &str,
        bytes: u64,
        limit: u64,
    ) -> Result<std::result::Result<u64, u64>> {
        let retention = self.options().event_retention_ms.max(1);
        // about 60 buckets over the retention, none shorter than a second
        let bucket = (retention / 60).max(1_000);
        let (ok, used): (i64, u64) = self
            .inner
            .scripts
            .event_budget
            .key(self.keys().event_budget(key_id))
            .arg(bytes)
            .arg(limit)
            .arg(retention)
            .arg(bucket)
            .invoke_async(&mut self.conn())
            .await
            .context("the event budget script")?;
        Ok(if ok == 1 { Ok(used) } else { Err(used) })
    }

    /// Delivers messages the outbox of `from` holds, then deletes them there.
    pub(super) async fn deliver_from(&self, from: u32, msgs: Vec<String>) -> Result<Delivered> {
        if msgs.is_empty() {
            return Ok(Delivered::default());
        }
        let done = self.deliver(&msgs).await?;
        self.outbox_done(from, &msgs).await?;
        Ok(done)
    }

    /// Delivers messages to their shards: L to listen, D to deliver (then their U messages
    /// from the task shards), U to unlisten.
    async fn deliver(&self, msgs: &[String]) -> Result<Delivered> {
        let mut done = Delivered::default();
        let mut todo: Vec<String> = msgs.to_vec();
        // L messages answer D messages, D messages answer U messages (written to the task
        // shard's outbox, deleted there once delivered): at most three rounds
        while !todo.is_empty() {
            let mut groups: BTreeMap<(u8, u32), Vec<String>> = BTreeMap::new();
            for m in todo.drain(..) {
                match target(&m, self.shards()) {
                    Some(shard) => groups.entry((m.as_bytes()[0], shard)).or_default().push(m),
                    None => {
                        tracing::warn!(message = %m.escape_debug(), "an outbox message this runner does not know")
                    }
                }
            }
            let channel = self.keys().wake_channel();
            let calls = groups.into_iter().flat_map(|((kind, shard), ms)| {
                cut_calls(ms, DELIVER_CHUNK, DELIVER_CALL_BYTES, String::len)
                    .into_iter()
                    .map(move |c| (kind, shard, c))
            });
            let calls = calls.map(|(kind, shard, ms)| {
                let channel = channel.clone();
                async move {
                    let script = match kind {
                        b'L' => &self.inner.scripts.listen,
                        b'D' => &self.inner.scripts.deliver,
                        _ => &self.inner.scripts.unlisten,
                    };
                    let mut inv = self.shard_script(script, shard);
                    if kind == b'D' {
                        inv.arg(&channel).arg(shard);
                    }
                    inv.arg(&ms);
                    let v: Value = inv
                        .invoke_async(&mut self.conn())
                        .await
                        .with_context(|| format!("the {} script", kind as char))?;
                    let (n, next) = match (kind, v) {
                        (b'L', Value::Array(ds)) => (0, strings(&ds)?),
                        (b'D', Value::Array(v)) => {
                            let n = int(v.first().context("an empty deliver reply")?)? as u64;
                            eggtimer_base::failpoint::hit("events-delivered");
                            let us = strings(&v[1..])?;
                            // the U messages are the task shard's to delete once delivered
                            if !us.is_empty() {
                                let g = Box::pin(self.deliver_from(shard, us));
                                g.await?;
                            }
                            (n, Vec::new())
                        }
                        (b'U', _) => (0, Vec::new()),
                        (k, other) => {
                            anyhow::bail!("the {} script answered {other:?}", k as char)
                        }
                    };
                    Ok::<_, anyhow::Error>((n, next))
                }
            });
            for (n, next) in try_join_all(calls).await? {
                done.acted += n;
                // only a listen answers with D messages: events its tasks met at once
                done.met.extend(next.iter().filter_map(|d| Met::of(d)));
                todo.extend(next);
            }
        }
        Ok(done)
    }

    /// Delivers what a shard's outbox has held for longer than [`OUTBOX_GRACE_MS`] (its writer
    /// died before delivering it), and drops the shard's expired events. Returns how many
    /// messages it delivered.
    pub async fn sweep_outbox(&self, shard: u32) -> Result<usize> {
        let k = self.keys().shard(shard);
        let now = self.redis_time_ms().await?;
        // what a ZSET of message -> time has held past the grace, a sweep's worth
        let orphaned = |key: String| async move {
            redis::cmd("ZRANGEBYSCORE")
                .arg(key)
                .arg("-inf")
                .arg(now - OUTBOX_GRACE_MS)
                .arg("LIMIT")
                .arg(0)
                .arg(SWEEP_CHUNK)
                .query_async::<Vec<String>>(&mut self.conn())
                .await
        };
        let msgs = orphaned(k.outbox.clone()).await?;
        let n = msgs.len();
        self.deliver_from(shard, msgs).await?;
        for p in &orphaned(k.drains()).await? {
            self.drain(shard, p).await?;
        }
        // no events: the script only drops expired ones
        let mut inv = self.shard_script(&self.inner.scripts.publish, shard);
        let _: Vec<Value> = inv
            .arg(shard)
            .arg(self.options().event_retention_ms)
            .invoke_async(&mut self.conn())
            .await
            .context("publish script")?;
        Ok(n)
    }

    /// Schedules debounced tasks: one task per id (see `lua/debounce.lua`). Each shard's tasks
    /// go in order, in calls of at most [`DEBOUNCE_CALL_TASKS`] tasks and about
    /// [`DEBOUNCE_CALL_BYTES`] of payloads, so no call holds Redis longer than those cost
    /// (a batch of 10,000 tasks of one key is many short calls, not one long one).
    pub async fn debounce(&self, tasks: &[NewTask]) -> Result<Vec<Debounced>> {
        let groups = self.by_shard(tasks.iter().map(|t| t.id.as_str()));
        let channel = self.keys().wake_channel();
        let calls = groups.iter().map(|(shard, ix)| {
            let shard = *shard;
            let channel = &channel;
            let mut conn = self.conn();
            async move {
                let mut verdicts = Vec::with_capacity(ix.len());
                for part in debounce_calls(tasks, ix) {
                    let mut inv = self.shard_script(&self.inner.scripts.debounce, shard);
                    inv.arg(channel).arg(shard);
                    for &i in part {
                        let t = &tasks[i];
                        let d = t.debounce.unwrap_or(Debounce {
                            quiet_ms: 0,
                            max_wait_ms: 0,
                        });
                        let marks = super::record::LastField {
                            traceparent: t.traceparent.as_deref(),
                            start_by: t.start_by,
                            extras: None,
                            payload: "",
                        }
                        .join()
                        .into_owned();
                        inv.arg(task_key(&t.plugin, &t.id))
                            .arg(&t.plugin)
                            .arg(t.owner.as_deref().unwrap_or(""))
                            .arg(t.max_attempts)
                            .arg(marks)
                            .arg(&t.payload)
                            .arg(d.quiet_ms)
                            .arg(d.max_wait_ms);
                    }
                    let answer: String = inv
                        .invoke_async(&mut conn)
                        .await
                        .context("debounce script")?;
                    verdicts.extend(super::tasks::letters(
                        "debounce",
                        &answer,
                        part.len(),
                        |c| {
                            Some(match c {
                                b'o' => Debounced::New,
                                b'm' => Debounced::Merged,
                                b'q' => Debounced::Queued,
                                b'r' => Debounced::Running,
                                _ => return None,
                            })
                        },
                    )?);
                }
                Ok::<_, anyhow::Error>((ix, verdicts))
            }
        });
        let mut out = vec![Debounced::New; tasks.len()];
        for (ix, verdicts) in try_join_all(calls).await? {
            for (&i, v) in ix.iter().zip(verdicts) {
                out[i] = v;
            }
        }
        Ok(out)
    }
}

/// The most tasks one call of the debounce script takes.
pub const DEBOUNCE_CALL_TASKS: usize = 32;
/// About the most payload bytes one call of the debounce script takes (a call takes one task
/// at least, whatever its size).
pub const DEBOUNCE_CALL_BYTES: usize = 128 << 10;

/// `ix` (indexes into `tasks`) cut into the runs that one debounce call each takes, in order.
fn debounce_calls<'a>(tasks: &[NewTask], ix: &'a [usize]) -> Vec<&'a [usize]> {
    super::calls_by_size(tasks, ix, DEBOUNCE_CALL_TASKS, DEBOUNCE_CALL_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sized(sizes: &[usize]) -> Vec<NewTask> {
        sizes
            .iter()
            .map(|&n| NewTask {
                payload: "x".repeat(n),
                ..NewTask::default()
            })
            .collect()
    }

    #[test]
    fn debounce_calls_are_cut_by_count_and_bytes_in_order() {
        // 100 small payloads: calls of 32
        let tasks = sized(&[10; 100]);
        let ix: Vec<usize> = (0..100).collect();
        let lens: Vec<usize> = debounce_calls(&tasks, &ix)
            .iter()
            .map(|c| c.len())
            .collect();
        assert_eq!(lens, [32, 32, 32, 4]);
        // 60 KB payloads: two a call (the third would pass 128 KiB); one larger than the
        // bound still goes, alone
        let tasks = sized(&[60_000, 60_000, 60_000, 200_000, 10]);
        let ix: Vec<usize> = (0..5).collect();
        let calls = debounce_calls(&tasks, &ix);
        assert_eq!(calls, [&[0, 1][..], &[2], &[3], &[4]]);
        // the order of the shard's tasks is kept across calls
        let flat: Vec<usize> = calls.concat();
        assert_eq!(flat, ix);
    }
}
