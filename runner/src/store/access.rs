//! API keys and the audit stream (see `access.rs` for what a key is).
//!
//! A key is the JSON record under its id in `apikeys`, found by its secret's hash through
//! `apikey:hashes`. Revoking deletes the record first: from that command on, a lookup of the key
//! finds nothing, whatever is left of its index. The audit is the Redis Stream `audit`, trimmed
//! by age and length on every append.

use std::collections::HashMap;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::Store;
use crate::access::KeyRecord;

/// A key as stored: its record and its secret's hash.
#[derive(Serialize, Deserialize)]
struct StoredKey {
    #[serde(flatten)]
    record: KeyRecord,
    hash: String,
}

/// One audit entry.
#[derive(Clone, Debug, Default, Serialize, utoipa::ToSchema)]
pub struct AuditEntry {
    /// Its place in the stream (a cursor).
    pub id: String,
    /// When, in ms since the Unix epoch.
    pub at: i64,
    /// The key's name (`admin` for the runner's token; empty when no key was recognised).
    pub key: String,
    pub key_id: String,
    pub method: String,
    pub path: String,
    /// The plugin concerned, when one is.
    pub plugin: String,
    pub status: u16,
}

impl Store {
    /// Stores a new key under the hash of its secret.
    pub async fn key_put(&self, record: &KeyRecord, hash: &str) -> Result<()> {
        let k = self.keys();
        let stored = serde_json::to_string(&StoredKey {
            record: record.clone(),
            hash: hash.to_owned(),
        })?;
        // The record first: an index entry never points at nothing while the key is new.
        redis::pipe()
            .cmd("HSET")
            .arg(k.api_keys())
            .arg(&record.id)
            .arg(stored)
            .ignore()
            .cmd("HSET")
            .arg(k.api_key_hashes())
            .arg(hash)
            .arg(&record.id)
            .ignore()
            .query_async::<()>(&mut self.conn())
            .await
            .context("storing a key")
    }

    /// The key whose secret has this hash (None: unknown or revoked).
    pub async fn key_by_hash(&self, hash: &str) -> Result<Option<KeyRecord>> {
        let k = self.keys();
        let id: Option<String> = redis::cmd("HGET")
            .arg(k.api_key_hashes())
            .arg(hash)
            .query_async(&mut self.conn())
            .await
            .context("looking a key up")?;
        let Some(id) = id else { return Ok(None) };
        let stored: Option<String> = redis::cmd("HGET")
            .arg(k.api_keys())
            .arg(&id)
            .query_async(&mut self.conn())
            .await
            .context("reading a key")?;
        Ok(stored
            .and_then(|s| serde_json::from_str::<StoredKey>(&s).ok())
            .filter(|s| s.hash == hash)
            .map(|s| s.record))
    }

    /// Every key, with when each was last used (ms), oldest first.
    pub async fn key_list(&self) -> Result<Vec<(KeyRecord, Option<i64>)>> {
        let k = self.keys();
        let (all, used): (HashMap<String, String>, HashMap<String, i64>) = redis::pipe()
            .cmd("HGETALL")
            .arg(k.api_keys())
            .cmd("HGETALL")
            .arg(k.api_key_used())
            .query_async(&mut self.conn())
            .await
            .context("listing keys")?;
        let mut keys: Vec<_> = all
            .values()
            .filter_map(|s| serde_json::from_str::<StoredKey>(s).ok())
            .map(|s| {
                let at = used.get(&s.record.id).copied();
                (s.record, at)
            })
            .collect();
        keys.sort_by(|a, b| (a.0.created_at, &a.0.id).cmp(&(b.0.created_at, &b.0.id)));
        Ok(keys)
    }

    /// Revokes a key; false when there is no such key.
    pub async fn key_delete(&self, id: &str) -> Result<bool> {
        let k = self.keys();
        let stored: Option<String> = redis::cmd("HGET")
            .arg(k.api_keys())
            .arg(id)
            .query_async(&mut self.conn())
            .await
            .context("reading a key")?;
        let Some(stored) = stored else {
            return Ok(false);
        };
        // The record first: that is the revocation; the index entries are only tidied after.
        let removed: i64 = redis::cmd("HDEL")
            .arg(k.api_keys())
            .arg(id)
            .query_async(&mut self.conn())
            .await
            .context("revoking a key")?;
        let mut p = redis::pipe();
        if let Ok(s) = serde_json::from_str::<StoredKey>(&stored) {
            p.cmd("HDEL").arg(k.api_key_hashes()).arg(s.hash).ignore();
        }
        p.cmd("HDEL").arg(k.api_key_used()).arg(id).ignore();
        p.query_async::<()>(&mut self.conn())
            .await
            .context("tidying a revoked key's index")?;
        Ok(removed == 1)
    }

    /// Records that a key was used at `at` (ms).
    pub async fn key_used(&self, id: &str, at: i64) -> Result<()> {
        redis::cmd("HSET")
            .arg(self.keys().api_key_used())
            .arg(id)
            .arg(at)
            .query_async::<()>(&mut self.conn())
            .await
            .context("recording a key's use")
    }

    /// Appends to the audit, keeping at most `max_len` entries and none older than `keep_ms`.
    pub async fn audit_add(&self, e: &AuditEntry, keep_ms: i64, max_len: u64) -> Result<()> {
        let key = self.keys().audit();
        redis::pipe()
            .cmd("XADD")
            .arg(&key)
            .arg("MAXLEN")
            .arg("~")
            .arg(max_len)
            .arg("*")
            .arg("at")
            .arg(e.at)
            .arg("key")
            .arg(&e.key)
            .arg("key_id")
            .arg(&e.key_id)
            .arg("method")
            .arg(&e.method)
            .arg("path")
            .arg(&e.path)
            .arg("plugin")
            .arg(&e.plugin)
            .arg("status")
            .arg(e.status)
            .ignore()
            .cmd("XTRIM")
            .arg(&key)
            .arg("MINID")
            .arg("~")
            .arg(e.at.saturating_sub(keep_ms).max(0))
            .ignore()
            .query_async::<()>(&mut self.conn())
            .await
            .context("appending to the audit")
    }

    /// Up to `count` audit entries, newest first, before the entry `before` (None: from the
    /// newest).
    pub async fn audit_page(&self, before: Option<&str>, count: usize) -> Result<Vec<AuditEntry>> {
        if before.is_some_and(|b| b.split('-').all(|n| n.bytes().all(|c| c == b'0'))) {
            return Ok(Vec::new()); // nothing is before 0-0
        }
        let end = before.map_or_else(|| "+".to_owned(), |b| format!("({b}"));
        let rows: Vec<(String, Vec<(String, String)>)> = redis::cmd("XREVRANGE")
            .arg(self.keys().audit())
            .arg(end)
            .arg("-")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.conn())
            .await
            .context("reading the audit")?;
        Ok(rows
            .into_iter()
            .map(|(id, fields)| {
                let mut e = AuditEntry {
                    id,
                    ..AuditEntry::default()
                };
                for (f, v) in fields {
                    match f.as_str() {
                        "at" => e.at = v.parse().unwrap_or(0),
                        "key" => e.key = v,
                        "key_id" => e.key_id = v,
                        "method" => e.method = v,
                        "path" => e.path = v,
                        "plugin" => e.plugin = v,
                        "status" => e.status = v.parse().unwrap_or(0),
                        _ => {}
                    }
                }
                e
            })
            .collect())
    }
}
