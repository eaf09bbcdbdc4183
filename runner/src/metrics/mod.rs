//! Metrics, through the `metrics` crate and its Prometheus exporter (`metrics-exporter-prometheus`).
//!
//! The hot path only touches handles: a counter is an atomic add and a histogram sample a push
//! onto a lock-free bucket. The handles of a plugin are registered once and then found in a
//! read-mostly map (the same pattern as the plugin registry). Gauges that describe Redis (pending,
//! backlog, dead, runners) are read when /metrics is scraped and set just before rendering.
//!
//! Redis round trips are timed in `store::connection` through the `metrics` facade macros, which
//! reach this recorder once [`Metrics::install`] has made it the process's global recorder.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Label, Level, Metadata, Recorder, Unit};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use metrics_util::MetricKindMask;

mod catalog;
mod lateness;

pub use catalog::CATALOG;
use eggtimer_store::Finished;
pub use eggtimer_store::ShardCounts;
use lateness::LATENESS_MS;
pub use lateness::{LATENESS_BUCKETS, lateness_quantile};

/// Upper bounds of the handler-duration buckets (seconds).
const DURATION_S: [f64; 10] = [
    0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.1, 1.0, 10.0,
];
/// Upper bounds of the Redis round-trip buckets (seconds).
const REDIS_S: [f64; 10] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0,
];

/// Owners given a series of their own in `eggtimer_owner_due_backlog`.
const TOP_OWNERS: usize = 10;

/// Counts since the last [`Metrics::take_recent`], for the dashboard's history in Redis.
#[derive(Default)]
struct Recent {
    fired: AtomicU64,
    succeeded: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    handler_us: AtomicU64,
}

/// The handles of one plugin's metrics.
struct PluginHandles {
    recent: Recent,
    scheduled: Counter,
    fired: Counter,
    succeeded: Counter,
    retried: Counter,
    dead: Counter,
    limit_waits: Counter,
    effect_bytes: Counter,
    lateness: Histogram,
    duration: Histogram,
}

/// Gauges read at scrape time.
pub struct Gauges {
    /// Per shard: (scheduled, in flight, dead, due now).
    pub shards: Vec<ShardCounts>,
    /// Owners with tasks due and not started, most first.
    pub owners: Vec<(String, u64)>,
    /// (plugin, version, digest) loaded on this runner.
    pub plugins: Vec<(String, u64, String)>,
    /// Shards this runner polls.
    pub owned_shards: usize,
    pub runners: usize,
    pub idle_instances: usize,
    /// Plugin compiles running or waiting for their turn.
    pub compiles: usize,
}

/// The runner's metrics.
pub struct Metrics {
    recorder: Arc<PrometheusRecorder>,
    handle: PrometheusHandle,
    plugins: RwLock<HashMap<String, Arc<PluginHandles>>>,
    claims: RwLock<HashMap<u32, Counter>>,
    running: Gauge,
    redis_full: Gauge,
    share_waits: Counter,
    claimed_ahead: Counter,
    revoked: Counter,
    /// Lateness bucket counts since the last [`Metrics::take_recent`] (all plugins).
    recent_lateness: [AtomicU64; LATENESS_BUCKETS],
    /// The sum of those tasks' lateness (ms) per bucket.
    recent_lateness_sum: [AtomicU64; LATENESS_BUCKETS],
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn meta() -> Metadata<'static> {
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()))
}

impl Metrics {
    pub fn new() -> Metrics {
        let buckets = [
            ("eggtimer_firing_lateness_ms", &LATENESS_MS[..]),
            ("eggtimer_handler_duration_seconds", &DURATION_S[..]),
            ("eggtimer_redis_seconds", &REDIS_S[..]),
        ];
        let mut b = PrometheusBuilder::new()
            // gauges are set at every scrape; a label set no longer set (a plugin version that
            // was unloaded) leaves the exposition after this long
            .idle_timeout(MetricKindMask::GAUGE, Some(Duration::from_secs(60)));
        for (name, bounds) in buckets {
            b = b
                .set_buckets_for_metric(Matcher::Full(name.into()), bounds)
                .expect("bucket bounds are not empty");
        }
        let recorder = b.build_recorder();
        for (name, kind, help) in CATALOG {
            let unit = name.ends_with("_seconds").then_some(Unit::Seconds);
            let key = KeyName::from_const_str(name);
            match *kind {
                "counter" => recorder.describe_counter(key, unit, (*help).into()),
                "gauge" => recorder.describe_gauge(key, unit, (*help).into()),
                _ => recorder.describe_histogram(key, unit, (*help).into()),
            }
        }
        let handle = recorder.handle();
        let running =
            recorder.register_gauge(&Key::from_static_name("eggtimer_runner_inflight"), &meta());
        let redis_full =
            recorder.register_gauge(&Key::from_static_name("eggtimer_redis_full"), &meta());
        let share_waits = recorder.register_counter(
            &Key::from_static_name("eggtimer_fair_share_waits_total"),
            &meta(),
        );
        let claimed_ahead = recorder.register_counter(
            &Key::from_static_name("eggtimer_claimed_ahead_total"),
            &meta(),
        );
        let revoked =
            recorder.register_counter(&Key::from_static_name("eggtimer_revoked_total"), &meta());
        Metrics {
            recorder: Arc::new(recorder),
            handle,
            plugins: RwLock::default(),
            claims: RwLock::default(),
            running,
            redis_full,
            share_waits,
            claimed_ahead,
            revoked,
            recent_lateness: Default::default(),
            recent_lateness_sum: Default::default(),
        }
    }

    /// Makes this the process's global recorder (for the `metrics` macros, e.g. the Redis round
    /// trips). Only the first call in a process installs; later ones are told so (false).
    pub fn install(&self) -> bool {
        metrics::set_global_recorder(Global(Arc::clone(&self.recorder))).is_ok()
    }

    /// Drains the histograms' sample buckets into their counts, so memory stays flat when nobody
    /// scrapes (the runner calls it every few seconds).
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }

    fn plugin(&self, plugin: &str) -> Arc<PluginHandles> {
        if let Some(h) = self
            .plugins
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(plugin)
        {
            return Arc::clone(h);
        }
        let mut map = self.plugins.write().unwrap_or_else(|e| e.into_inner());
        let h = map.entry(plugin.to_owned()).or_insert_with(|| {
            let labels = || vec![Label::new("plugin", plugin.to_owned())];
            let counter = |name: &'static str| {
                self.recorder
                    .register_counter(&Key::from_parts(name, labels()), &meta())
            };
            let histogram = |name: &'static str| {
                self.recorder
                    .register_histogram(&Key::from_parts(name, labels()), &meta())
            };
            Arc::new(PluginHandles {
                recent: Recent::default(),
                scheduled: counter("eggtimer_tasks_scheduled_total"),
                fired: counter("eggtimer_tasks_fired_total"),
                succeeded: counter("eggtimer_tasks_succeeded_total"),
                retried: counter("eggtimer_tasks_retried_total"),
                dead: counter("eggtimer_tasks_dead_total"),
                limit_waits: counter("eggtimer_limit_waits_total"),
                effect_bytes: counter("eggtimer_effect_bytes_total"),
                lateness: histogram("eggtimer_firing_lateness_ms"),
                duration: histogram("eggtimer_handler_duration_seconds"),
            })
        });
        Arc::clone(h)
    }

    /// A publish of `stored` events of `topic`, `unmatched` of them listened for by no task,
    /// that cancelled or started `matched` tasks.
    pub fn observe_events(&self, topic: &str, stored: u64, unmatched: u64, matched: u64) {
        let t = topic.to_owned();
        metrics::counter!("eggtimer_events_in_total", "topic" => t.clone()).increment(stored);
        metrics::counter!("eggtimer_events_unmatched_total", "topic" => t.clone())
            .increment(unmatched);
        metrics::counter!("eggtimer_events_matched_total", "topic" => t).increment(matched);
    }

    pub fn observe_scheduled(&self, plugin: &str, n: u64) {
        self.plugin(plugin).scheduled.increment(n);
    }

    /// A task started `lateness_ms` after its due time and its handler took `took`.
    pub fn observe_run(&self, plugin: &str, lateness_ms: i64, took: Duration) {
        let h = self.plugin(plugin);
        h.fired.increment(1);
        h.lateness.record(lateness_ms as f64);
        h.duration.record(took.as_secs_f64());
        h.recent.fired.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        h.recent.handler_us.fetch_add(us, Ordering::Relaxed);
        let b = lateness::bucket_of(lateness_ms);
        self.recent_lateness[b].fetch_add(1, Ordering::Relaxed);
        self.recent_lateness_sum[b].fetch_add(lateness_ms.max(0) as u64, Ordering::Relaxed);
    }

    /// The counts since the last call, as history fields (`f|`, `s|`, `r|`, `d|` + plugin:
    /// fired, succeeded, retried, dead; `t|` + plugin: handler µs; `l|<i>`: lateness bucket i;
    /// `L|<i>`: the sum of its lateness in ms), zeros left out. The counters restart from zero.
    pub fn take_recent(&self) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        let take = |a: &AtomicU64| a.swap(0, Ordering::Relaxed) as i64;
        for (name, h) in self
            .plugins
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let r = &h.recent;
            for (tag, n) in [
                ("f", take(&r.fired)),
                ("s", take(&r.succeeded)),
                ("r", take(&r.retried)),
                ("d", take(&r.dead)),
                ("t", take(&r.handler_us)),
            ] {
                if n != 0 {
                    out.push((format!("{tag}|{name}"), n));
                }
            }
        }
        for (i, a) in self.recent_lateness.iter().enumerate() {
            let n = take(a);
            if n != 0 {
                out.push((format!("l|{i}"), n));
            }
            let sum = take(&self.recent_lateness_sum[i]);
            if sum != 0 {
                out.push((format!("L|{i}"), sum));
            }
        }
        out
    }

    /// A run committed this many bytes of effects.
    pub fn observe_effects(&self, plugin: &str, bytes: u64) {
        self.plugin(plugin).effect_bytes.increment(bytes);
    }

    /// A task started / ended running on this runner.
    pub fn running(&self, delta: f64) {
        self.running.increment(delta);
    }

    /// Tasks that waited for their plugin's fair share.
    pub fn observe_share_waits(&self, n: u64) {
        self.share_waits.increment(n);
    }

    /// Tasks claimed before their due time, to start at it.
    pub fn observe_claimed_ahead(&self, n: u64) {
        self.claimed_ahead.increment(n);
    }

    /// A task claimed ahead was given up before it started (a cancel or move revoked it).
    pub fn observe_revoked(&self) {
        self.revoked.increment(1);
    }

    /// A shard's claims were refused because Redis is out of memory (`full`), or are taken again.
    pub fn redis_full(&self, full: bool) {
        self.redis_full.increment(if full { 1.0 } else { -1.0 });
    }

    /// This runner claimed `n` tasks on `shard`.
    pub fn observe_claims(&self, shard: u32, n: u64) {
        if let Some(c) = self
            .claims
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&shard)
        {
            c.increment(n);
            return;
        }
        let mut map = self.claims.write().unwrap_or_else(|e| e.into_inner());
        map.entry(shard)
            .or_insert_with(|| {
                let key = Key::from_parts(
                    "eggtimer_claims_total",
                    vec![Label::new("shard", shard.to_string())],
                );
                self.recorder.register_counter(&key, &meta())
            })
            .increment(n);
    }

    /// Recorded outcomes.
    pub fn observe_finishes<'a>(&self, outcomes: impl Iterator<Item = (&'a str, Finished)>) {
        // a chunk is mostly one plugin: look its handles up once per run of the same name
        let mut last: Option<(&str, Arc<PluginHandles>)> = None;
        for (plugin, how) in outcomes {
            let h = match &last {
                Some((name, h)) if *name == plugin => Arc::clone(h),
                _ => {
                    let h = self.plugin(plugin);
                    last = Some((plugin, Arc::clone(&h)));
                    h
                }
            };
            let (counter, recent) = match how {
                Finished::Done | Finished::Again => (&h.succeeded, &h.recent.succeeded),
                Finished::Retry => (&h.retried, &h.recent.retried),
                Finished::Dead => (&h.dead, &h.recent.dead),
                Finished::Defer => {
                    h.limit_waits.increment(1);
                    continue;
                }
                Finished::Release | Finished::Stale => continue,
            };
            counter.increment(1);
            recent.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn gauge(&self, name: &'static str, labels: Vec<Label>, v: f64) {
        self.recorder
            .register_gauge(&Key::from_parts(name, labels), &meta())
            .set(v);
    }

    /// The Prometheus text exposition, with the scrape-time gauges set from `g` first.
    pub fn render(&self, g: &Gauges) -> String {
        let shard = |i: usize| vec![Label::new("shard", i.to_string())];
        for (i, s) in g.shards.iter().enumerate() {
            self.gauge("eggtimer_pending", shard(i), s.scheduled as f64);
            self.gauge("eggtimer_due_backlog", shard(i), s.due_now as f64);
        }
        // the owners with the largest due backlog each a series, the rest one: a bounded number
        // of series whatever the number of owners (one that leaves the top leaves the exposition
        // after the gauges' idle timeout)
        let top = &g.owners[..g.owners.len().min(TOP_OWNERS)];
        for (owner, n) in top {
            let owner = vec![Label::new("owner", owner.clone())];
            self.gauge("eggtimer_owner_due_backlog", owner, *n as f64);
        }
        let due: u64 = g.shards.iter().map(|s| s.due_now).sum();
        let tops: u64 = top.iter().map(|(_, n)| n).sum();
        self.gauge(
            "eggtimer_owner_due_backlog_rest",
            vec![],
            due.saturating_sub(tops) as f64,
        );
        let inflight: u64 = g.shards.iter().map(|s| s.inflight).sum();
        let dead: u64 = g.shards.iter().map(|s| s.dead).sum();
        self.gauge("eggtimer_inflight", vec![], inflight as f64);
        self.gauge("eggtimer_dead", vec![], dead as f64);
        for (p, v, d) in &g.plugins {
            let labels = vec![
                Label::new("plugin", p.clone()),
                Label::new("version", v.to_string()),
                Label::new("digest", d.clone()),
            ];
            self.gauge("eggtimer_plugin_loaded", labels, 1.0);
        }
        self.gauge(
            "eggtimer_plugin_instances_idle",
            vec![],
            g.idle_instances as f64,
        );
        self.gauge("eggtimer_plugin_compiles", vec![], g.compiles as f64);
        self.gauge("eggtimer_owned_shards", vec![], g.owned_shards as f64);
        self.gauge("eggtimer_runners", vec![], g.runners as f64);
        // the running gauge is kept by the executor: keep it from going idle
        self.running.increment(0.0);
        self.redis_full.increment(0.0);
        self.handle.render()
    }
}

/// The recorder shared between [`Metrics`] and the `metrics` macros.
struct Global(Arc<PrometheusRecorder>);

impl Recorder for Global {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, d: metrics::SharedString) {
        self.0.describe_counter(key, unit, d)
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, d: metrics::SharedString) {
        self.0.describe_gauge(key, unit, d)
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, d: metrics::SharedString) {
        self.0.describe_histogram(key, unit, d)
    }
    fn register_counter(&self, key: &Key, m: &Metadata<'_>) -> Counter {
        self.0.register_counter(key, m)
    }
    fn register_gauge(&self, key: &Key, m: &Metadata<'_>) -> Gauge {
        self.0.register_gauge(key, m)
    }
    fn register_histogram(&self, key: &Key, m: &Metadata<'_>) -> Histogram {
        self.0.register_histogram(key, m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_lateness_buckets() {
        let m = Metrics::default();
        m.observe_run("noop", 3, Duration::from_micros(5));
        m.observe_run("noop", 40, Duration::from_micros(5));
        m.observe_finishes([("noop", Finished::Done)].into_iter());
        m.observe_claims(0, 2);
        let g = Gauges {
            shards: vec![ShardCounts {
                scheduled: 1,
                due_now: 100,
                ..ShardCounts::default()
            }],
            owners: (0..12).map(|i| (format!("o{i}"), 12 - i)).collect(),
            plugins: vec![],
            owned_shards: 1,
            runners: 1,
            idle_instances: 0,
            compiles: 0,
        };
        let text = m.render(&g);
        assert!(
            text.contains("eggtimer_firing_lateness_ms_bucket{plugin=\"noop\",le=\"5\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("eggtimer_firing_lateness_ms_bucket{plugin=\"noop\",le=\"50\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("eggtimer_tasks_fired_total{plugin=\"noop\"} 2"),
            "{text}"
        );
        assert!(text.contains("eggtimer_tasks_succeeded_total{plugin=\"noop\"} 1"));
        assert!(
            text.contains("eggtimer_claims_total{shard=\"0\"} 2"),
            "{text}"
        );
        assert!(text.contains("eggtimer_pending{shard=\"0\"} 1"), "{text}");
        // ten owners' series (12 down to 3 tasks due), the other two and the unowned as one
        assert!(
            text.contains("eggtimer_owner_due_backlog{owner=\"o0\"} 12")
                && text.contains("eggtimer_owner_due_backlog{owner=\"o9\"} 3")
                && !text.contains("owner=\"o10\"")
                && text.contains("eggtimer_owner_due_backlog_rest 25"),
            "{text}"
        );
        let mut recent = m.take_recent();
        recent.sort();
        let want: Vec<(String, i64)> = vec![
            ("L|3".into(), 3),
            ("L|6".into(), 40),
            ("f|noop".into(), 2),
            ("l|3".into(), 1),
            ("l|6".into(), 1),
            ("s|noop".into(), 1),
            ("t|noop".into(), 10),
        ];
        assert_eq!(recent, want);
        assert!(m.take_recent().is_empty(), "taken once");
    }
}
