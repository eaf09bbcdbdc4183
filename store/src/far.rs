//! The far tier: tasks due beyond the horizon (`StoreOptions::far_horizon_ms`), kept packed per
//! shard, plugin and slot of time (a sixtieth of the horizon, 1 s to a minute) in one Redis value
//! each, with a small index from a task's key to its slot (`lua/lib/far.lua` holds the layout).
//! The scripts that act on a task by its key bring a far one back into the live tier first, so
//! each acts on it as on any other; reads see it as the record it will have once live. The
//! promoter (each runner, for the shards it owns) moves the slots into the live tier half a
//! horizon before they fall due.

use anyhow::{Context, Result};

use super::{Store, TaskRecord, task_key};
use eggtimer_base::limits::MAX_TIME_MS;

/// Most far tasks one promotion call moves (then one more slot at most; a slot holds at most
/// 256 KiB of tasks).
pub const PROMOTE_CHUNK: usize = 2000;

/// Bytes of far slots one compaction call reads (then one slot more).
const COMPACT_BYTES: usize = 512 << 10;
/// The longest a far slot is (ms): a far task is due less than this long after its slot's start.
const LONGEST_SLOT_MS: i64 = 60_000;
/// Far slots one read of a `find` page takes, and the most reads a page makes past its cursor.
const FAR_FIND_SLOTS: usize = 16;
const FAR_FIND_READS: usize = 8;

impl Store {
    /// The far horizon (ms; 0: no far tier).
    pub fn far_horizon_ms(&self) -> u64 {
        self.inner.opts.far_horizon_ms
    }

    /// How long before a far slot's start its tasks move into the live tier: half the horizon,
    /// so a task is live long before it falls due, and one scheduled just past the horizon stays
    /// far for a while. Without a horizon (a runner started without the far tier where one
    /// was written), every far task moves.
    pub fn far_lead_ms(&self) -> u64 {
        match self.inner.opts.far_horizon_ms {
            // (past the latest time anything may be due)
            0 => MAX_TIME_MS as u64,
            h => h / 2,
        }
    }

    /// Moves the far tasks of `shard` whose slot starts within the lead into the live tier (one
    /// call: at most `PROMOTE_CHUNK` tasks and one slot more). Returns how many moved.
    pub async fn promote_far(&self, shard: u32) -> Result<usize> {
        let channel = self.keys().wake_channel();
        let mut inv = self.shard_script(&self.inner.scripts.far_promote, shard);
        let moved: usize = inv
            .arg(&channel)
            .arg(shard)
            .arg(self.far_lead_ms())
            .arg(PROMOTE_CHUNK)
            .invoke_async(&mut self.conn())
            .await
            .context("far_promote script")?;
        Ok(moved)
    }

    /// Compacts `shard`'s far slots that scripts appended to or took tasks out of since they
    /// were last written whole (at most `COMPACT_BYTES` of slots a call, and one more): each
    /// becomes as long as its tasks. Returns how many slots are still to compact.
    pub async fn compact_far(&self, shard: u32) -> Result<u64> {
        let mut inv = self.shard_script(&self.inner.scripts.far_compact, shard);
        let left: u64 = inv
            .arg(COMPACT_BYTES)
            .invoke_async(&mut self.conn())
            .await
            .context("far_compact script")?;
        Ok(left)
    }

    /// The records of `keys` (all of `shard`) that a read found no record of, read again in
    /// both tiers at one instant: a key's live record where it has one now (a move or cancel
    /// may have brought its far task back since that read), else the record its far task will
    /// have once live (None: neither).
    pub(super) async fn far_records(
        &self,
        shard: u32,
        keys: &[&str],
    ) -> Result<Vec<Option<String>>> {
        let mut inv = self.shard_script(&self.inner.scripts.far_get, shard);
        for k in keys {
            inv.arg(*k);
        }
        let recs: Vec<Option<String>> = inv
            .invoke_async(&mut self.conn())
            .await
            .context("far_get script")?;
        Ok(recs)
    }

    /// One chunk of the far tasks of `plugin` on `shard` (for a deploy's check of the waiting
    /// tasks): the slots a ZSCAN of the tier's slots finds from `cursor` (0 to start), each read
    /// whole. The tasks and the next cursor (0: the shard is done). Every task far throughout
    /// the walk is seen.
    pub async fn far_waiting_chunk(
        &self,
        shard: u32,
        plugin: &str,
        cursor: u64,
    ) -> Result<(Vec<TaskRecord>, u64)> {
        let k = self.keys().shard(shard);
        // a plugin name is [a-z0-9-]: nothing in it is a pattern's
        let (next, found): (u64, Vec<String>) = redis::cmd("ZSCAN")
            .arg(k.far_slots())
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{plugin}\x1f*"))
            .arg("COUNT")
            .arg(16)
            .query_async(&mut self.conn())
            .await
            .context("reading the far tier's slots")?;
        // (member, score) pairs
        let members: Vec<&String> = found.iter().step_by(2).collect();
        if members.is_empty() {
            return Ok((Vec::new(), next));
        }
        let mut pipe = redis::pipe();
        for m in &members {
            pipe.cmd("GET").arg(k.far_slot(m));
        }
        let blobs: Vec<Option<String>> = pipe
            .query_async(&mut self.conn())
            .await
            .context("reading far slots")?;
        let mut tasks = Vec::new();
        for (member, blob) in members.into_iter().zip(blobs) {
            let Some((_, start_s)) = member.split_once('\x1f') else {
                continue;
            };
            let Ok(start_s) = start_s.parse::<i64>() else {
                continue;
            };
            tasks.extend(
                far_entries(blob.as_deref().unwrap_or_default())
                    .filter_map(|e| e.record(plugin, start_s)),
            );
        }
        Ok((tasks, next))
    }

    /// A page of `shard`'s far tasks (of `plugin`, or all) due in `lo..=hi`, soonest first,
    /// after the place `after` (due, key): up to `limit` places with their records, and whether
    /// more may follow (`find`'s scheduled tasks, beside the due buckets and `parked`). Slots
    /// are read in the order of their starts until `limit` tasks are known to come before every
    /// slot not read (a far task is due less than a minute after its slot's start), at most
    /// `FAR_FIND_READS` reads of `FAR_FIND_SLOTS` slots a page once past the cursor: a page cut
    /// short ends at a place with no task (every far task before it was shown), from which the
    /// next page goes on.
    pub(super) async fn far_page(
        &self,
        shard: u32,
        plugin: Option<&str>,
        after: Option<&(i64, String)>,
        limit: usize,
        (lo, hi): (i64, i64),
    ) -> Result<FarPage> {
        let k = self.keys().shard(shard);
        let from = after.map_or(lo, |(due, _)| (*due).max(lo));
        let is_after = |r: &TaskRecord| match after {
            Some((due, key)) => (r.run_at, r.key.as_str()) > (*due, key.as_str()),
            None => true,
        };
        let mut found: Vec<TaskRecord> = Vec::new();
        let (mut offset, mut reads) = (0, 0);
        let frontier = loop {
            let page: Vec<(String, f64)> = redis::cmd("ZRANGEBYSCORE")
                .arg(k.far_slots())
                .arg(from.saturating_sub(LONGEST_SLOT_MS))
                .arg(hi)
                .arg("WITHSCORES")
                .arg("LIMIT")
                .arg(offset)
                .arg(FAR_FIND_SLOTS)
                .query_async(&mut self.conn())
                .await
                .context("reading the far tier's slots")?;
            offset += page.len();
            reads += 1;
            let wanted: Vec<(&str, i64)> = page
                .iter()
                .filter_map(|(m, _)| {
                    let (p, start_s) = m.split_once('\x1f')?;
                    let keep = plugin.is_none_or(|want| want == p);
                    keep.then_some((m.as_str(), start_s.parse().ok()?))
                })
                .collect();
            if !wanted.is_empty() {
                let mut pipe = redis::pipe();
                for (m, _) in &wanted {
                    pipe.cmd("GET").arg(k.far_slot(m));
                }
                let blobs: Vec<Option<String>> = pipe
                    .query_async(&mut self.conn())
                    .await
                    .context("reading far slots")?;
                for ((m, start_s), blob) in wanted.into_iter().zip(blobs) {
                    let p = m.split_once('\x1f').map_or(m, |(p, _)| p);
                    found.extend(
                        far_entries(blob.as_deref().unwrap_or_default())
                            .filter_map(|e| e.record(p, start_s))
                            .filter(|r| r.run_at >= lo && r.run_at <= hi && is_after(r)),
                    );
                }
            }
            found.sort_by(|a, b| (a.run_at, &a.key).cmp(&(b.run_at, &b.key)));
            // every slot not read starts at or after the last one read
            let Some(last) = page.last().filter(|_| page.len() == FAR_FIND_SLOTS) else {
                let more = found.len() > limit;
                found.truncate(limit);
                return Ok(FarPage::of(found, more));
            };
            let frontier = last.1 as i64;
            if found.iter().take_while(|r| r.run_at < frontier).count() >= limit {
                found.truncate(limit);
                return Ok(FarPage::of(found, true));
            }
            if reads >= FAR_FIND_READS && frontier > from {
                break frontier;
            }
        };
        // cut short: the tasks known to come first, then a place past them with no task
        found.retain(|r| r.run_at < frontier);
        let mut page = FarPage::of(found, true);
        page.0.push((frontier - 1, "\u{10ffff}".into()));
        page.1.push(None);
        Ok(page)
    }
}

/// A page of far tasks: the places (due, key), the records at them (None: a place with no task
/// that a page cut short ends at), whether more may follow.
pub(super) struct FarPage(
    pub Vec<(i64, String)>,
    pub Vec<Option<TaskRecord>>,
    pub bool,
);

impl FarPage {
    fn of(found: Vec<TaskRecord>, more: bool) -> FarPage {
        let places = found.iter().map(|r| (r.run_at, r.key.clone())).collect();
        FarPage(places, found.into_iter().map(Some).collect(), more)
    }
}

/// One task of a far slot's value (`\x1e id \x1f due-offset max_attempts age \x1f payload`,
/// the numbers in base 64 with the digits `0` to `o`: the due time's offset from the slot's start
/// (ms) in 3 digits, max_attempts in 2, then the ms from the task's creation to its due time).
struct FarEntry<'a> {
    id: &'a str,
    offset_ms: i64,
    max_attempts: i64,
    age_ms: i64,
    payload: &'a str,
}

impl FarEntry<'_> {
    /// The record it will have once live, in the slot starting at `start_s` (seconds).
    fn record(&self, plugin: &str, start_s: i64) -> Option<TaskRecord> {
        let due = start_s * 1000 + self.offset_ms;
        let rec = format!(
            "s\t{due}\t0\t{}\t{}\t\t{plugin}\t\t\t{}",
            self.max_attempts,
            due - self.age_ms,
            self.payload
        );
        TaskRecord::decode(&task_key(plugin, self.id), &rec)
    }
}

/// A number of a far entry (base 64, the digits `0` to `o`); None for anything else.
fn far_number(digits: &str) -> Option<i64> {
    if digits.is_empty() || digits.len() > 10 {
        return None;
    }
    digits.bytes().try_fold(0i64, |n, b| {
        (b'0'..=b'o')
            .contains(&b)
            .then(|| n * 64 + i64::from(b - b'0'))
    })
}

/// The tasks of a far slot's value (malformed ones left out). Each starts at a `\x1e`; one
/// brought back into the live tier starts at a `\x1d` instead, its bytes kept until the slot is
/// compacted, and is left out.
fn far_entries(blob: &str) -> impl Iterator<Item = FarEntry<'_>> {
    blob.split('\x1e')
        .filter_map(|e| e.split('\x1d').next())
        .filter(|e| !e.is_empty())
        .filter_map(|e| {
            let mut f = e.splitn(3, '\x1f');
            let (id, numbers, payload) = (f.next()?, f.next()?, f.next()?);
            Some(FarEntry {
                id,
                offset_ms: far_number(numbers.get(..3)?)?,
                max_attempts: far_number(numbers.get(3..5)?)?,
                age_ms: far_number(numbers.get(5..)?)?,
                payload,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_far_slots_value_reads_as_the_records_its_tasks_will_have() {
        // a: offset 250 (3*64 + 58: "03j"), 3 attempts ("03"), made 64 ms before its due
        // time ("10"); b: offset 0, 1 attempt, made 4095 ms before ("oo")
        // (and a task brought back, marked, before and between them)
        let blob = concat!(
            "\x1dz\x1f00001oo\x1f{}",
            "\x1ea\x1f03j0310\x1f{\"n\":1}",
            "\x1dy\x1f00001oo\x1f{}",
            "\x1eb\x1f00001oo\x1f{}"
        );
        let recs: Vec<TaskRecord> = far_entries(blob)
            .filter_map(|e| e.record("mail", 1_800_000_000))
            .collect();
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[0].id, "a");
        assert_eq!(recs[0].run_at, 1_800_000_000_250);
        assert_eq!(recs[0].max_attempts, 3);
        assert_eq!(recs[0].created_at, 1_800_000_000_250 - 64);
        assert_eq!(recs[0].payload, "{\"n\":1}");
        assert_eq!(recs[1].plugin, "mail");
        assert_eq!(recs[1].created_at, 1_800_000_000_000 - 4095);
        assert_eq!(far_entries("\x1ebroken").count(), 0);
        assert_eq!(far_entries("\x1ec\x1f03j03\x1f{}").count(), 0);
        assert_eq!(far_entries("\x1ec\x1f03j03p\x1f{}").count(), 0);
    }
}
