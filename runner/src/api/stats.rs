//! What the dashboard shows beyond the task routes: counts per shard and plugin with when tasks
//! fall due (`GET /v1/stats`), the namespace's recent throughput and lateness (`GET
//! /v1/stats/history`), and the latest events of a topic (`GET /v1/events/{topic}`).

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::AppState;
use super::body::ApiResult;
use super::doc;
use super::error::ApiError;
use crate::api::auth::Who;
use crate::metrics::{LATENESS_BUCKETS, lateness_quantile};
use eggtimer_store::STATS_BUCKET_MS;

/// What one shard holds now.
#[derive(Serialize, ToSchema)]
pub struct ShardStats {
    pub shard: u32,
    pub scheduled: u64,
    /// Scheduled and due now or earlier, not claimed yet.
    pub due_now: u64,
    pub running: u64,
    pub dead: u64,
}

/// A plugin's tasks now (all shards).
#[derive(Serialize, ToSchema)]
pub struct PluginStats {
    pub plugin: String,
    /// Scheduled, including those waiting while the plugin is paused.
    pub scheduled: u64,
    pub dead: u64,
}

/// Scheduled tasks falling due per minute over the next hour (overdue ones in the first).
#[derive(Serialize, ToSchema)]
pub struct DueStats {
    pub from: i64,
    pub bucket_ms: i64,
    pub counts: Vec<u64>,
}

/// `GET /v1/stats`.
#[derive(Serialize, ToSchema)]
pub struct Stats {
    pub now: i64,
    pub shards: Vec<ShardStats>,
    pub plugins: Vec<PluginStats>,
    /// Sums over the shards.
    pub scheduled: u64,
    pub due_now: u64,
    pub running: u64,
    pub dead: u64,
    pub due_next_hour: DueStats,
}

/// `GET /v1/stats`: what the namespace holds now.
#[utoipa::path(get, path = "/v1/stats", tag = "operations",
    responses((status = 200, description = "counts now", body = Stats), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn stats(State(st): State<AppState>, Who(caller): Who) -> ApiResult<axum::Json<Stats>> {
    let now = st.store.clock().now_ms();
    let counts = st.store.shard_counts().await?;
    let mut names: Vec<String> = st
        .store
        .plugin_list()
        .await?
        .into_iter()
        .map(|p| p.name)
        .filter(|n| caller.sees(n))
        .collect();
    names.sort();
    let plugins = st.store.plugin_counts(&names).await?;
    let due = st.store.due_histogram(now, 60_000, 60).await?;
    let sum = |f: fn(&eggtimer_store::ShardCounts) -> u64| counts.iter().map(f).sum();
    Ok(axum::Json(Stats {
        now,
        scheduled: sum(|c| c.scheduled),
        due_now: sum(|c| c.due_now),
        running: sum(|c| c.inflight),
        dead: sum(|c| c.dead),
        shards: counts
            .iter()
            .enumerate()
            .map(|(i, c)| ShardStats {
                shard: i as u32,
                scheduled: c.scheduled,
                due_now: c.due_now,
                running: c.inflight,
                dead: c.dead,
            })
            .collect(),
        plugins: plugins
            .into_iter()
            .map(|p| PluginStats {
                plugin: p.plugin,
                scheduled: p.scheduled,
                dead: p.dead,
            })
            .collect(),
        due_next_hour: DueStats {
            from: due.from,
            bucket_ms: due.bucket_ms,
            counts: due.counts,
        },
    }))
}

/// The window of `GET /v1/stats/history`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryParams {
    /// 1 to 60 (default 15).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 60)]
    minutes: Option<String>,
}

/// One bucket of the history (all runners).
#[derive(Serialize, ToSchema)]
pub struct HistoryPoint {
    /// The bucket's start (ms).
    pub at: i64,
    /// Tasks started, finished by their handler, and failed attempts (retried or dead), per
    /// second over the bucket.
    pub fired_per_s: f64,
    pub succeeded_per_s: f64,
    pub failed_per_s: f64,
    /// Firing lateness quantiles (ms) of the tasks started in the bucket; null without any.
    pub lateness_p50_ms: Option<f64>,
    pub lateness_p99_ms: Option<f64>,
}

/// A plugin's runs over the window (all runners).
#[derive(Serialize, ToSchema)]
pub struct PluginHistory {
    pub plugin: String,
    pub fired: i64,
    pub succeeded: i64,
    pub retried: i64,
    pub dead: i64,
    /// Mean handler time (ms); null without runs.
    pub handler_avg_ms: Option<f64>,
}

/// `GET /v1/stats/history`.
#[derive(Serialize, ToSchema)]
pub struct History {
    pub bucket_ms: i64,
    pub points: Vec<HistoryPoint>,
    pub plugins: Vec<PluginHistory>,
}

/// `GET /v1/stats/history`: throughput and firing lateness of the whole namespace over the last
/// minutes (5 s buckets), and each plugin's runs over them.
#[utoipa::path(get, path = "/v1/stats/history", tag = "operations", params(HistoryParams),
    responses((status = 200, description = "the recent history", body = History), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn history(
    State(st): State<AppState>,
    Who(caller): Who,
    Query(q): Query<HistoryParams>,
) -> ApiResult<axum::Json<History>> {
    let minutes = match q.minutes.as_deref() {
        None => 15,
        Some(m) => match m.parse::<i64>() {
            Ok(m @ 1..=60) => m,
            _ => return Err(ApiError::bad("minutes must be an integer from 1 to 60")),
        },
    };
    let now = st.store.clock().now_ms();
    let buckets = st.store.read_stats(now - minutes * 60_000, now).await?;
    let secs = STATS_BUCKET_MS as f64 / 1000.0;
    let mut plugins: BTreeMap<String, [i64; 5]> = BTreeMap::new();
    let mut points = Vec::with_capacity(buckets.len());
    for b in &buckets {
        let (mut fired, mut ok, mut failed) = (0, 0, 0);
        let mut lateness = [0u64; LATENESS_BUCKETS];
        let mut lateness_sum = [0u64; LATENESS_BUCKETS];
        for (field, n) in &b.fields {
            let Some((tag, rest)) = field.split_once('|') else {
                continue;
            };
            let slot = match tag {
                "f" => 0,
                "s" => 1,
                "r" => 2,
                "d" => 3,
                "t" => 4,
                "l" | "L" => {
                    let into = if tag == "l" {
                        &mut lateness
                    } else {
                        &mut lateness_sum
                    };
                    if let Some(c) = rest.parse::<usize>().ok().and_then(|i| into.get_mut(i)) {
                        *c += (*n).max(0) as u64;
                    }
                    continue;
                }
                _ => continue,
            };
            plugins.entry(rest.to_owned()).or_default()[slot] += n;
            match slot {
                0 => fired += n,
                1 => ok += n,
                2 | 3 => failed += n,
                _ => {}
            }
        }
        points.push(HistoryPoint {
            at: b.at,
            fired_per_s: fired as f64 / secs,
            succeeded_per_s: ok as f64 / secs,
            failed_per_s: failed as f64 / secs,
            lateness_p50_ms: lateness_quantile(&lateness, &lateness_sum, 0.5),
            lateness_p99_ms: lateness_quantile(&lateness, &lateness_sum, 0.99),
        });
    }
    Ok(axum::Json(History {
        bucket_ms: STATS_BUCKET_MS,
        points,
        plugins: plugins
            .into_iter()
            .filter(|(plugin, _)| caller.sees(plugin))
            .map(|(plugin, [f, s, r, d, us])| PluginHistory {
                plugin,
                fired: f,
                succeeded: s,
                retried: r,
                dead: d,
                handler_avg_ms: (f > 0).then(|| us as f64 / f as f64 / 1000.0),
            })
            .collect(),
    }))
}

/// The page of `GET /v1/events/{topic}`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventParams {
    /// 1 to 1000 (default 50).
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    limit: Option<String>,
    /// Only this plugin's events of the topic (default: every plugin the key may see).
    #[param(pattern = "^[a-z0-9][a-z0-9-]{0,63}$")]
    plugin: Option<String>,
}

/// One entry of a topic's stream.
#[derive(Serialize, ToSchema)]
pub struct Event {
    /// The stream entry id (`<ms>-<n>`).
    pub id: String,
    pub task_id: Option<String>,
    pub plugin: Option<String>,
    /// The event's data, as the JSON the plugin emitted (a string if it is not JSON).
    pub data: Option<Value>,
    /// The same data as the stream holds it: JSON text.
    pub data_text: Option<String>,
    pub traceparent: Option<String>,
}

/// `GET /v1/events/{topic}`: the latest events of a topic, newest first: each plugin's of its own
/// stream (`{ns}:events:<plugin>:<topic>`), of the plugins the key may see or the one `?plugin=`
/// names.
#[utoipa::path(get, path = "/v1/events/{topic}", tag = "operations",
    params(("topic" = String, Path, pattern = "^[a-z0-9._-]{1,64}$"), EventParams),
    responses((status = 200, description = "newest first", body = Vec<Event>), doc::Errors),
    security((), ("bearer" = [])))]
pub async fn events(
    State(st): State<AppState>,
    Who(caller): Who,
    Path(topic): Path<String>,
    Query(q): Query<EventParams>,
) -> ApiResult<axum::Json<Vec<Event>>> {
    let topic = eggtimer_base::names::Topic::new(topic)?;
    let limit = super::params::page_limit_of(q.limit.as_deref(), 50)?;
    let plugin = super::params::plugin_filter(q.plugin)?;
    let plugins = st
        .tasks
        .visible(&caller, st.registry.as_ref(), plugin.as_ref())
        .await?;
    let rows = st.store.latest_events(&plugins, &topic, limit).await?;
    Ok(axum::Json(
        rows.into_iter()
            .map(|(id, fields)| {
                let mut e = Event {
                    id,
                    task_id: None,
                    plugin: None,
                    data: None,
                    data_text: None,
                    traceparent: None,
                };
                for (k, v) in fields {
                    match k.as_str() {
                        "task_id" => e.task_id = Some(v),
                        "plugin" => e.plugin = Some(v),
                        "data" => {
                            e.data = Some(
                                serde_json::from_str(&v)
                                    .unwrap_or_else(|_| Value::String(v.clone())),
                            );
                            e.data_text = Some(v);
                        }
                        "traceparent" => e.traceparent = Some(v),
                        _ => {}
                    }
                }
                e
            })
            .collect(),
    ))
}
