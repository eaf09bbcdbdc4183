//! Reading event streams: a plugin's events of a topic live in its own stream
//! (`{eggtimer}:events:<plugin>:<topic>`).

use std::collections::HashMap;

/// The stream of one plugin's events of a topic.
pub fn events_key(plugin: &str, topic: &str) -> String {
    format!("{{eggtimer}}:events:{plugin}:{topic}")
}

/// One stream entry: its id as (ms, sequence) and its fields.
type Row = ((i64, i64), HashMap<String, String>);

fn rows(conn: &mut redis::Connection, key: &str) -> Vec<Row> {
    let rows: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query(conn)
        .unwrap();
    rows.into_iter()
        .map(|(id, fields)| {
            let (ms, seq) = id.split_once('-').unwrap();
            (
                (ms.parse().unwrap(), seq.parse().unwrap()),
                fields.into_iter().collect(),
            )
        })
        .collect()
}

/// The entries of these plugins' streams of a topic, in the order Redis added them.
fn merged(conn: &mut redis::Connection, plugins: &[&str], topic: &str) -> Vec<Row> {
    let mut all: Vec<Row> = plugins
        .iter()
        .flat_map(|p| rows(conn, &events_key(p, topic)))
        .collect();
    all.sort_by_key(|(id, _)| *id);
    all
}

/// An entry's `data` as JSON (null when it has none).
fn data_of(fields: &mut HashMap<String, String>) -> serde_json::Value {
    fields
        .remove("data")
        .map(|d| serde_json::from_str(&d).unwrap())
        .unwrap_or_default()
}

fn untimed(rows: Vec<Row>) -> Vec<(String, String, serde_json::Value)> {
    rows.into_iter()
        .map(|(_, mut f)| {
            let data = data_of(&mut f);
            (
                f.remove("task_id").unwrap_or_default(),
                f.remove("plugin").unwrap_or_default(),
                data,
            )
        })
        .collect()
}

fn timed(rows: Vec<Row>) -> Vec<(i64, String, serde_json::Value)> {
    rows.into_iter()
        .map(|((ms, _), mut f)| {
            let data = data_of(&mut f);
            (ms, f.remove("task_id").unwrap_or_default(), data)
        })
        .collect()
}

/// Every entry of one stream as (task_id, plugin, data JSON).
pub fn read_stream(
    conn: &mut redis::Connection,
    key: &str,
) -> Vec<(String, String, serde_json::Value)> {
    untimed(rows(conn, key))
}

/// Every entry of one stream as (Redis time of the XADD in ms, task_id, data JSON).
pub fn read_stream_timed(
    conn: &mut redis::Connection,
    key: &str,
) -> Vec<(i64, String, serde_json::Value)> {
    timed(rows(conn, key))
}

/// Every event of these plugins on a topic, in the order they were added: (task_id, plugin, data).
pub fn read_events(
    conn: &mut redis::Connection,
    plugins: &[&str],
    topic: &str,
) -> Vec<(String, String, serde_json::Value)> {
    untimed(merged(conn, plugins, topic))
}

/// Every event of these plugins on a topic, in the order they were added: (Redis time of the
/// XADD in ms, task_id, data).
pub fn read_events_timed(
    conn: &mut redis::Connection,
    plugins: &[&str],
    topic: &str,
) -> Vec<(i64, String, serde_json::Value)> {
    timed(merged(conn, plugins, topic))
}
