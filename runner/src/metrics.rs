//! Metrics: counters and histograms kept in memory, rendered as Prometheus text.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use crate::store::Finished;

/// Upper bounds of the firing-lateness buckets (ms).
const LATENESS_MS: [f64; 13] = [
    0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 5000.0, 60000.0,
];
/// Upper bounds of the handler-duration buckets (seconds).
const DURATION_S: [f64; 10] = [
    0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.1, 1.0, 10.0,
];

#[derive(Default, Clone)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, bounds: &[f64], v: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; bounds.len()];
        }
        for (i, b) in bounds.iter().enumerate() {
            if v <= *b {
                self.counts[i] += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str, bounds: &[f64]) {
        for (i, b) in bounds.iter().enumerate() {
            let c = self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(
            out,
            "{name}_sum{{{}}} {}",
            labels.trim_end_matches(','),
            self.sum
        );
        let _ = writeln!(
            out,
            "{name}_count{{{}}} {}",
            labels.trim_end_matches(','),
            self.count
        );
    }
}

#[derive(Default, Clone)]
struct PluginStats {
    scheduled: u64,
    fired: u64,
    succeeded: u64,
    retried: u64,
    dead: u64,
    lateness: Histogram,
    duration: Histogram,
}

/// The runner's metrics.
#[derive(Default)]
pub struct Metrics {
    plugins: Mutex<BTreeMap<String, PluginStats>>,
}

/// Gauges read at scrape time.
pub struct Gauges {
    /// Per shard: (scheduled, in flight, dead).
    pub shards: Vec<(u64, u64, u64)>,
    /// (plugin, version, digest) loaded on this runner.
    pub plugins: Vec<(String, u64, String)>,
    /// Shards this runner polls.
    pub owned_shards: usize,
    pub runners: usize,
}

impl Metrics {
    fn with(&self, plugin: &str, f: impl FnOnce(&mut PluginStats)) {
        let mut m = self.plugins.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = m.get_mut(plugin) {
            f(s);
        } else {
            f(m.entry(plugin.to_owned()).or_default());
        }
    }

    pub fn observe_scheduled(&self, plugin: &str, n: u64) {
        self.with(plugin, |s| s.scheduled += n);
    }

    /// A task started `lateness_ms` after its due time and its handler took `took`.
    pub fn observe_run(&self, plugin: &str, lateness_ms: i64, took: Duration) {
        self.with(plugin, |s| {
            s.fired += 1;
            s.lateness.observe(&LATENESS_MS, lateness_ms as f64);
            s.duration.observe(&DURATION_S, took.as_secs_f64());
        });
    }

    /// Recorded outcomes (one lock for a chunk).
    pub fn observe_finishes<'a>(&self, outcomes: impl Iterator<Item = (&'a str, Finished)>) {
        let mut m = self.plugins.lock().unwrap_or_else(|e| e.into_inner());
        for (plugin, how) in outcomes {
            if !m.contains_key(plugin) {
                m.insert(plugin.to_owned(), PluginStats::default());
            }
            let s = m.get_mut(plugin).expect("inserted");
            match how {
                Finished::Done | Finished::Again => s.succeeded += 1,
                Finished::Retry => s.retried += 1,
                Finished::Dead => s.dead += 1,
                Finished::Release | Finished::Defer | Finished::Stale => {}
            }
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self, g: &Gauges) -> String {
        let stats = self
            .plugins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut out = String::new();
        for (name, help, get) in [
            (
                "eggtimer_tasks_scheduled_total",
                "Tasks scheduled through this runner (API and follow-ups).",
                (|s: &PluginStats| s.scheduled) as fn(&PluginStats) -> u64,
            ),
            ("eggtimer_tasks_fired_total", "Tasks started.", |s| s.fired),
            (
                "eggtimer_tasks_succeeded_total",
                "Tasks whose handler finished them.",
                |s| s.succeeded,
            ),
            (
                "eggtimer_tasks_retried_total",
                "Failed attempts put back for a retry.",
                |s| s.retried,
            ),
            ("eggtimer_tasks_dead_total", "Tasks dead-lettered.", |s| {
                s.dead
            }),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (p, s) in &stats {
                let _ = writeln!(out, "{name}{{plugin=\"{p}\"}} {}", get(s));
            }
        }
        let name = "eggtimer_firing_lateness_ms";
        let _ = writeln!(
            out,
            "# HELP {name} Handler start time minus due time (ms).\n# TYPE {name} histogram"
        );
        for (p, s) in &stats {
            s.lateness
                .render(&mut out, name, &format!("plugin=\"{p}\","), &LATENESS_MS);
        }
        let name = "eggtimer_handler_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time a handler call took.\n# TYPE {name} histogram"
        );
        for (p, s) in &stats {
            s.duration
                .render(&mut out, name, &format!("plugin=\"{p}\","), &DURATION_S);
        }
        let _ = writeln!(
            out,
            "# HELP eggtimer_pending Tasks scheduled, per shard.\n# TYPE eggtimer_pending gauge"
        );
        for (i, (due, _, _)) in g.shards.iter().enumerate() {
            let _ = writeln!(out, "eggtimer_pending{{shard=\"{i}\"}} {due}");
        }
        let inflight: u64 = g.shards.iter().map(|s| s.1).sum();
        let dead: u64 = g.shards.iter().map(|s| s.2).sum();
        let _ = writeln!(
            out,
            "# HELP eggtimer_inflight Tasks running (all runners).\n# TYPE eggtimer_inflight gauge\neggtimer_inflight {inflight}"
        );
        let _ = writeln!(
            out,
            "# HELP eggtimer_dead Tasks in the dead-letter set.\n# TYPE eggtimer_dead gauge\neggtimer_dead {dead}"
        );
        let _ = writeln!(
            out,
            "# HELP eggtimer_plugin_loaded Plugin versions loaded on this runner.\n# TYPE eggtimer_plugin_loaded gauge"
        );
        for (p, v, d) in &g.plugins {
            let _ = writeln!(
                out,
                "eggtimer_plugin_loaded{{plugin=\"{p}\",version=\"{v}\",digest=\"{d}\"}} 1"
            );
        }
        let _ = writeln!(
            out,
            "# HELP eggtimer_owned_shards Shards this runner polls.\n# TYPE eggtimer_owned_shards gauge\neggtimer_owned_shards {}",
            g.owned_shards
        );
        let _ = writeln!(
            out,
            "# HELP eggtimer_runners Live runners on the namespace.\n# TYPE eggtimer_runners gauge\neggtimer_runners {}",
            g.runners
        );
        out
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
        let g = Gauges {
            shards: vec![(1, 0, 0)],
            plugins: vec![],
            owned_shards: 1,
            runners: 1,
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
        assert!(text.contains("eggtimer_tasks_fired_total{plugin=\"noop\"} 2"));
        assert!(text.contains("eggtimer_tasks_succeeded_total{plugin=\"noop\"} 1"));
    }
}
