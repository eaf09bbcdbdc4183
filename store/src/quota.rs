//! `max_pending`: at most that many scheduled, running and dead tasks of a plugin (a dead letter
//! waits to be retried: counting it keeps failing tasks from piling up past the quota and a retry
//! of them all from passing it, and a retry, which moves a task from dead to scheduled, needs no
//! room).
//! What would pass it is refused before anything is written (the API answers 429
//! `quota_exceeded`, a run whose follow-ups would pass it fails its attempt, a schedule's firing is
//! skipped).
//!
//! A plugin's pending tasks are the shards' per-plugin counts (`scheduled`, which every script
//! keeps, and the plugin's entries of `byplugin`, the dead index), read again at most every
//! 250 ms per plugin, and once more before a refusal (tasks that ended since the read never
//! refuse a batch that fits now). What was admitted since the read is added to it:
//! - for a plugin with a max_pending of its own (set, or held under an admin's ceiling), what
//!   every runner admitted and had not written when the count was read, from a ledger on the
//!   namespace's slot (`admit.lua`: two more round trips per schedule of such a plugin, one to
//!   admit and one to say the tasks are written): runners admitting at once don't pass it
//!   together;
//! - for the others (the default, 1,000,000), what this store admitted: runners admitting at once
//!   may pass it together by what they admit within those 250 ms.
//!
//! A running task counts as well while the quota is checked (each shard counts its runs per
//! plugin, `running:<plugin>` in `batches`): a run that fails goes back to scheduled without being
//! admitted again, and runs in flight would otherwise let a forking plugin pass its quota by them.
//! (What the API shows as pending stays scheduled and dead.)
//!
//! `max_pending_per_owner` is the same quota for each owner's tasks of a plugin apart (429
//! `owner_quota_exceeded`), always through the ledger (one per plugin and owner): an owner's
//! count is each shard's `po:` field in `meta`, which every script that creates or ends an
//! owned record keeps (`count_owned`), scheduled, running and dead together.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::{NewTask, Store};
use eggtimer_base::plugin_settings::DEFAULT_MAX_PENDING;

/// The most an admin can set.
pub const MAX_MAX_PENDING: u64 = 1_000_000_000;
/// Makes each ledger entry's member unique in this process (with [`process_tag`], in Redis).
static ENTRIES: AtomicU64 = AtomicU64::new(0);

/// A random tag of this process (two runners in containers may both be pid 1).
fn process_tag() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static TAG: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TAG.get_or_init(|| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish()
    })
}

/// How long a read of a plugin's pending count is trusted.
const FRESH: Duration = Duration::from_millis(250);

/// The quotas, shared by every store opened from one (`Store::own_connection`).
#[derive(Default)]
pub(super) struct Quotas {
    /// Each plugin's policy: its max_pending, where it has one of its own.
    pub(super) policies: eggtimer_base::policy::Policies,
    /// The owners' pauses, as the last sync read them (`Store::sync_owner_pauses`).
    pub(super) owner_pauses: eggtimer_base::policy::OwnerPauses,
    /// Each subject's pending count as last read, and what was admitted since (by
    /// `Subject::name`).
    counts: Mutex<HashMap<String, Count>>,
}

/// What a quota counts: a plugin's tasks (`max_pending`), or one owner's tasks of a plugin
/// (`max_pending_per_owner`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Subject<'a> {
    Plugin(&'a str),
    Owner(&'a str, &'a str),
}

impl Subject<'_> {
    fn plugin(&self) -> &str {
        match self {
            Subject::Plugin(p) | Subject::Owner(p, _) => p,
        }
    }

    /// Its name among the counts (a plugin name holds no NUL).
    fn name(&self) -> String {
        match self {
            Subject::Plugin(p) => (*p).to_owned(),
            Subject::Owner(p, o) => format!("{p}\0{o}"),
        }
    }

    /// Its ledger (`admit.lua`).
    fn ledger(&self, keys: &super::keys::Keys) -> String {
        match self {
            Subject::Plugin(p) => keys.plugin_admits(p),
            Subject::Owner(p, o) => keys.owner_admits(p, o),
        }
    }
}

struct Count {
    read: u64,
    admitted: u64,
    at: Instant,
    /// When the read started, by the ledger's Redis clock (ms; plugins with a max_pending of
    /// their own).
    at_ms: i64,
}

/// What an admission wrote into the ledger: (ledger, member) of each plugin with a max_pending of
/// its own. Hand it to [`Store::landed`] once the tasks are written (or refused).
#[must_use = "say when the admitted tasks are written: Store::landed"]
#[derive(Debug, Default)]
pub struct Admitted(Vec<(String, String)>);

/// A schedule refused because it would pass its plugin's max_pending, or (`owner`) its
/// max_pending_per_owner for that owner's tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaExceeded {
    pub plugin: String,
    pub owner: Option<String>,
    pub max_pending: u64,
    pub pending: u64,
    pub asked: u64,
}

impl std::fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.owner {
            None => write!(
                f,
                "quota_exceeded: plugin {:?} has {} scheduled, running and dead tasks and its max_pending is {}; {} more would pass it",
                self.plugin, self.pending, self.max_pending, self.asked
            ),
            Some(owner) => write!(
                f,
                "owner_quota_exceeded: owner {owner:?} has {} scheduled, running and dead tasks of plugin {:?}, whose max_pending_per_owner is {}; {} more would pass it",
                self.pending, self.plugin, self.max_pending, self.asked
            ),
        }
    }
}

/// Why new tasks were not admitted: their plugin's `max_pending`, or their team's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotAdmitted {
    Quota(QuotaExceeded),
    Budget(super::BudgetExceeded),
}

impl NotAdmitted {
    /// The API's error code.
    pub fn code(&self) -> &'static str {
        match self {
            NotAdmitted::Quota(q) if q.owner.is_some() => "owner_quota_exceeded",
            NotAdmitted::Quota(_) => "quota_exceeded",
            NotAdmitted::Budget(_) => "task_budget",
        }
    }

    /// The plugin it concerns.
    pub fn plugin(&self) -> &str {
        match self {
            NotAdmitted::Quota(q) => &q.plugin,
            NotAdmitted::Budget(b) => &b.plugin,
        }
    }
}

impl std::fmt::Display for NotAdmitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotAdmitted::Quota(q) => q.fmt(f),
            NotAdmitted::Budget(b) => b.fmt(f),
        }
    }
}

impl Quotas {
    fn limit(&self, of: Subject) -> u64 {
        self.own_limit(of).unwrap_or(DEFAULT_MAX_PENDING)
    }

    /// A plugin's max_pending when it has one of its own, an owner's max_pending_per_owner (the
    /// admissions of either go through the ledger).
    fn own_limit(&self, of: Subject) -> Option<u64> {
        let policy = self.policies.get(of.plugin());
        match of {
            Subject::Plugin(_) => policy.max_pending,
            Subject::Owner(..) => policy.max_pending_per_owner,
        }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<String, Count>> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits `asks` (subject, tasks) all or none against counts read at most `FRESH` ago and
    /// what this store admitted since.
    fn admit(&self, asks: &[(Subject, u64)]) -> Result<(), QuotaExceeded> {
        self.check(asks)?;
        let mut counts = self.counts();
        for &(of, asked) in asks {
            counts.get_mut(&of.name()).expect("read before").admitted += asked;
        }
        Ok(())
    }

    /// Whether `asks` fit, without admitting them.
    fn check(&self, asks: &[(Subject, u64)]) -> Result<(), QuotaExceeded> {
        let counts = self.counts();
        for &(of, asked) in asks {
            let c = counts.get(&of.name()).expect("read before");
            let (pending, max_pending) = (c.read + c.admitted, self.limit(of));
            if pending + asked > max_pending {
                return Err(exceeded(of, max_pending, pending, asked));
            }
        }
        Ok(())
    }
}

fn exceeded(of: Subject, max_pending: u64, pending: u64, asked: u64) -> QuotaExceeded {
    QuotaExceeded {
        plugin: of.plugin().to_owned(),
        owner: match of {
            Subject::Plugin(_) => None,
            Subject::Owner(_, o) => Some(o.to_owned()),
        },
        max_pending,
        pending,
        asked,
    }
}

impl Store {
    /// Every plugin's policy, as the last sync of the registry's settings made them (shared by
    /// the stores opened from this one, and by the plugin host the registry serves).
    pub fn policies(&self) -> &eggtimer_base::policy::Policies {
        &self.inner.quotas.policies
    }

    /// One plugin's policy.
    pub fn policy(&self, plugin: &str) -> Arc<eggtimer_base::policy::Policy> {
        self.policies().get(plugin)
    }

    /// Whether `owner`'s tasks of `plugin` claimed at `claimed` are held by a pause this runner
    /// heard of after that (see [`eggtimer_base::policy::OwnerPauses`]).
    pub fn owner_paused(&self, owner: &str, plugin: &str, claimed: std::time::Instant) -> bool {
        self.inner
            .quotas
            .owner_pauses
            .paused(owner, plugin, claimed)
    }

    /// Admits new tasks against their plugins' max_pending and their teams' task bytes
    /// (`budget`), all or none; counts them once admitted (call it right before scheduling them,
    /// and [`Store::landed`] after).
    pub async fn admit(&self, tasks: &[NewTask]) -> Result<Result<Admitted, NotAdmitted>> {
        let bytes = match self.check_budgets(tasks).await? {
            Ok(asks) => asks,
            Err(b) => return Ok(Err(NotAdmitted::Budget(b))),
        };
        let admitted = self.admit_pending(tasks).await?;
        if admitted.is_ok() {
            self.admitted_bytes(bytes);
        }
        Ok(admitted.map_err(NotAdmitted::Quota))
    }

    /// Admits new tasks against their plugins' max_pending, all or none; counts them as
    /// pending once admitted.
    /// Debounced tasks count one task per key (a batch that repeats a key makes one task), and
    /// one for a key whose task exists already (its payload is held as a task's is).
    async fn admit_pending(&self, tasks: &[NewTask]) -> Result<Result<Admitted, QuotaExceeded>> {
        let quotas = &self.inner.quotas;
        // each subject once, in the order met (a batch may name 10,000 owners)
        let mut asks: Vec<(Subject, u64)> = Vec::new();
        let mut at: HashMap<Subject, usize> = HashMap::new();
        let mut keys = std::collections::HashSet::new();
        for t in tasks {
            if t.debounce.is_some() && !keys.insert((t.plugin.as_str(), t.id.as_str())) {
                continue;
            }
            let owner = t.owner.as_deref().filter(|o| !o.is_empty());
            let owner = owner.map(|o| Subject::Owner(&t.plugin, o));
            let owner = owner.filter(|of| quotas.own_limit(*of).is_some());
            for of in std::iter::once(Subject::Plugin(&t.plugin)).chain(owner) {
                match at.get(&of) {
                    Some(&i) => asks[i].1 += 1,
                    None => {
                        at.insert(of, asks.len());
                        asks.push((of, 1));
                    }
                }
            }
        }
        self.read_counts(&asks, false).await?;
        match self.decide(&asks).await? {
            Ok(admitted) => Ok(Ok(admitted)),
            // refused on counts read up to FRESH ago: read again once, so that tasks that ended
            // since never refuse a batch that fits now (a refusal costs a read, an admission not)
            Err(_) => {
                self.read_counts(&asks, true).await?;
                self.decide(&asks).await
            }
        }
    }

    /// Admits `asks` on the counts read: through the ledger for the subjects with a quota of
    /// their own, against this store's counts for the others.
    async fn decide(&self, asks: &[(Subject<'_>, u64)]) -> Result<Result<Admitted, QuotaExceeded>> {
        let quotas = &self.inner.quotas;
        let (shared, own): (Vec<_>, Vec<_>) = asks
            .iter()
            .partition(|(of, _)| quotas.own_limit(*of).is_some());
        if shared.is_empty() {
            return Ok(quotas.admit(&own).map(|()| Admitted::default()));
        }
        if let Err(e) = quotas.check(&own) {
            return Ok(Err(e));
        }
        let admitted = match self.admit_shared(&shared).await? {
            Ok(a) => a,
            Err(e) => return Ok(Err(e)),
        };
        Ok(quotas.admit(&own).map(|()| admitted))
    }

    /// Reads again the counts of the subjects of `asks` read `FRESH` ago or never (`all`: every
    /// one): one time of the ledgers' Redis (they share the namespace's slot) before any count
    /// is read, so that what landed before it is in the counts; each plugin's counts; every
    /// owner's counts in one pipeline per shard.
    async fn read_counts(&self, asks: &[(Subject<'_>, u64)], all: bool) -> Result<()> {
        let quotas = &self.inner.quotas;
        let stale: Vec<Subject> = {
            let counts = quotas.counts();
            asks.iter()
                .map(|&(of, _)| of)
                .filter(|of| {
                    all || counts
                        .get(&of.name())
                        .is_none_or(|c| c.at.elapsed() >= FRESH)
                })
                .collect()
        };
        if stale.is_empty() {
            return Ok(());
        }
        let at = Instant::now();
        let at_ms = match stale.iter().find(|of| quotas.own_limit(**of).is_some()) {
            Some(&of) => self.ledger_now(of).await?,
            None => 0,
        };
        let mut reads = Vec::with_capacity(stale.len());
        let owners: Vec<(&str, &str)> = stale
            .iter()
            .filter_map(|of| match *of {
                Subject::Owner(p, o) => Some((p, o)),
                Subject::Plugin(_) => None,
            })
            .collect();
        let mut owner_reads = self.owner_pendings(&owners).await?.into_iter();
        for &of in &stale {
            let read = match of {
                Subject::Plugin(plugin) => self.pending_of(plugin).await?,
                Subject::Owner(..) => owner_reads.next().expect("one read per owner"),
            };
            reads.push((of, read));
        }
        let mut counts = quotas.counts();
        for (of, read) in reads {
            let name = of.name();
            // another call may have read it meanwhile, and admitted on it
            if counts.get(&name).is_none_or(|c| c.at < at) {
                let count = Count {
                    read,
                    admitted: 0,
                    at,
                    at_ms,
                };
                counts.insert(name, count);
            }
        }
        Ok(())
    }

    /// The tasks of an admission are written (or were refused): its ledger entries no longer
    /// add to counts read from now on. Best effort: an entry left pending goes after 10 s.
    pub async fn landed(&self, admitted: Admitted) {
        if admitted.0.is_empty() {
            return;
        }
        let mut inv = self.inner.scripts.admit.prepare_invoke();
        inv.arg("landed");
        for (key, member) in &admitted.0 {
            inv.key(key).arg(member);
        }
        if let Err(e) = inv.invoke_async::<i64>(&mut self.conn()).await {
            tracing::debug!("marking admitted tasks written failed (they count 10 s more): {e:#}");
        }
    }

    /// The time by the Redis that holds this subject's ledger (ms).
    async fn ledger_now(&self, of: Subject<'_>) -> Result<i64> {
        let mut inv = self.inner.scripts.admit.prepare_invoke();
        inv.key(of.ledger(self.keys())).arg("now");
        inv.invoke_async(&mut self.conn())
            .await
            .context("reading the time of the quota ledger")
    }

    /// Admits tasks of plugins with a max_pending of their own through the namespace's ledger
    /// (`admit.lua`): each count read plus what every runner admitted and had not written when
    /// it was read (the ledger's entries pending, or landed since).
    async fn admit_shared(
        &self,
        asks: &[(Subject<'_>, u64)],
    ) -> Result<Result<Admitted, QuotaExceeded>> {
        let quotas = &self.inner.quotas;
        let n = ENTRIES.fetch_add(1, Ordering::Relaxed);
        let suffix = format!("{:x}.{n:x}", process_tag());
        let mut inv = self.inner.scripts.admit.prepare_invoke();
        inv.arg("admit").arg(&suffix);
        let mut reads = Vec::with_capacity(asks.len());
        let mut entries = Vec::with_capacity(asks.len());
        {
            let counts = quotas.counts();
            for &(of, asked) in asks {
                let c = counts.get(&of.name()).expect("read before");
                let room = quotas.limit(of) as i64 - c.read as i64;
                let key = of.ledger(self.keys());
                inv.key(&key).arg(c.at_ms).arg(asked).arg(room);
                reads.push(c.read);
                entries.push((key, format!("{asked}:{suffix}")));
            }
        }
        let (refused, held): (usize, u64) = inv
            .invoke_async(&mut self.conn())
            .await
            .context("admitting tasks under max_pending")?;
        Ok(match refused.checked_sub(1) {
            None => Ok(Admitted(entries)),
            Some(i) => {
                let (of, asked) = asks[i];
                Err(exceeded(of, quotas.limit(of), reads[i] + held, asked))
            }
        })
    }

    /// A plugin's scheduled, dead and running tasks over all shards (a running task may come
    /// back to scheduled, without being admitted again).
    async fn pending_of(&self, plugin: &str) -> Result<u64> {
        let counts = self.plugin_counts(&[plugin.to_owned()]).await?;
        Ok(counts
            .iter()
            .map(|c| c.scheduled + c.dead + c.running)
            .sum())
    }

    /// One owner's scheduled, running and dead tasks of a plugin over all shards (each shard's
    /// `po:` count in `meta`, see `count_owned`).
    pub async fn owner_pending(&self, plugin: &str, owner: &str) -> Result<u64> {
        Ok(self.owner_pendings(&[(plugin, owner)]).await?[0])
    }

    /// `owner_pending` of each (plugin, owner), one pipeline per shard.
    async fn owner_pendings(&self, of: &[(&str, &str)]) -> Result<Vec<u64>> {
        if of.is_empty() {
            return Ok(vec![]); // (an empty pipeline is not a reply)
        }
        let calls = (0..self.shards()).map(|shard| {
            let meta = self.keys().shard(shard).meta;
            let mut p = redis::pipe();
            for (plugin, owner) in of {
                p.cmd("HGET")
                    .arg(&meta)
                    .arg(format!("po:{plugin}\0{owner}"));
            }
            let mut conn = self.conn();
            async move { p.query_async::<Vec<Option<u64>>>(&mut conn).await }
        });
        let per_shard = futures::future::try_join_all(calls)
            .await
            .context("counting owners' tasks")?;
        Ok((0..of.len())
            .map(|i| per_shard.iter().map(|c| c[i].unwrap_or(0)).sum())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(limit: u64, read: u64) -> Quotas {
        let q = Quotas::default();
        let max_pending = Some(limit);
        q.policies.set(HashMap::from([(
            "p".to_owned(),
            eggtimer_base::plugin_settings::PluginSettings {
                max_pending,
                ..Default::default()
            },
        )]));
        q.counts().insert(
            "p".into(),
            Count {
                read,
                admitted: 0,
                at: Instant::now(),
                at_ms: 0,
            },
        );
        q
    }

    #[test]
    fn what_was_admitted_counts_until_the_next_read() {
        let q = quotas(10, 6);
        assert_eq!(q.admit(&[(Subject::Plugin("p"), 3)]), Ok(()));
        let e = q.admit(&[(Subject::Plugin("p"), 2)]).unwrap_err();
        assert_eq!((e.pending, e.max_pending, e.asked), (9, 10, 2));
        assert!(
            e.to_string().starts_with(
                "quota_exceeded: plugin \"p\" has 9 scheduled, running and dead tasks"
            )
        );
        assert_eq!(q.admit(&[(Subject::Plugin("p"), 1)]), Ok(()));
        assert!(q.admit(&[(Subject::Plugin("p"), 1)]).is_err());
    }

    #[test]
    fn an_owners_quota_is_counted_apart_from_its_plugins() {
        let q = quotas(10, 0);
        let owner = Subject::Owner("p", "alice");
        q.counts().insert(
            owner.name(),
            Count {
                read: 4,
                admitted: 0,
                at: Instant::now(),
                at_ms: 0,
            },
        );
        // no max_pending_per_owner: the default's million
        assert_eq!(q.admit(&[(owner, 5)]), Ok(()));
        assert_eq!(q.counts()["p\0alice"].admitted, 5);
        assert_eq!(q.counts()["p"].admitted, 0);
        let e = exceeded(owner, 5, 4, 2);
        assert_eq!(
            e.to_string(),
            "owner_quota_exceeded: owner \"alice\" has 4 scheduled, running and dead tasks of plugin \"p\", whose max_pending_per_owner is 5; 2 more would pass it"
        );
        assert_eq!(NotAdmitted::Quota(e).code(), "owner_quota_exceeded");
    }

    #[test]
    fn a_batch_is_admitted_all_or_none() {
        let q = quotas(10, 0);
        q.counts().insert(
            "other".into(),
            Count {
                read: 0,
                admitted: 0,
                at: Instant::now(),
                at_ms: 0,
            },
        );
        // "other" has the default; "p" would pass its 10: neither is counted
        assert!(
            q.admit(&[(Subject::Plugin("other"), 5), (Subject::Plugin("p"), 11)])
                .is_err()
        );
        assert_eq!(
            q.admit(&[(Subject::Plugin("other"), 1), (Subject::Plugin("p"), 10)]),
            Ok(())
        );
        assert_eq!(q.counts()["other"].admitted, 1);
    }
}
