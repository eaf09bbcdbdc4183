//! The CLI's human output: API replies as aligned tables (`--json` prints the reply instead).
//! Pure functions over the reply's JSON, so they are tested without a runner.

use serde_json::{Value, json};

/// Columns padded to their widest cell, two spaces apart; a header row first.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c); // no trailing spaces
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// A field as text: strings bare, null/absent as `-`.
fn f(v: &Value, key: &str) -> String {
    match &v[key] {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A time (ms since the epoch) as UTC `YYYY-MM-DD HH:MM:SS`.
fn time(v: &Value, key: &str) -> String {
    v[key]
        .as_i64()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map_or("-".into(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string())
}

/// One line of at most `n` characters (errors can be long and span lines).
fn short(s: &str, n: usize) -> String {
    let s = s.replace(['\n', '\r', '\t'], " ");
    if s.chars().count() <= n {
        s
    } else {
        s.chars().take(n - 1).collect::<String>() + "…"
    }
}

fn items(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) => a,
        // GET /v1/tasks and /v1/dead answer {"tasks": [...], "next_cursor"}
        _ => v["tasks"].as_array().map_or(&[], Vec::as_slice),
    }
}

/// `plugin list`.
pub fn plugins(v: &Value) -> String {
    let rows: Vec<Vec<String>> = items(v)
        .iter()
        .map(|p| {
            vec![
                f(p, "name"),
                f(p, "version"),
                f(p, "digest").chars().take(12).collect(),
                f(p, "size"),
                time(p, "uploaded_at"),
                if p["paused"] == true {
                    "paused"
                } else {
                    "active"
                }
                .into(),
                f(p, "max_concurrency"),
                f(p, "max_concurrency_per_owner"),
                f(p, "weight"),
                p["time_limit_ms"]
                    .as_u64()
                    .map_or("-".into(), |ms| format!("{ms} ms")),
                p["memory_bytes"]
                    .as_u64()
                    .map_or("-".into(), |b| format!("{} MiB", b >> 20)),
                f(p, "max_pending"),
            ]
        })
        .collect();
    render(
        &[
            "NAME",
            "VERSION",
            "DIGEST",
            "BYTES",
            "UPLOADED (UTC)",
            "STATE",
            "MAX",
            "PER OWNER",
            "WEIGHT",
            "TIME LIMIT",
            "MEMORY",
            "MAX PENDING",
        ],
        &rows,
    )
}

/// `key list`: one key a line (never a secret: the API has none to give).
pub fn keys(v: &Value) -> String {
    let rows: Vec<Vec<String>> = items(v)
        .iter()
        .map(|k| {
            let list = |field: &str| -> String {
                k[field]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>())
                    .unwrap_or_default()
                    .join(",")
            };
            let limits = [
                ("plugins", "max_plugins"),
                ("pending", "max_pending"),
                ("task bytes", "task_bytes"),
                ("event bytes", "event_bytes"),
                ("kv bytes", "kv_bytes"),
                ("emitted bytes", "emitted_bytes"),
            ]
            .iter()
            .filter_map(|(what, field)| Some(format!("{what} {}", k[*field].as_u64()?)))
            .collect::<Vec<_>>()
            .join(", ");
            vec![
                f(k, "id"),
                f(k, "name"),
                f(k, "role"),
                list("plugins"),
                list("publish"),
                list("listen"),
                list("streams"),
                limits,
                time(k, "created_at"),
                time(k, "last_used_at"),
                f(k, "refused"),
            ]
        })
        .collect();
    render(
        &[
            "ID",
            "NAME",
            "ROLE",
            "PLUGINS",
            "PUBLISH",
            "LISTEN",
            "STREAMS",
            "AT MOST",
            "CREATED (UTC)",
            "LAST USED (UTC)",
            "REFUSED",
        ],
        &rows,
    )
}

/// `audit`: one request a line, newest first.
pub fn audit(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v["entries"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|e| {
            vec![
                time(e, "at"),
                f(e, "key"),
                f(e, "method"),
                short(&f(e, "path"), 60),
                f(e, "plugin"),
                f(e, "status"),
            ]
        })
        .collect();
    render(
        &["AT (UTC)", "KEY", "METHOD", "PATH", "PLUGIN", "STATUS"],
        &rows,
    )
}

/// A deploy refused by its check (`plugin push`, `plugin promote`): the waiting tasks it can't
/// read, the first ten, and how many in all.
pub fn refused(error: &Value) -> String {
    let rows: Vec<Vec<String>> = error["examples"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|r| vec![f(r, "id"), short(&f(r, "message"), 100)])
        .collect();
    format!(
        "{}{} of {} waiting tasks refused by v{} (kept as a candidate)\n",
        render(&["TASK", "WHY ITS PAYLOAD DOES NOT FIT"], &rows),
        f(error, "failing"),
        f(error, "checked"),
        f(error, "version"),
    )
}

/// `task find`, `owner list`, `dead list`: one task a line, and the next page's cursor.
pub fn tasks(v: &Value) -> String {
    let rows: Vec<Vec<String>> = items(v)
        .iter()
        .map(|t| {
            vec![
                f(t, "id"),
                f(t, "plugin"),
                f(t, "state"),
                time(t, "run_at"),
                f(t, "owner"),
                format!("{}/{}", f(t, "attempts"), f(t, "max_attempts")),
                short(&f(t, "last_error"), 60),
            ]
        })
        .collect();
    let mut out = render(
        &[
            "ID",
            "PLUGIN",
            "STATE",
            "DUE (UTC)",
            "OWNER",
            "ATTEMPTS",
            "LAST ERROR",
        ],
        &rows,
    );
    if let Some(c) = v["next_cursor"].as_str() {
        out.push_str(&format!("more: --cursor {c}\n"));
    }
    out
}

/// `task get`: one field a line, the payload as JSON last.
pub fn task(t: &Value) -> String {
    let mut rows = vec![
        vec!["id".into(), f(t, "id")],
        vec!["plugin".into(), f(t, "plugin")],
        vec!["state".into(), f(t, "state")],
        vec!["due (UTC)".into(), time(t, "run_at")],
        vec!["owner".into(), f(t, "owner")],
        vec![
            "attempts".into(),
            format!("{} of {}", f(t, "attempts"), f(t, "max_attempts")),
        ],
        vec!["created (UTC)".into(), time(t, "created_at")],
    ];
    if !t["finished_at"].is_null() {
        rows.push(vec!["finished (UTC)".into(), time(t, "finished_at")]);
    }
    if !t["last_error"].is_null() {
        rows.push(vec!["last error".into(), short(&f(t, "last_error"), 200)]);
    }
    if !t["traceparent"].is_null() {
        rows.push(vec!["traceparent".into(), f(t, "traceparent")]);
    }
    if !t["start_by"].is_null() {
        rows.push(vec!["start by (UTC)".into(), time(t, "start_by")]);
    }
    if !t["priority"].is_null() {
        rows.push(vec!["priority".into(), f(t, "priority")]);
    }
    // what it listens for and the event that reached it: `topic:key -> cancel|run`
    for l in items(&t["on"]) {
        let on = format!("{}:{} -> {}", f(l, "topic"), f(l, "key"), f(l, "then"));
        rows.push(vec!["on".into(), on]);
    }
    if !t["lookback_ms"].is_null() {
        rows.push(vec!["lookback (ms)".into(), f(t, "lookback_ms")]);
    }
    if !t["event"].is_null() {
        rows.push(vec!["event".into(), short(&t["event"].to_string(), 200)]);
    }
    if !t["debounce"].is_null() {
        rows.push(vec!["debounce".into(), t["debounce"].to_string()]);
        let held = items(&t["batch"]).len();
        rows.push(vec![
            "batch".into(),
            format!(
                "{held} payloads, {} dropped, {} waiting for the next window",
                t["batch_dropped"].as_u64().unwrap_or(0),
                t["next_batch"].as_u64().unwrap_or(0)
            ),
        ]);
    }
    rows.push(vec!["payload".into(), t["payload"].to_string()]);
    let mut out = render(&["FIELD", "VALUE"], &rows);
    let log: Vec<Vec<String>> = items(&t["log"])
        .iter()
        .map(|l| {
            vec![
                f(l, "attempt"),
                time(l, "time"),
                f(l, "level"),
                short(&f(l, "message"), 160),
            ]
        })
        .collect();
    if !log.is_empty() {
        out.push('\n');
        out.push_str(&render(
            &["ATTEMPT", "TIME (UTC)", "LEVEL", "MESSAGE"],
            &log,
        ));
    }
    out
}

/// `plugin history`: the versions kept, newest first; which is current, and what a rollback
/// would make current.
pub fn history(p: &Value) -> String {
    let rows: Vec<Vec<String>> = items(&p["history"])
        .iter()
        .map(|e| {
            let state = if e["version"] == p["version"] {
                "current"
            } else if e["version"] == p["previous"] {
                "previous (rollback target)"
            } else if e["candidate"] == true {
                "candidate"
            } else {
                ""
            };
            vec![
                f(e, "version"),
                state.into(),
                time(e, "uploaded_at"),
                e["uploaded_by"].as_str().unwrap_or("-").into(),
                f(e, "size"),
                f(e, "digest").chars().take(12).collect(),
            ]
        })
        .collect();
    render(
        &["VERSION", "", "UPLOADED (UTC)", "BY", "BYTES", "DIGEST"],
        &rows,
    )
}

/// `owner stats`: the owner's tasks per plugin, a line of sums under them, and whether each
/// plugin's tasks of the owner are paused.
pub fn owner_stats(s: &Value) -> String {
    let all = s["paused"]["all"] == true;
    let paused = |p: &str| all || items(&s["paused"]["plugins"]).iter().any(|q| q == p);
    let mut rows: Vec<Vec<String>> = items(&s["plugins"])
        .iter()
        .map(|p| {
            let name = f(p, "plugin");
            let state = if paused(&name) { "paused" } else { "active" };
            vec![
                name,
                f(p, "scheduled"),
                f(p, "running"),
                f(p, "dead"),
                f(p, "pending"),
                state.into(),
            ]
        })
        .collect();
    rows.push(vec![
        "(all)".into(),
        f(s, "scheduled"),
        f(s, "running"),
        f(s, "dead"),
        String::new(),
        if all { "paused" } else { "" }.into(),
    ]);
    render(
        &["PLUGIN", "SCHEDULED", "RUNNING", "DEAD", "PENDING", "STATE"],
        &rows,
    )
}

/// `runners`.
pub fn runners(v: &Value) -> String {
    let rows: Vec<Vec<String>> = items(v)
        .iter()
        .map(|r| {
            let shards: Vec<String> = r["shards"]
                .as_array()
                .map(|a| a.iter().map(Value::to_string).collect())
                .unwrap_or_default();
            vec![
                f(r, "id"),
                f(r, "address"),
                shards.join(","),
                time(r, "last_seen"),
                time(r, "started_at"),
            ]
        })
        .collect();
    render(
        &[
            "ID",
            "ADDRESS",
            "SHARDS",
            "LAST SEEN (UTC)",
            "STARTED (UTC)",
        ],
        &rows,
    )
}

/// `schedule list`.
pub fn schedules(v: &Value) -> String {
    let rows: Vec<Vec<String>> = items(v)
        .iter()
        .map(|s| {
            let when = if s["cron"].is_string() {
                format!("cron {} {}", f(s, "cron"), f(s, "tz"))
            } else {
                format!("every {} ms", f(s, "every_ms"))
            };
            vec![
                f(s, "id"),
                f(s, "plugin"),
                when,
                if s["paused"] == true {
                    "paused"
                } else {
                    "active"
                }
                .into(),
                time(s, "next_run_at"),
            ]
        })
        .collect();
    render(&["ID", "PLUGIN", "WHEN", "STATE", "NEXT RUN (UTC)"], &rows)
}

/// `schedule get`: one schedule, its times as times and its next fire times.
pub fn schedule(s: &Value) -> String {
    let mut rows = vec![
        vec!["id".into(), f(s, "id")],
        vec!["plugin".into(), f(s, "plugin")],
    ];
    if s["cron"].is_string() {
        rows.push(vec![
            "cron".into(),
            format!("{} ({})", f(s, "cron"), f(s, "tz")),
        ]);
    } else {
        rows.push(vec!["every".into(), format!("{} ms", f(s, "every_ms"))]);
    }
    for (label, key) in [("starts (UTC)", "start_at"), ("ends (UTC)", "end_at")] {
        if !s[key].is_null() {
            rows.push(vec![label.into(), time(s, key)]);
        }
    }
    rows.push(vec!["owner".into(), f(s, "owner")]);
    rows.push(vec!["overlap".into(), f(s, "overlap")]);
    if !s["priority"].is_null() {
        rows.push(vec!["priority".into(), f(s, "priority")]);
    }
    let state = if s["paused"] == true {
        "paused"
    } else {
        "active"
    };
    rows.push(vec!["state".into(), state.into()]);
    rows.push(vec!["last firing".into(), f(s, "last_task_id")]);
    let upcoming: Vec<Value> = s["upcoming"].as_array().cloned().unwrap_or_default();
    for (i, t) in upcoming.iter().enumerate() {
        let label = if i == 0 { "next runs (UTC)" } else { "" };
        rows.push(vec![label.into(), time(&json!({ "t": t }), "t")]);
    }
    if upcoming.is_empty() {
        rows.push(vec!["next run (UTC)".into(), time(s, "next_run_at")]);
    }
    rows.push(vec!["payload".into(), s["payload"].to_string()]);
    render(&["FIELD", "VALUE"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_schedule_shows_its_times_as_times() {
        let out = schedule(&json!({
            "id": "sweep", "plugin": "coupon-expiry", "cron": "30 9 * * *", "tz": "Europe/Berlin",
            "overlap": "skip", "paused": false, "next_run_at": 1_800_000_000_000_i64,
            "upcoming": [1_800_000_000_000_i64, 1_800_086_400_000_i64], "payload": {}
        }));
        assert!(out.contains("2027-01-15 08:00:00"), "{out}");
        assert!(out.contains("2027-01-16 08:00:00"), "{out}");
        assert!(!out.contains("1800000000000"), "{out}");
    }

    #[test]
    fn columns_line_up() {
        let t = render(
            &["A", "LONGER"],
            &[
                vec!["xyz".into(), "1".into()],
                vec!["q".into(), "22".into()],
            ],
        );
        assert_eq!(t, "A    LONGER\nxyz  1\nq    22\n");
    }

    #[test]
    fn a_dead_list_shows_errors_on_one_line_and_the_cursor() {
        let v = json!({"tasks": [{"id": "t1", "plugin": "p", "state": "dead", "run_at": 0,
            "attempts": 3, "max_attempts": 3, "last_error": "boom\nat line 2"}],
            "next_cursor": "x.1.ab"});
        let t = tasks(&v);
        assert!(
            t.contains("t1  p       dead   1970-01-01 00:00:00  -      3/3       boom at line 2"),
            "{t}"
        );
        assert!(t.ends_with("more: --cursor x.1.ab\n"), "{t}");
    }

    #[test]
    fn a_task_shows_its_payload_as_json() {
        let t = task(
            &json!({"id": "t1", "plugin": "p", "state": "scheduled", "run_at": 1000,
            "attempts": 0, "max_attempts": 5, "created_at": 0, "payload": {"a": 1}}),
        );
        assert!(t.contains("payload        {\"a\":1}"), "{t}");
        assert!(!t.contains("last error"), "{t}");
    }
}
