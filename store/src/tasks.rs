//! A task's life after it is scheduled: claim, renew, finish, move, cancel, replay, owner
//! shift. Each is one Lua script on one shard (see `lua/`), with every key in KEYS.

use std::collections::HashMap;

use anyhow::{Context, Result, bail};
use futures::future::try_join_all;
use redis::Value;

use super::types::Verdict;
use super::{
    ClaimBatch, Claimed, Finish, Finished, Move, Refused, Share, Store, TaskRecord, field_safe,
};

/// The claim script's answer by slot, named as `lua/claim.lua` names them (its `local NOW, …`
/// line, 1-based there): a test holds the two alike.
mod claim_slots {
    pub const NOW: usize = 0;
    pub const NEXT_DUE: usize = 1;
    pub const LEASE_HEAD: usize = 2;
    pub const TOKEN: usize = 3;
    pub const RERUNS: usize = 4;
    pub const SET_ASIDE: usize = 5;
    pub const WAITING: usize = 6;
    pub const OTHERS_HERE: usize = 7;
    pub const OTHERS_DUE: usize = 8;
    pub const NOW_US: usize = 9;
    /// Where the claimed tasks begin (id and record each).
    pub const TASKS: usize = 10;

    /// Each slot's name and place, for the test against the script.
    #[cfg(test)]
    pub const ALL: [(&str, usize); 10] = [
        ("NOW", NOW),
        ("NEXT_DUE", NEXT_DUE),
        ("LEASE_HEAD", LEASE_HEAD),
        ("TOKEN", TOKEN),
        ("RERUNS", RERUNS),
        ("SET_ASIDE", SET_ASIDE),
        ("WAITING", WAITING),
        ("OTHERS_HERE", OTHERS_HERE),
        ("OTHERS_DUE", OTHERS_DUE),
        ("NOW_US", NOW_US),
    ];
}

/// An outcome as the finish script takes it: kind, claim token, value, error.
type Outcome<'a> = (&'a str, u64, i64, &'a str);

/// How long an owner shift's lock in a shard lasts unless its next chunk renews it (a shift
/// whose caller died frees it after this), and how long another shift waits for it.
const SHIFT_LOCK_MS: u64 = 30_000;

impl Store {
    /// Claims up to `limit` due tasks of a shard with a lease of `lease_ms` (after putting tasks
    /// whose lease expired back to due). The claimed tasks share one fresh claim token.
    pub async fn claim(&self, shard: u32, limit: usize, lease_ms: u64) -> Result<ClaimBatch> {
        self.claim_shared(shard, limit, lease_ms, &Share::default())
            .await
    }

    /// A claim that keeps the claiming runner's fair share between plugins (see [`Share`]).
    pub async fn claim_shared(
        &self,
        shard: u32,
        limit: usize,
        lease_ms: u64,
        share: &Share,
    ) -> Result<ClaimBatch> {
        let mut inv = self.shard_script(&self.inner.scripts.claim, shard);
        let mut held = String::new();
        for (plugin, n, weight) in &share.held {
            use std::fmt::Write;
            let _ = write!(held, "{plugin}\t{n}\t{weight}\t");
        }
        inv.arg(limit).arg(lease_ms).arg(held).arg(share.extra);
        inv.arg(share.headroom)
            .arg(share.part)
            .arg(self.inner.opts.priority_aging_ms)
            .arg(share.ahead_ms);
        let v: Vec<Value> = inv
            .invoke_async(&mut self.conn())
            .await
            .context("claim script")?;
        use claim_slots::*;
        if v.len() < TASKS || !(v.len() - TASKS).is_multiple_of(2) {
            bail!("the claim script answered {} values", v.len());
        }
        let now = int(&v[NOW])?;
        let now_us = int(&v[NOW_US])?.clamp(0, 999) as u16;
        let next = int(&v[NEXT_DUE])?;
        let lease = int(&v[LEASE_HEAD])?;
        let token = int(&v[TOKEN])? as u64;
        // the tasks that rerun a lost claim: place among the tasks (1-based) -> first claim
        let mut firsts = HashMap::new();
        let Value::Array(f) = &v[RERUNS] else {
            bail!(
                "the claim script answered {:?} where its reruns belong",
                v[RERUNS]
            );
        };
        for pair in f.chunks_exact(2) {
            let at = int(&pair[0])? as usize;
            let first = string(&pair[1])?;
            let first: u64 = first.parse().with_context(|| {
                format!("the claim script named {first:?} as the first claim of a task")
            })?;
            firsts.insert(at, first);
        }
        let set_aside = int(&v[SET_ASIDE])? as u64;
        let waiting = int(&v[WAITING])?;
        let others_here = int(&v[OTHERS_HERE])? == 1;
        let others_due = int(&v[OTHERS_DUE])?;
        let mut recs = Vec::with_capacity((v.len() - TASKS) / 2);
        for c in v[TASKS..].chunks_exact(2) {
            let id = string(&c[0])?;
            let rec = string(&c[1])?;
            recs.push(TaskRecord::decode(&id, &rec).with_context(|| {
                format!("the claim script returned a record it can't have written for {id:?}")
            })?);
        }
        // a debounced task's payloads are beside its record; it runs with them
        self.load_windows(shard, &mut recs).await?;
        let mut tasks = Vec::with_capacity(recs.len());
        for (i, r) in recs.into_iter().enumerate() {
            let id = r.key;
            let effects_claim = firsts.get(&(i + 1)).copied().unwrap_or(token);
            tasks.push(Claimed {
                id,
                shard,
                token,
                effects_claim,
                attempt: r.attempts,
                due: r.run_at,
                max_attempts: r.max_attempts,
                plugin: r.plugin,
                owner: r.owner,
                payload: r.payload,
                created: r.created_at,
                traceparent: r.traceparent,
                start_by: r.start_by,
                event: r.event,
                batch: r.batch,
                priority: r.priority,
            });
        }
        Ok(ClaimBatch {
            now,
            now_us,
            next_due: (next >= 0).then_some(next),
            next_lease_expiry: (lease >= 0).then_some(lease),
            set_aside,
            waiting: waiting > 0,
            waiting_under_part: waiting == 2,
            others_here,
            others_due: (others_due >= 0).then_some(others_due),
            tasks,
        })
    }

    /// Renews the leases of claimed tasks of one shard to `lease_ms` from now. Returns, per task,
    /// whether its claim is still current (false: it was lost and must not be finished).
    pub async fn renew(
        &self,
        shard: u32,
        held: &[(&str, u64)],
        lease_ms: u64,
    ) -> Result<Vec<bool>> {
        let mut inv = self.shard_script(&self.inner.scripts.renew, shard);
        inv.arg(lease_ms);
        for (id, token) in held {
            inv.arg(*id).arg(*token);
        }
        let v: Vec<i64> = inv
            .invoke_async(&mut self.conn())
            .await
            .context("renew script")?;
        expect_len("renew", v.len(), held.len())?;
        Ok(v.into_iter().map(|x| x == 1).collect())
    }

    /// Records outcomes of claimed tasks of one shard, fenced by claim token.
    pub async fn finish(
        &self,
        shard: u32,
        items: &[(&str, u64, &Finish)],
    ) -> Result<Vec<Finished>> {
        self.finish_logged(shard, items, &[]).await
    }

    /// Records outcomes as [`Store::finish`] does, and keeps with each task whose outcome is
    /// recorded the log lines of its run (`logs`: id, [`AttemptLog::stored`](super::AttemptLog)).
    pub async fn finish_logged(
        &self,
        shard: u32,
        items: &[(&str, u64, &Finish)],
        logs: &[(&str, &str)],
    ) -> Result<Vec<Finished>> {
        let mut inv = self.shard_script(&self.inner.scripts.finish, shard);
        inv.arg(self.keys().wake_channel())
            .arg(shard)
            .arg(self.inner.opts.keep_done_ms.max(1))
            .arg(logs.len());
        for (id, log) in logs {
            inv.arg(*id).arg(*log);
        }
        // the script takes runs of tasks sharing an outcome (kind, token, value, error), each
        // run once with its ids, and answers a letter per task in the order sent
        let mut runs: Vec<(Outcome, Vec<usize>)> = Vec::new();
        let mut run_of: HashMap<Outcome, usize> = HashMap::new();
        for (i, (_, token, f)) in items.iter().enumerate() {
            let (kind, value, error) = match f {
                Finish::Done => ("done", 0, ""),
                Finish::Retry { after_ms, error } => ("retry", *after_ms, error.as_str()),
                Finish::Dead { error } => ("dead", 0, error.as_str()),
                Finish::Again { at } => ("again", *at, ""),
                Finish::Release => ("release", 0, ""),
                Finish::Defer { after_ms } => ("defer", *after_ms, ""),
            };
            let key = (kind, *token, value, error);
            let r = *run_of.entry(key).or_insert_with(|| {
                runs.push((key, Vec::new()));
                runs.len() - 1
            });
            runs[r].1.push(i);
        }
        for ((kind, token, value, error), ix) in &runs {
            inv.arg(*kind)
                .arg(*token)
                .arg(*value)
                .arg(field_safe(error))
                .arg(ix.len());
            for &i in ix {
                inv.arg(items[i].0);
            }
        }
        let answer: String = inv
            .invoke_async(&mut self.conn())
            .await
            .context("finish script")?;
        let verdicts = letters("finish", &answer, items.len(), Finished::from_letter)?;
        let mut out = vec![Finished::Stale; items.len()];
        let sent = runs.iter().flat_map(|(_, ix)| ix);
        for (&i, v) in sent.zip(verdicts) {
            out[i] = v;
        }
        Ok(out)
    }

    /// Moves a scheduled task; returns its new due time.
    pub async fn move_task(&self, id: &str, how: Move) -> Result<Result<i64, Refused>> {
        self.move_under(id, how, None).await
    }

    /// Moves the task `id` only while it runs under the claim `token` (a task claimed ahead that
    /// an owner's shift found: one released or claimed again since is left, `Missing`, so none
    /// is moved twice); its new due time.
    pub async fn move_claimed(
        &self,
        id: &str,
        token: u64,
        how: Move,
    ) -> Result<Result<i64, Refused>> {
        self.move_under(id, how, Some(token)).await
    }

    async fn move_under(
        &self,
        id: &str,
        how: Move,
        claim: Option<u64>,
    ) -> Result<Result<i64, Refused>> {
        let shard = self.shard_of(id);
        let mut inv = self.shard_script(&self.inner.scripts.move_task, shard);
        let (mode, value) = match how {
            Move::At(t) => ("at", t),
            Move::Shift(d) => ("shift", d),
            Move::Now => ("now", 0),
        };
        inv.arg(self.keys().wake_channel())
            .arg(shard)
            .arg(id)
            .arg(mode)
            .arg(value);
        if let Some(token) = claim {
            inv.arg(token);
        }
        let v: Vec<Value> = inv
            .invoke_async(&mut self.conn())
            .await
            .context("move script")?;
        if v.first().map(string).transpose()?.as_deref() == Some("revoking") {
            // claimed ahead: moved only if its runner takes it back before it starts
            let moved = self.await_revocation(shard, id).await?;
            return Ok(moved.ok_or(Refused::Running));
        }
        word_then_int("move", &v)
    }

    /// Cancels a scheduled (or dead) task.
    pub async fn cancel(&self, id: &str) -> Result<Result<(), Refused>> {
        self.delete(id, false, "", &[]).await
    }

    /// Cancels a scheduled (or dead) task only if it belongs to `plugin` or to a plugin one of
    /// the patterns `also` covers (a plugin's cancel).
    pub async fn cancel_for_plugin(
        &self,
        id: &str,
        plugin: &str,
        also: &[String],
    ) -> Result<Result<(), Refused>> {
        self.delete(id, false, plugin, also).await
    }

    /// Drops a dead task.
    pub async fn drop_dead(&self, id: &str) -> Result<Result<(), Refused>> {
        self.delete(id, true, "", &[]).await
    }

    async fn delete(
        &self,
        id: &str,
        only_dead: bool,
        plugin: &str,
        also: &[String],
    ) -> Result<Result<(), Refused>> {
        let shard = self.shard_of(id);
        let mut inv = self.shard_script(&self.inner.scripts.cancel, shard);
        inv.arg(id)
            .arg(if only_dead { "1" } else { "0" })
            .arg(plugin)
            .arg(self.keys().wake_channel())
            .arg(shard)
            .arg(also);
        let w: String = inv
            .invoke_async(&mut self.conn())
            .await
            .context("cancel script")?;
        if let Some(key) = w.strip_prefix("revoking") {
            // claimed ahead: cancelled only if its runner takes it back before it starts
            let cancelled = self.await_revocation(shard, key).await?;
            return Ok(cancelled.map(|_| ()).ok_or(Refused::Running));
        }
        <Result<(), Refused>>::parse("cancel", &w)
    }

    /// Puts a dead task back, due now with its attempts reset.
    pub async fn revive(&self, id: &str) -> Result<Result<i64, Refused>> {
        let shard = self.shard_of(id);
        let mut inv = self.shard_script(&self.inner.scripts.revive, shard);
        inv.arg(self.keys().wake_channel()).arg(shard).arg(id);
        let v: Vec<Value> = inv
            .invoke_async(&mut self.conn())
            .await
            .context("revive script")?;
        word_then_int("revive", &v)
    }

    /// Shifts all scheduled tasks of an owner (optionally of one plugin); returns how many moved.
    /// Refused with nothing moved when any of the owner's tasks would leave the time range.
    /// Each shard is shifted in chunks of at most [`OWNER_CHUNK`] tasks, each chunk one script
    /// (atomic per chunk, not across the whole owner).
    pub async fn shift_owner(
        &self,
        owner: &str,
        shift_ms: i64,
        plugin: Option<&str>,
    ) -> Result<Result<u64, Refused>> {
        if shift_ms == 0 {
            return Ok(Ok(0));
        }
        let bounds =
            try_join_all((0..self.shards()).map(|shard| self.owner_due_bounds(shard, owner)))
                .await
                .context("reading an owner's due times")?;
        for (lo, hi) in bounds.into_iter().flatten() {
            if eggtimer_base::limits::shifted("", lo, shift_ms).is_err()
                || eggtimer_base::limits::shifted("", hi, shift_ms).is_err()
            {
                return Ok(Err(Refused::OutOfRange));
            }
        }
        let channel = self.keys().wake_channel();
        let me = format!("{:016x}", rand::random::<u64>());
        let calls = (0..self.shards()).map(|shard| {
            let (channel, me) = (channel.clone(), me.clone());
            async move {
                let mut moved = 0u64;
                let mut cursor = String::new();
                let mut waiting_since = std::time::Instant::now();
                loop {
                    let mut inv = self.shard_script(&self.inner.scripts.shift_owner, shard);
                    inv.key(self.keys().owner_shift_lock(shard, owner));
                    inv.arg(&channel)
                        .arg(shard)
                        .arg(owner)
                        .arg(shift_ms)
                        .arg(plugin.unwrap_or(""))
                        .arg(&cursor)
                        .arg(OWNER_CHUNK)
                        .arg(&me)
                        .arg(SHIFT_LOCK_MS);
                    let (n, next): (i64, String) = inv.invoke_async(&mut self.conn()).await?;
                    if n < 0 {
                        // another shift of this owner holds the shard: wait for it
                        if waiting_since.elapsed() > std::time::Duration::from_millis(SHIFT_LOCK_MS) {
                            bail!("another shift of owner {owner:?} has held shard {shard} for {SHIFT_LOCK_MS} ms");
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                        continue;
                    }
                    moved += n as u64;
                    waiting_since = std::time::Instant::now();
                    if next.is_empty() {
                        return Ok::<_, anyhow::Error>(moved);
                    }
                    cursor = next;
                }
            }
        });
        let moved = try_join_all(calls).await.context("owner shift script")?;
        Ok(Ok(moved.iter().sum()))
    }

    /// The earliest and latest due time in a shard's index of an owner (None: no tasks).
    async fn owner_due_bounds(&self, shard: u32, owner: &str) -> Result<Option<(i64, i64)>> {
        let k = self.keys().shard(shard);
        let (lo, hi) = (format!("[{owner}\0"), format!("({owner}\u{1}"));
        let (first, last): (Vec<String>, Vec<String>) = redis::pipe()
            .cmd("ZRANGEBYLEX")
            .arg(&k.byowner)
            .arg(&lo)
            .arg(&hi)
            .arg("LIMIT")
            .arg(0)
            .arg(1)
            .cmd("ZREVRANGEBYLEX")
            .arg(&k.byowner)
            .arg(&hi)
            .arg(&lo)
            .arg("LIMIT")
            .arg(0)
            .arg(1)
            .query_async(&mut self.conn())
            .await?;
        let due = |m: &String| -> Result<i64> {
            m.split('\0')
                .nth(1)
                .and_then(|d| d.parse().ok())
                .with_context(|| format!("an owner index entry without a due time: {m:?}"))
        };
        match (first.first(), last.first()) {
            (Some(f), Some(l)) => Ok(Some((due(f)?, due(l)?))),
            _ => Ok(None),
        }
    }
}

/// Most tasks one owner-shift script moves: a task moved is a dozen index writes, and a chunk of
/// 500 held Redis 44–56 ms on a 2-core machine; 100 hold it for about a fifth of that.
pub const OWNER_CHUNK: usize = 100;

/// A script answers one value per task it was given; anything else is an error.
fn expect_len(script: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        bail!("the {script} script answered {got} values for {want} tasks");
    }
    Ok(())
}

/// A script's answer of one letter per task (schedule, finish), decoded in the order sent.
pub(super) fn letters<T>(
    script: &str,
    answer: &str,
    tasks: usize,
    decode: fn(u8) -> Option<T>,
) -> Result<Vec<T>> {
    expect_len(script, answer.len(), tasks)?;
    answer
        .bytes()
        .map(|c| {
            decode(c).with_context(|| {
                format!("the {script} script answered {answer:?}, which this runner does not know")
            })
        })
        .collect()
}

/// `{'ok', n}` or `{refusal}`.
fn word_then_int(script: &str, v: &[Value]) -> Result<Result<i64, Refused>> {
    let word = string(v.first().context("an empty reply")?)?;
    match <Result<(), Refused>>::parse(script, &word)? {
        Ok(()) => Ok(Ok(int(v.get(1).with_context(|| {
            format!("the {script} script answered ok without a value")
        })?)?)),
        Err(r) => Ok(Err(r)),
    }
}

/// An integer reply (Lua numbers arrive as integers; strings of digits are accepted too).
pub(super) fn int(v: &Value) -> Result<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .with_context(|| {
                format!(
                    "expected an integer reply, got {:?}",
                    String::from_utf8_lossy(b)
                )
            }),
        Value::SimpleString(s) => s
            .parse()
            .with_context(|| format!("expected an integer reply, got {s:?}")),
        other => bail!("expected an integer reply, got {other:?}"),
    }
}

/// A string reply.
pub(super) fn string(v: &Value) -> Result<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).context("a reply that is not UTF-8"),
        Value::SimpleString(s) => Ok(s.clone()),
        other => bail!("expected a string reply, got {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::claim_slots;

    /// The script names its answer's slots in one line (`local NOW, NEXT_DUE, … = 1, 2, …`);
    /// the decoder reads the same names at the same places, and no more or fewer.
    #[test]
    fn the_claim_reply_is_read_by_the_names_the_script_gives_its_slots() {
        let script = include_str!("lua/claim.lua");
        let line = script
            .lines()
            .find(|l| l.starts_with("local NOW,"))
            .expect("claim.lua names its answer's slots in a `local NOW, ...` line");
        let (names, places) = line["local ".len()..].split_once('=').unwrap();
        let names: Vec<&str> = names.split(',').map(str::trim).collect();
        let places: Vec<usize> = places
            .split(',')
            .map(|p| p.trim().parse().unwrap())
            .collect();
        let script_slots: Vec<(&str, usize)> = names.into_iter().zip(places).collect();
        let rust_slots: Vec<(&str, usize)> =
            claim_slots::ALL.iter().map(|&(n, i)| (n, i + 1)).collect();
        assert_eq!(script_slots, rust_slots);
        assert_eq!(claim_slots::TASKS, rust_slots.len());
    }
}
