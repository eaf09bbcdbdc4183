//! Fair share between plugins inside a runner: how many claimed tasks it holds of each plugin
//! (each place of a claim goes to the plugin holding the fewest, see [`Share`]), and which
//! claimed task a free worker starts: one of the plugin with the fewest runs going, the earliest
//! claimed of its highest priority, and only while that plugin has fewer runs going than its
//! share of the workers. The workers are shared by weight among the active plugins: those with
//! tasks claimed here or runs going, or whose last run ended within [`ACTIVE`]. A plugin alone
//! uses every worker; a plugin whose tasks come one at a time keeps its share between them. So
//! one plugin's backlog of slow runs waits behind its own runs only. Among a plugin's claimed tasks, owners take
//! turns as they do in a claim: the next started is the earliest claimed of an owner other than
//! the last one started (looking among the first [`OWNER_LOOK`]), so one owner's tasks claimed
//! ahead don't hold another owner's behind them.
//!
//! [`Share`]: eggtimer_store::Share

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;

use super::{Executor, Reservation};
use eggtimer_store::{Claimed, Share};

/// How many due tasks beyond its size a claim walks, when a plugin has used up its share of this
/// runner, to find other plugins' tasks behind that plugin's backlog (see [`Share`]).
const SHARE_WALK: usize = 512;

impl Executor {
    /// Tasks that waited for their plugin's share: set aside by a claim, or held here while a
    /// worker was free for other plugins (for the metrics).
    pub fn observe_share_waits(&self, n: u64) {
        if n > 0 {
            self.metrics.observe_share_waits(n);
        }
    }

    /// What a claim with the room `res` should keep of the fair share between plugins: how
    /// many tasks this runner holds of each plugin; whether to look past a backlog for other
    /// plugins' tasks (when one plugin is crowding the runner); the reservation's headroom,
    /// for plugins under their part.
    pub fn share(&self, res: &Reservation) -> Share {
        let held = self.shares.lock();
        let (part, crowded) = self.part_and_crowded(&held);
        Share {
            held: held
                .iter()
                .map(|(p, &n)| (p.clone(), n, self.store.policy(p).weight))
                .collect(),
            extra: if crowded { SHARE_WALK } else { 0 },
            headroom: res.headroom,
            // headroom goes to plugins not crowding the runner
            part,
            ahead_ms: 0,
        }
    }

    /// A plugin's part of [`Self::target_held`] were one plugin more to come to those `held`
    /// counts, and whether a plugin holds more than that (crowds the runner).
    fn part_and_crowded(&self, held: &HashMap<String, usize>) -> (usize, bool) {
        let part = self.target_held() / (held.len() + 1);
        (part, held.values().any(|&n| n > part))
    }

    /// Whether a plugin holds more than its part (crowds the runner).
    pub(super) fn crowded(&self) -> bool {
        self.part_and_crowded(&self.shares.lock()).1
    }

    /// Starts waiting tasks while workers are free. Called after tasks are queued and after
    /// every run ends, each check and take under the queue's lock, so no free worker is missed.
    pub(super) fn start_waiting(self: &Arc<Self>) {
        let rt = self
            .handler
            .runtime()
            .unwrap_or_else(tokio::runtime::Handle::current);
        loop {
            let mut queue = self.queue.lock();
            if queue.is_empty() {
                return;
            }
            let Ok(worker) = Arc::clone(&self.running).try_acquire_owned() else {
                return;
            };
            let next = queue.pop(|p| self.store.policy(p).weight);
            let waits = std::mem::take(&mut queue.share_waits);
            drop(queue);
            self.observe_share_waits(waits);
            let Some((task, slot)) = next else {
                return;
            };
            self.start(&rt, task, slot, worker);
        }
    }
}

/// How many claimed tasks (not yet recorded) this runner holds of each plugin.
#[derive(Default)]
pub(super) struct Shares(Mutex<HashMap<String, usize>>);

impl Shares {
    pub(super) fn lock(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn give(&self, plugin: &str) {
        let mut held = self.lock();
        if let Some(n) = held.get_mut(plugin) {
            *n -= 1;
            if *n == 0 {
                held.remove(plugin);
            }
        }
    }
}

/// A claimed task's place in the executor until its outcome is recorded: one slot of the
/// capacity, and one of its plugin's share.
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
    plugin: String,
    shares: Arc<Shares>,
}

impl Slot {
    pub(super) fn new(permit: OwnedSemaphorePermit, plugin: &str, shares: &Arc<Shares>) -> Slot {
        *shares.lock().entry(plugin.to_owned()).or_default() += 1;
        Slot {
            _permit: permit,
            plugin: plugin.to_owned(),
            shares: Arc::clone(shares),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.shares.give(&self.plugin);
    }
}

/// How many of a plugin's claimed tasks a free worker looks among for another owner's.
const OWNER_LOOK: usize = 64;

/// How long a plugin stays active, for its share of the workers, after its last run ended.
pub(super) const ACTIVE: Duration = Duration::from_secs(1);

/// The claimed tasks waiting for a worker, per plugin in claim order, and the runs going per
/// plugin.
pub(super) struct StartQueue(Mutex<Queues>);

pub(super) struct Queues {
    workers: usize,
    /// Per plugin: (claim order, whether it has waited for its plugin's share, task, slot), the
    /// highest priority first, then in claim order.
    waiting: HashMap<String, VecDeque<(u64, bool, Claimed, Slot)>>,
    /// Per plugin with tasks of more than one owner waiting: how many each owner has waiting
    /// (no owner: `None`), and the owner of the last task started.
    owners: HashMap<String, Owners>,
    /// Tasks that waited for their plugin's share of the workers while a worker was free, not
    /// yet reported to the metrics.
    pub(super) share_waits: u64,
    going: HashMap<String, usize>,
    /// When the last run ended of plugins with nothing waiting or going (dropped after ACTIVE).
    ended: HashMap<String, Instant>,
    /// Claim order across plugins (ties go to the earliest claimed).
    seq: u64,
}

impl StartQueue {
    pub(super) fn new(workers: usize) -> StartQueue {
        StartQueue(Mutex::new(Queues {
            workers: workers.max(1),
            waiting: HashMap::new(),
            owners: HashMap::new(),
            going: HashMap::new(),
            ended: HashMap::new(),
            share_waits: 0,
            seq: 0,
        }))
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Queues> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Queues {
    pub(super) fn push(&mut self, task: Claimed, slot: Slot) {
        self.seq += 1;
        let queue = self.waiting.entry(task.plugin.clone()).or_default();
        // owners are counted once a second one waits (one owner, or none: no cost)
        let owners = self.owners.get_mut(&task.plugin);
        match owners {
            Some(o) => o.add(&task.owner),
            None if queue.front().is_some_and(|f| f.2.owner != task.owner) => {
                let mut o = Owners::default();
                for e in queue.iter() {
                    o.add(&e.2.owner);
                }
                o.add(&task.owner);
                self.owners.insert(task.plugin.clone(), o);
            }
            None => {}
        }
        // each plugin's queue is in priority order, claim order among equals (priority 0, the
        // default, goes at the back without a look)
        let at = match task.priority {
            0 => queue.len(),
            p => queue
                .iter()
                .position(|e| e.2.priority < p)
                .unwrap_or(queue.len()),
        };
        queue.insert(at, (self.seq, false, task, slot));
    }

    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// The sum of the active plugins' weights.
    fn active_weight(&mut self, weight: &impl Fn(&str) -> u64) -> u64 {
        let now = Instant::now();
        self.ended.retain(|_, at| now.duration_since(*at) < ACTIVE);
        let waiting = self.waiting.keys();
        let going = self.going.keys().filter(|p| !self.waiting.contains_key(*p));
        let ended = self
            .ended
            .keys()
            .filter(|p| !self.waiting.contains_key(*p) && !self.going.contains_key(*p));
        waiting.chain(going).chain(ended).map(|p| weight(p)).sum()
    }

    /// The task a free worker starts: of the plugin with the fewest runs going for its weight
    /// (the earliest claimed among equals) if it has fewer than its share of the workers (the
    /// workers × its weight / the active plugins' weights, at least one), counted as going from
    /// now. None: the worker stays free for the other active plugins.
    pub(super) fn pop(&mut self, weight: impl Fn(&str) -> u32) -> Option<(Claimed, Slot)> {
        let weight = |p: &str| u64::from(weight(p).max(1));
        if self.waiting.len() == 1 && self.going.len() <= 1 && self.ended.is_empty() {
            // one plugin active (the common case): its share is every worker
            let plugin = self.waiting.keys().next()?.clone();
            if self.going.keys().all(|p| *p == plugin) {
                return self.take(plugin);
            }
        }
        let total = self.active_weight(&weight).max(1);
        let workers = self.workers as u64;
        let share = |p: &str| (workers * weight(p) / total).max(1) as usize;
        // a worker is free: the first task of a plugin at its share waits for it (counted once)
        for (p, q) in self.waiting.iter_mut() {
            if self.going.get(p).copied().unwrap_or(0) >= share(p)
                && let Some(front) = q.front_mut()
                && !front.1
            {
                front.1 = true;
                self.share_waits += 1;
            }
        }
        // fewest going per weight: going / weight, compared as going × 1000 / weight
        let plugin = self
            .waiting
            .iter()
            .map(|(p, q)| {
                (
                    self.going.get(p).copied().unwrap_or(0),
                    q.front().map(|e| e.0),
                    p,
                )
            })
            .filter(|(going, _, p)| *going < share(p))
            .min_by_key(|(going, seq, p)| (*going as u64 * 1000 / weight(p), *seq))
            .map(|(_, _, p)| p.clone())?;
        self.take(plugin)
    }

    /// Takes `plugin`'s next waiting task (its first, or, where owners take turns, the first
    /// of another owner than the last started), counted as going from now.
    fn take(&mut self, plugin: String) -> Option<(Claimed, Slot)> {
        let queue = self.waiting.get_mut(&plugin)?;
        let at = match self.owners.get(&plugin) {
            Some(o) => queue
                .iter()
                .take(OWNER_LOOK)
                .position(|e| o.last.as_ref() != Some(&e.2.owner))
                .unwrap_or(0),
            None => 0,
        };
        let (_, _, task, slot) = queue.remove(at)?;
        if queue.is_empty() {
            self.waiting.remove(&plugin);
        }
        if let Some(o) = self.owners.get_mut(&plugin) {
            if o.remove(&task.owner) {
                self.owners.remove(&plugin);
            } else {
                o.last = Some(task.owner.clone());
            }
        }
        self.ended.remove(&plugin);
        *self.going.entry(plugin).or_default() += 1;
        Some((task, slot))
    }

    /// A run of `plugin` ended.
    pub(super) fn ended(&mut self, plugin: &str) {
        if let Some(n) = self.going.get_mut(plugin) {
            *n -= 1;
            if *n == 0 {
                self.going.remove(plugin);
                self.ended.insert(plugin.to_owned(), Instant::now());
            }
        }
    }
}

/// The owners of one plugin's waiting tasks, while more than one has some.
#[derive(Default)]
pub(super) struct Owners {
    waiting: HashMap<Option<String>, usize>,
    last: Option<Option<String>>,
}

impl Owners {
    fn add(&mut self, owner: &Option<String>) {
        *self.waiting.entry(owner.clone()).or_default() += 1;
    }

    /// One of `owner`'s tasks was taken; true when one owner (or none) is left waiting, and
    /// the plugin needs no turns.
    fn remove(&mut self, owner: &Option<String>) -> bool {
        if let Some(n) = self.waiting.get_mut(owner) {
            *n -= 1;
            if *n == 0 {
                self.waiting.remove(owner);
            }
        }
        self.waiting.len() <= 1
    }
}
