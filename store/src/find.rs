//! Finding tasks by plugin, state, owner and due range, a page at a time.
//!
//! Each state is read from the index that orders it (scheduled: the due buckets + `parked` + the
//! far tier's slots, or `byowner` when an owner is given (an owned task is never far); running:
//! the claim batches in `batches`; dead: `dead` or `byplugin` when a plugin is given; done: the
//! `finished` log), every shard from the cursor on, so a page costs O(shards × page) whatever
//! the number of tasks. A filter that no index serves
//! is applied to the records read (scheduled tasks of one plugin, say: no index lists them, which
//! keeps scheduling cheap): such a page may hold fewer tasks than asked for (even none) and still
//! have a next cursor; the walk ends only when the next cursor is None. Scheduled and running
//! tasks come soonest due first, dead and done ones most recent first; without a state filter the
//! states come one after another (scheduled, running, dead, done).

use std::cmp::Ordering;

use anyhow::{Context, Result};
use futures::future::try_join_all;

use super::{Store, TaskRecord, TaskState};
use eggtimer_base::limits::MAX_TIME_MS;

/// What to find (every filter optional).
#[derive(Clone, Debug, Default)]
pub struct FindQuery {
    pub plugin: Option<String>,
    pub state: Option<TaskState>,
    pub owner: Option<String>,
    /// Due at or after (ms).
    pub due_after: Option<i64>,
    /// Due at or before (ms).
    pub due_before: Option<i64>,
    pub limit: usize,
}

/// Where a walk stopped: a state and a place in its order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FindCursor {
    pub state: TaskState,
    /// The order key: due time (scheduled, running) or finish time (dead, done).
    pub key: i64,
    pub id: String,
}

impl FindCursor {
    /// The opaque text the API hands out: `<state letter>.<key>.<id in hex>`.
    pub fn encode(&self) -> String {
        let hex: String = self.id.bytes().map(|b| format!("{b:02x}")).collect();
        format!("{}.{}.{hex}", letter(self.state), self.key)
    }

    /// The place of a task found: its state, its due time (scheduled, running) or finish time
    /// (dead, done), its id.
    pub fn of(r: &TaskRecord) -> FindCursor {
        let key = match r.state {
            TaskState::Scheduled | TaskState::Running => r.run_at,
            TaskState::Dead | TaskState::Done => r.finished_at.unwrap_or(0),
        };
        FindCursor {
            state: r.state,
            key,
            id: r.key.clone(),
        }
    }

    pub fn decode(s: &str) -> Option<FindCursor> {
        let mut parts = s.splitn(3, '.');
        let state = match parts.next()? {
            "s" => TaskState::Scheduled,
            "r" => TaskState::Running,
            "x" => TaskState::Dead,
            "d" => TaskState::Done,
            _ => return None,
        };
        // any number names a place: one outside the times a task can have (the API's pattern
        // allows 19 digits) is before or after every task, and stays exact in Lua's doubles
        let key: i128 = parts.next()?.parse().ok()?;
        let key = key.clamp(-1, i128::from(MAX_TIME_MS) + 1) as i64;
        let hex = parts.next()?;
        if !hex.len().is_multiple_of(2) || hex.len() > 800 {
            return None;
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        Some(FindCursor {
            state,
            key,
            // any bytes name a place (ids are UTF-8, so bytes that are not fall between them)
            id: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }
}

fn letter(s: TaskState) -> char {
    match s {
        TaskState::Scheduled => 's',
        TaskState::Running => 'r',
        TaskState::Dead => 'x',
        TaskState::Done => 'd',
    }
}

const STATES: [TaskState; 4] = [
    TaskState::Scheduled,
    TaskState::Running,
    TaskState::Dead,
    TaskState::Done,
];

/// Soonest first for scheduled and running, most recent first for dead and done.
fn ascending(s: TaskState) -> bool {
    matches!(s, TaskState::Scheduled | TaskState::Running)
}

/// The order of two places `(key, id)` within a state.
fn order(state: TaskState, a: (i64, &str), b: (i64, &str)) -> Ordering {
    if ascending(state) {
        a.cmp(&b)
    } else {
        b.cmp(&a)
    }
}

/// One index of one shard.
enum Source {
    /// A lexicographic index whose members are `<prefix><key:015>\0<id>`.
    Lex { key: String, prefix: String },
    /// A ZSET of id -> key.
    Score { key: String },
    /// The shard's due buckets (scheduled tasks by due time, ascending).
    Due,
    /// The shard's running tasks (few: what its runners hold), ordered by due.
    Running,
    /// A ZSET of `<seq>\t<id>\t<id>...` -> key: many ids at one key (the done log).
    Log { key: String },
    /// The shard's far tier (scheduled tasks far ahead, by due time).
    Far,
}

/// The places of a `member, score, member, score, ...` reply.
fn scored_places(flat: &[String]) -> Result<Vec<(i64, String)>> {
    flat.chunks_exact(2)
        .map(|c| {
            let k: f64 = c[1]
                .parse()
                .with_context(|| format!("a score this runner can't read: {:?}", c[1]))?;
            Ok((k as i64, c[0].clone()))
        })
        .collect()
}

/// How many log entries a walk reads per call.
const LOG_READ: usize = 16;

/// A page of one source: the places, the record at each (None: gone), whether it may have more.
type Walked = (Vec<(i64, String)>, Vec<Option<TaskRecord>>, bool);

/// A page's places (key, id) and whether more may follow.
type Places = (Vec<(i64, String)>, bool);

/// What a page of one index is asked for.
struct Page<'a> {
    state: TaskState,
    /// The cursor's place: the page starts after it.
    after: Option<&'a (i64, String)>,
    limit: usize,
    /// The due range, where the index is ordered by due.
    lo: i64,
    hi: i64,
}

/// Score bounds wide enough for every stored time.
const LOWEST: i64 = -999_999_999_999_999;
const HIGHEST: i64 = 999_999_999_999_999;

impl Store {
    /// One page of tasks matching `q`, after `cursor`; the next cursor is None at the end.
    pub async fn find(
        &self,
        q: &FindQuery,
        cursor: Option<FindCursor>,
    ) -> Result<(Vec<TaskRecord>, Option<FindCursor>)> {
        let states: Vec<TaskState> = match q.state {
            Some(s) => vec![s],
            None => STATES.to_vec(),
        };
        let rank = |s: TaskState| STATES.iter().position(|x| *x == s).unwrap_or(0);
        let (state, after) = match cursor {
            Some(c) if states.contains(&c.state) => (c.state, Some((c.key, c.id))),
            // a place in another state's walk: before this filter's state, start it; after, done
            Some(c) if rank(c.state) < rank(states[0]) => (states[0], None),
            Some(_) => return Ok((Vec::new(), None)),
            None => (states[0], None),
        };
        let (tasks, next) = self.find_in_state(q, state, after).await?;
        let next = match next {
            Some((key, id)) => Some(FindCursor { state, key, id }),
            None => {
                // this state is walked: the next one starts (before any place in its order)
                let i = states.iter().position(|s| *s == state).unwrap_or(0);
                states.get(i + 1).map(|s| FindCursor {
                    state: *s,
                    key: if ascending(*s) { i64::MIN } else { i64::MAX },
                    id: String::new(),
                })
            }
        };
        Ok((tasks, next))
    }

    async fn find_in_state(
        &self,
        q: &FindQuery,
        state: TaskState,
        after: Option<(i64, String)>,
    ) -> Result<(Vec<TaskRecord>, Option<(i64, String)>)> {
        let limit = q.limit.max(1);
        // a cursor that starts a state is no place at all
        let after = after.filter(|(_, id)| !id.is_empty());
        let mut sources = Vec::new();
        for shard in 0..self.shards() {
            let k = self.keys().shard(shard);
            let src = match (state, &q.plugin, &q.owner) {
                (TaskState::Scheduled, _, Some(o)) => vec![Source::Lex {
                    key: k.byowner,
                    prefix: format!("{o}\0"),
                }],
                (TaskState::Scheduled, _, None) => {
                    vec![Source::Due, Source::Score { key: k.parked }, Source::Far]
                }
                (TaskState::Running, _, _) => vec![Source::Running],
                (TaskState::Dead, Some(p), _) => vec![Source::Lex {
                    key: k.byplugin,
                    prefix: format!("{p}\0x\0"),
                }],
                (TaskState::Dead, None, _) => vec![Source::Score { key: k.dead }],
                (TaskState::Done, _, _) => vec![Source::Log { key: k.finished }],
            };
            sources.extend(src.into_iter().map(|s| (shard, s)));
        }
        let calls = sources.iter().map(|(shard, src)| {
            let after = after.clone();
            async move {
                self.walk(*shard, src, state, q, after.as_ref(), limit)
                    .await
            }
        });
        let walked = try_join_all(calls).await.context("finding tasks")?;
        // Nothing past the first place a source stopped at may be shown yet: that source may
        // still have matches before it.
        let mut cut: Option<(i64, String)> = None;
        let mut found: Vec<((i64, String), TaskRecord)> = Vec::new();
        for (places, recs, more) in walked {
            if more && let Some(last) = places.last() {
                let earlier = match &cut {
                    Some(c) => order(state, (last.0, &last.1), (c.0, &c.1)) == Ordering::Less,
                    None => true,
                };
                if earlier {
                    cut = Some(last.clone());
                }
            }
            for (place, rec) in places.into_iter().zip(recs) {
                if let Some(rec) = rec.filter(|r| matches(r, q, state, place.0)) {
                    found.push((place, rec));
                }
            }
        }
        found.sort_by(|a, b| order(state, (a.0.0, &a.0.1), (b.0.0, &b.0.1)));
        if let Some(c) = &cut {
            found.retain(|(p, _)| order(state, (p.0, &p.1), (c.0, &c.1)) != Ordering::Greater);
        }
        let next = if found.len() > limit {
            found.truncate(limit);
            found.last().map(|(p, _)| p.clone())
        } else if found.len() == limit {
            found.last().map(|(p, _)| p.clone())
        } else {
            cut
        };
        Ok((found.into_iter().map(|(_, r)| r).collect(), next))
    }

    /// Up to `limit` places of one source after `after` with their records, and whether it may
    /// have more.
    async fn walk(
        &self,
        shard: u32,
        src: &Source,
        state: TaskState,
        q: &FindQuery,
        after: Option<&(i64, String)>,
        limit: usize,
    ) -> Result<Walked> {
        let (lo, hi) = match state {
            // the due range bounds the index itself where it is ordered by due
            TaskState::Scheduled => (
                q.due_after.unwrap_or(LOWEST),
                q.due_before.unwrap_or(HIGHEST),
            ),
            _ => (LOWEST, HIGHEST),
        };
        let p = Page {
            state,
            after,
            limit,
            lo,
            hi,
        };
        let (places, more) = match src {
            Source::Lex { key, prefix } => self.lex_places(key, prefix, &p).await?,
            Source::Score { key } => self.range_places(key, &p).await?,
            Source::Due => self.due_places(shard, &p).await?,
            Source::Log { key } => self.log_places(key, &p).await?,
            Source::Running => return self.running_page(shard, &p).await,
            Source::Far => {
                let page = self
                    .far_page(shard, q.plugin.as_deref(), after, limit, (lo, hi))
                    .await?;
                return Ok((page.0, page.1, page.2));
            }
        };
        let recs = self.records_of(shard, &places).await?;
        Ok((places, recs, more))
    }

    /// A page of a lex-ordered index (`byowner`, `byplugin`) of members `<prefix><key(15)>\0<id>`.
    async fn lex_places(&self, key: &str, prefix: &str, p: &Page<'_>) -> Result<Places> {
        let mut conn = self.conn();
        let asc = ascending(p.state);
        // past every member with the prefix: its last \0 raised to \u{1}
        let end = format!("({}\u{1}", &prefix[..prefix.len() - 1]);
        let from = match p.after {
            Some((k, id)) => format!("({prefix}{k:015}\0{id}"),
            None if asc => format!("[{prefix}{:015}", p.lo.max(0)),
            None => end.clone(),
        };
        let to = if asc { end } else { format!("[{prefix}") };
        let members: Vec<String> = redis::cmd(if asc { "ZRANGEBYLEX" } else { "ZREVRANGEBYLEX" })
            .arg(key)
            .arg(&from)
            .arg(&to)
            .arg("LIMIT")
            .arg(0)
            .arg(p.limit)
            .query_async(&mut conn)
            .await?;
        let mut out = Vec::with_capacity(members.len());
        let mut more = members.len() == p.limit;
        for m in &members {
            let rest = m
                .strip_prefix(prefix)
                .with_context(|| format!("an index entry out of its range: {m:?}"))?;
            let (k, id) = rest
                .split_once('\0')
                .and_then(|(k, id)| Some((k.parse::<i64>().ok()?, id)))
                .with_context(|| format!("an index entry this runner can't read: {m:?}"))?;
            if asc && k > p.hi {
                more = false;
                break;
            }
            out.push((k, id.to_owned()));
        }
        Ok((out, more))
    }

    /// A page of a score-ordered index (`parked`, `dead`), by the `range` script.
    async fn range_places(&self, key: &str, p: &Page<'_>) -> Result<Places> {
        let mut conn = self.conn();
        let (ck, cm) = match p.after {
            Some((k, id)) => (k.to_string(), id.clone()),
            None => (String::new(), String::new()),
        };
        let flat: Vec<String> = self
            .inner
            .scripts
            .range
            .key(key)
            .arg(if ascending(p.state) { "asc" } else { "desc" })
            .arg(ck)
            .arg(cm)
            .arg(p.lo)
            .arg(p.hi)
            .arg(p.limit)
            .invoke_async(&mut conn)
            .await?;
        let places = scored_places(&flat)?;
        let more = places.len() == p.limit;
        Ok((places, more))
    }

    /// A page of the shard's due buckets, by the `due_range` script.
    async fn due_places(&self, shard: u32, p: &Page<'_>) -> Result<Places> {
        let mut conn = self.conn();
        let (ck, cm) = match p.after {
            Some((k, id)) => (k.to_string(), id.clone()),
            None => (String::new(), String::new()),
        };
        let mut inv = self.shard_script(&self.inner.scripts.due_range, shard);
        inv.arg(ck).arg(cm).arg(p.lo).arg(p.hi).arg(p.limit);
        let flat: Vec<String> = inv.invoke_async(&mut conn).await?;
        let places = scored_places(&flat)?;
        let more = places.len() == p.limit;
        Ok((places, more))
    }

    /// A page of the finish log, most recent first.
    async fn log_places(&self, key: &str, p: &Page<'_>) -> Result<Places> {
        let mut conn = self.conn();
        // most recent first (the done state's order): read entries down from the cursor
        // until the page is full and every entry at its last key is in; an id listed is
        // done at that key only if its record says so (`matches` checks it)
        let top = p
            .after
            .map_or_else(|| "+inf".to_owned(), |(k, _)| k.to_string());
        let mut places: Vec<(i64, String)> = Vec::new();
        let (mut offset, mut last, mut more) = (0, None, false);
        'read: loop {
            let entries: Vec<(String, f64)> = redis::cmd("ZREVRANGEBYSCORE")
                .arg(key)
                .arg(&top)
                .arg("-inf")
                .arg("WITHSCORES")
                .arg("LIMIT")
                .arg(offset)
                .arg(LOG_READ)
                .query_async(&mut conn)
                .await?;
            for (entry, k) in &entries {
                let k = *k as i64;
                if places.len() >= p.limit && last != Some(k) {
                    more = true;
                    break 'read;
                }
                last = Some(k);
                for id in entry.split('\t').skip(1) {
                    if p.after
                        .is_none_or(|(ak, aid)| (k, id) < (*ak, aid.as_str()))
                    {
                        places.push((k, id.to_owned()));
                    }
                }
            }
            if entries.len() < LOG_READ {
                break;
            }
            offset += LOG_READ;
        }
        places.sort_by(|a, b| b.cmp(a));
        places.dedup();
        more |= places.len() > p.limit;
        places.truncate(p.limit);
        Ok((places, more))
    }

    /// The tasks of a shard's claim batches, each with its latest claim's token and its record
    /// (read whole: at most the runners' claimed tasks). An id may be in more than one batch's
    /// list (its outcome recorded, then claimed again): a shard's claim tokens only grow, so the
    /// latest is the one it may still run under; the records say which still run.
    pub(super) async fn claimed_records(
        &self,
        shard: u32,
    ) -> Result<Vec<(String, u64, TaskRecord)>> {
        let batches: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(&self.keys().shard(shard).batches)
            .query_async(&mut self.conn())
            .await?;
        let mut claims: std::collections::BTreeMap<&str, u64> = Default::default();
        for (field, ids) in &batches {
            let Ok(token) = field.parse::<u64>() else {
                continue;
            };
            for id in ids.split('\t') {
                let t = claims.entry(id).or_default();
                *t = (*t).max(token);
            }
        }
        let ids: Vec<&str> = claims.keys().copied().collect();
        let recs = self.read_records(&ids).await?;
        Ok(claims
            .into_iter()
            .zip(recs)
            .filter_map(|((id, token), r)| {
                Some((id.to_owned(), token, TaskRecord::decode(id, &r?)?))
            })
            .collect())
    }

    /// A page of the shard's running tasks (read whole: at most the runners' claimed tasks).
    async fn running_page(&self, shard: u32, p: &Page<'_>) -> Result<Walked> {
        let mut found: Vec<((i64, String), Option<TaskRecord>)> = self
            .claimed_records(shard)
            .await?
            .into_iter()
            .map(|(id, _, r)| ((r.run_at, id), Some(r)))
            .filter(|((k, id), _)| match p.after {
                Some((ak, aid)) => (*k, id.as_str()) > (*ak, aid.as_str()),
                None => true,
            })
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found.truncate(p.limit);
        // every running task of the shard was looked at: nothing more after the page
        // unless it was cut at the limit
        let more = found.len() == p.limit;
        let (places, recs) = found.into_iter().unzip();
        Ok((places, recs, more))
    }

    /// The records at `places` of one shard (done ones past the retention window left out).
    async fn records_of(
        &self,
        shard: u32,
        places: &[(i64, String)],
    ) -> Result<Vec<Option<TaskRecord>>> {
        if places.is_empty() {
            return Ok(Vec::new());
        }
        let k = self.keys().shard(shard);
        let ids: Vec<&str> = places.iter().map(|(_, id)| id.as_str()).collect();
        let raw: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(&k.tasks)
            .arg(&ids)
            .query_async(&mut self.conn())
            .await?;
        Ok(places
            .iter()
            .zip(raw)
            .map(|((_, id), r)| {
                r.and_then(|r| TaskRecord::decode(id, &r))
                    .filter(|r| self.retained(r))
            })
            .collect())
    }
}

/// Whether a record found at `key` in the index of `state` is current and passes the filters.
fn matches(r: &TaskRecord, q: &FindQuery, state: TaskState, key: i64) -> bool {
    let place_holds = match state {
        TaskState::Scheduled | TaskState::Running => r.run_at == key,
        TaskState::Dead | TaskState::Done => r.finished_at.unwrap_or(0) == key,
    };
    r.state == state
        && place_holds
        && q.plugin.as_ref().is_none_or(|p| *p == r.plugin)
        && q.owner.as_ref().is_none_or(|o| Some(o) == r.owner.as_ref())
        && q.due_after.is_none_or(|t| r.run_at >= t)
        && q.due_before.is_none_or(|t| r.run_at <= t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_garbage() {
        let c = FindCursor {
            state: TaskState::Dead,
            key: 1_700_000_000_000,
            id: "order:42 ✓.x".into(),
        };
        assert_eq!(FindCursor::decode(&c.encode()), Some(c));
        for bad in ["", "q.1.00", "s.x.00", "s.1.0", "s.1.zz"] {
            assert_eq!(FindCursor::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_cursor_beyond_any_time_names_the_first_or_last_place() {
        // 19 digits fit the API's pattern but not an i64 nor a Lua double (schemathesis found it)
        let low = FindCursor::decode("d.-9561763308829331007.").unwrap();
        assert_eq!(
            (low.state, low.key, low.id.as_str()),
            (TaskState::Done, -1, "")
        );
        let high = FindCursor::decode("s.9999999999999999999.61").unwrap();
        assert_eq!(high.key, MAX_TIME_MS + 1);
    }

    #[test]
    fn dead_and_done_come_most_recent_first() {
        assert_eq!(
            order(TaskState::Dead, (2, "a"), (1, "a")),
            Ordering::Less,
            "a later death comes first"
        );
        assert_eq!(
            order(TaskState::Scheduled, (1, "a"), (2, "a")),
            Ordering::Less
        );
    }
}
