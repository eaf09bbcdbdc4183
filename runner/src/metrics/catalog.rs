//! Every metric's name, kind and help text, as `/metrics` describes them.

/// Every metric this runner exposes: name, kind, help. The README's table and the Grafana
/// dashboard's test read the same names.
pub const CATALOG: &[(&str, &str, &str)] = &[
    (
        "eggtimer_events_in_total",
        "counter",
        "Events published through this runner (`POST /v1/events/{topic}`), per topic.",
    ),
    (
        "eggtimer_events_matched_total",
        "counter",
        "Tasks those events cancelled or started at once, per topic.",
    ),
    (
        "eggtimer_events_unmatched_total",
        "counter",
        "Events no task listened for when they arrived (kept for the lookback), per topic.",
    ),
    (
        "eggtimer_source_entries_total",
        "counter",
        "Entries of a source's stream read into events (and acknowledged), per source.",
    ),
    (
        "eggtimer_source_lag",
        "gauge",
        "Entries of a source's stream not read yet (Redis's consumer group lag), per source.",
    ),
    (
        "eggtimer_outbox_late_total",
        "counter",
        "Outbox messages (listen, deliver, unlisten) delivered by the sweeper because their \
         writer did not (it died, or the task ended: its listeners let go), per shard.",
    ),
    (
        "eggtimer_tasks_scheduled_total",
        "counter",
        "Tasks scheduled through this runner (API, follow-ups and recurring schedules' firings), per plugin.",
    ),
    (
        "eggtimer_tasks_fired_total",
        "counter",
        "Tasks started on this runner, per plugin.",
    ),
    (
        "eggtimer_tasks_succeeded_total",
        "counter",
        "Tasks whose handler finished them (done or run again), per plugin.",
    ),
    (
        "eggtimer_tasks_retried_total",
        "counter",
        "Failed attempts put back for a retry, per plugin.",
    ),
    (
        "eggtimer_tasks_dead_total",
        "counter",
        "Tasks dead-lettered, per plugin.",
    ),
    (
        "eggtimer_limit_waits_total",
        "counter",
        "Claimed tasks put back unstarted, their attempt given back, to wait for their plugin's rate limit, a concurrency slot, or the plugin to load on this runner, per plugin.",
    ),
    (
        "eggtimer_fair_share_waits_total",
        "counter",
        "Tasks that waited for their plugin's fair share of this runner while other plugins' tasks ran: due tasks its claims set aside, and claimed tasks held back from a free worker.",
    ),
    (
        "eggtimer_claimed_ahead_total",
        "counter",
        "Tasks this runner claimed before their due time (under a steady stream, `--claim-ahead`) and started at it.",
    ),
    (
        "eggtimer_revoked_total",
        "counter",
        "Tasks claimed ahead that this runner gave up before they started, because a cancel or a move of them (or their plugin's delete) came while they waited for their due time.",
    ),
    (
        "eggtimer_far_promoted_total",
        "counter",
        "Far tasks this runner moved into the live tier ahead of their due time (--far-horizon).",
    ),
    (
        "eggtimer_effect_bytes_total",
        "counter",
        "Bytes of kv writes, events and follow-ups committed by runs, per plugin.",
    ),
    (
        "eggtimer_firing_lateness_ms",
        "histogram",
        "Handler start time minus due time (ms), per plugin.",
    ),
    (
        "eggtimer_handler_duration_seconds",
        "histogram",
        "Time a handler call took, per plugin.",
    ),
    (
        "eggtimer_claims_total",
        "counter",
        "Tasks this runner claimed, per shard.",
    ),
    (
        "eggtimer_redis_seconds",
        "histogram",
        "Redis round-trip time, per Lua script (and `command`, `pipeline` for the rest).",
    ),
    ("eggtimer_pending", "gauge", "Tasks scheduled, per shard."),
    (
        "eggtimer_due_backlog",
        "gauge",
        "Tasks due now or earlier and not yet claimed, per shard.",
    ),
    (
        "eggtimer_owner_due_backlog",
        "gauge",
        "Tasks due now or earlier and not started, per owner: the owners with the most, at most 10.",
    ),
    (
        "eggtimer_owner_due_backlog_rest",
        "gauge",
        "Tasks due now or earlier and not claimed of every other owner and of none: the due backlog less the owners'.",
    ),
    ("eggtimer_inflight", "gauge", "Tasks running (all runners)."),
    ("eggtimer_dead", "gauge", "Tasks in the dead-letter set."),
    (
        "eggtimer_runner_inflight",
        "gauge",
        "Tasks running on this runner.",
    ),
    (
        "eggtimer_plugin_loaded",
        "gauge",
        "Plugin versions loaded on this runner (1 = current).",
    ),
    (
        "eggtimer_plugin_instances_idle",
        "gauge",
        "Warm plugin instances kept idle on this runner.",
    ),
    (
        "eggtimer_owned_shards",
        "gauge",
        "Shards this runner polls.",
    ),
    (
        "eggtimer_runners",
        "gauge",
        "Live runners on the namespace.",
    ),
    (
        "eggtimer_redis_full",
        "gauge",
        "Shards this runner polls whose Redis refused its last claim for want of memory (maxmemory reached): no task starts there until memory is freed.",
    ),
];
