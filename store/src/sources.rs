//! Sources: Redis Streams a team already has, read into events (`eggtimer source add`). Every
//! runner reads each source's stream as a consumer of one group, and acknowledges an entry only
//! once its event is published (its effects on the tasks listening for it recorded); an entry
//! a runner read and never acknowledged (it died) is claimed by another after
//! [`SOURCE_CLAIM_IDLE_MS`]. An entry read twice publishes its event twice, which acts once: a
//! task an event reached listens no more.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::{Event, Published, Store};

/// How long an entry read but not acknowledged stays with its reader before another takes it.
pub const SOURCE_CLAIM_IDLE_MS: u64 = 30_000;

/// A source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Source {
    pub name: String,
    /// The stream read.
    pub stream: String,
    /// The plugin whose emitted events are read (`stream` is its stream of one topic): each
    /// entry's event data is what the plugin emitted, its key the data's member `key_field`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// The entry field (the emitted data's member, for a plugin) whose value is the event's key.
    pub key_field: String,
    /// The topic its events are published to.
    pub topic: String,
    /// When it was added (ms).
    pub created_at: i64,
}

/// What one read of a source did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceRead {
    /// Entries read (and acknowledged).
    pub entries: u64,
    /// Of them, entries without the key field: acknowledged, published nothing.
    pub skipped: u64,
    pub published: Published,
}

type Entry = (String, Vec<(String, String)>);

impl Source {
    /// The event of one entry of the stream (None: it has no usable key).
    fn event_of(&self, fields: &[(String, String)]) -> Option<Event> {
        let (key, data) = if self.plugin.is_some() {
            // what the plugin emitted: `data`, JSON (the host checked it)
            let (_, data) = fields.iter().find(|(f, _)| f == "data")?;
            let data: serde_json::Value = serde_json::from_str(data).ok()?;
            let key = match data.get(&self.key_field)? {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
                _ => return None,
            };
            (key, data.to_string())
        } else {
            let (_, key) = fields.iter().find(|(f, _)| *f == self.key_field)?;
            let data: serde_json::Map<String, serde_json::Value> = fields
                .iter()
                .map(|(f, v)| (f.clone(), serde_json::Value::String(v.clone())))
                .collect();
            (key.clone(), serde_json::Value::Object(data).to_string())
        };
        eggtimer_base::limits::id("", &key).ok()?;
        Some(Event {
            topic: self.topic.clone(),
            key,
            data,
        })
    }
}

impl Store {
    /// What Redis holds at `key`: `stream`, `none`, or another type's name.
    pub async fn key_type(&self, key: &str) -> Result<String> {
        redis::cmd("TYPE")
            .arg(key)
            .query_async(&mut self.conn())
            .await
            .context("reading a key's type")
    }

    /// Adds (or replaces) a source; its group reads the stream's entries from now on. A plugin's
    /// emitted stream is made if it is not there yet; a team's stream must exist (asking creates
    /// no key).
    pub async fn source_put(&self, s: &Source) -> Result<()> {
        let mut create = redis::cmd("XGROUP");
        create
            .arg("CREATE")
            .arg(&s.stream)
            .arg(self.keys().source_group(&s.name))
            .arg("$");
        if s.plugin.is_some() {
            create.arg("MKSTREAM");
        }
        let created: redis::RedisResult<()> = create.query_async(&mut self.conn()).await;
        match created {
            Ok(()) => {}
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(e).context("creating the source's consumer group"),
        }
        let () = redis::cmd("HSET")
            .arg(self.keys().sources())
            .arg(&s.name)
            .arg(serde_json::to_string(s)?)
            .query_async(&mut self.conn())
            .await?;
        Ok(())
    }

    pub async fn source_list(&self) -> Result<Vec<Source>> {
        let all: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(self.keys().sources())
            .query_async(&mut self.conn())
            .await?;
        let mut out: Vec<Source> = all
            .into_iter()
            .map(|(name, v)| {
                serde_json::from_str(&v).with_context(|| format!("source {name:?}'s definition"))
            })
            .collect::<Result<_>>()?;
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Removes a source and its consumer group (the stream is the team's: it stays). False:
    /// none of that name.
    pub async fn source_delete(&self, name: &str) -> Result<bool> {
        let Some(s) = self
            .source_list()
            .await?
            .into_iter()
            .find(|s| s.name == name)
        else {
            return Ok(false);
        };
        let () = redis::cmd("HDEL")
            .arg(self.keys().sources())
            .arg(name)
            .query_async(&mut self.conn())
            .await?;
        let _: redis::RedisResult<i64> = redis::cmd("XGROUP")
            .arg("DESTROY")
            .arg(&s.stream)
            .arg(self.keys().source_group(name))
            .query_async(&mut self.conn())
            .await;
        Ok(true)
    }

    /// Reads up to `count` new entries of a source as `consumer` (and entries other consumers
    /// left unacknowledged for [`SOURCE_CLAIM_IDLE_MS`], when `reclaim`), publishes their events,
    /// then acknowledges them.
    pub async fn source_read(
        &self,
        s: &Source,
        consumer: &str,
        count: usize,
        reclaim: bool,
    ) -> Result<SourceRead> {
        let group = self.keys().source_group(&s.name);
        let mut entries: Vec<Entry> = Vec::new();
        if reclaim {
            let v: redis::Value = redis::cmd("XAUTOCLAIM")
                .arg(&s.stream)
                .arg(&group)
                .arg(consumer)
                .arg(SOURCE_CLAIM_IDLE_MS)
                .arg("0-0")
                .arg("COUNT")
                .arg(count)
                .query_async(&mut self.conn())
                .await
                .context("claiming a source's idle entries")?;
            if let redis::Value::Array(parts) = v
                && let Some(list) = parts.get(1)
            {
                entries = redis::from_redis_value(list.clone()).unwrap_or_default();
            }
        }
        if entries.is_empty() {
            let v: Option<Vec<(String, Vec<Entry>)>> = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(&group)
                .arg(consumer)
                .arg("COUNT")
                .arg(count)
                .arg("STREAMS")
                .arg(&s.stream)
                .arg(">")
                .query_async(&mut self.conn())
                .await
                .context("reading a source's stream")?;
            entries = v
                .unwrap_or_default()
                .into_iter()
                .flat_map(|(_, e)| e)
                .collect();
        }
        if entries.is_empty() {
            return Ok(SourceRead::default());
        }
        let mut events = Vec::new();
        let mut skipped = 0;
        for (_, fields) in &entries {
            match s.event_of(fields) {
                Some(e) => events.push(e),
                None => skipped += 1,
            }
        }
        let published = self.publish(&events).await?;
        let ids: Vec<&str> = entries.iter().map(|(id, _)| id.as_str()).collect();
        let _: i64 = redis::cmd("XACK")
            .arg(&s.stream)
            .arg(&group)
            .arg(&ids)
            .query_async(&mut self.conn())
            .await?;
        Ok(SourceRead {
            entries: entries.len() as u64,
            skipped,
            published,
        })
    }

    /// Entries of a source's stream its group has not read yet (Redis's `lag`; None when
    /// Redis can't tell).
    pub async fn source_lag(&self, s: &Source) -> Result<Option<u64>> {
        let groups: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&s.stream)
            .query_async(&mut self.conn())
            .await?;
        let group = self.keys().source_group(&s.name);
        Ok(groups.into_iter().find_map(|g| {
            let name: String = redis::from_redis_value(g.get("name")?.clone()).ok()?;
            if name != group {
                return None;
            }
            redis::from_redis_value(g.get("lag")?.clone()).ok()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(plugin: Option<&str>) -> Source {
        Source {
            name: "s".into(),
            stream: "x".into(),
            plugin: plugin.map(Into::into),
            key_field: "order_id".into(),
            topic: "orders".into(),
            created_at: 0,
        }
    }

    fn fields(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(f, v)| (f.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn an_entry_of_a_stream_is_an_event_of_its_fields() {
        let e = source(None)
            .event_of(&fields(&[("order_id", "o1"), ("amount", "5")]))
            .unwrap();
        assert_eq!((e.topic.as_str(), e.key.as_str()), ("orders", "o1"));
        assert_eq!(e.data, r#"{"amount":"5","order_id":"o1"}"#);
        assert!(source(None).event_of(&fields(&[("amount", "5")])).is_none());
        assert!(
            source(None)
                .event_of(&fields(&[("order_id", "a\u{1}b")]))
                .is_none(),
            "a key no task could listen for"
        );
    }

    #[test]
    fn an_emitted_event_is_keyed_by_a_member_of_its_data() {
        let emitted = |data: &str| {
            source(Some("order-cancel")).event_of(&fields(&[
                ("task_id", "t1"),
                ("plugin", "order-cancel"),
                ("data", data),
            ]))
        };
        let e = emitted(r#"{"order_id":"o1","type":"order_cancelled"}"#).unwrap();
        assert_eq!(e.key, "o1");
        assert_eq!(e.data, r#"{"order_id":"o1","type":"order_cancelled"}"#);
        assert_eq!(emitted(r#"{"order_id":42}"#).unwrap().key, "42");
        for none in [
            r#"{"order_id":1.5}"#,
            r#"{"order_id":null}"#,
            r#"{"other":"o1"}"#,
            r#"["o1"]"#,
            "not json",
        ] {
            assert!(emitted(none).is_none(), "{none}");
        }
    }
}
