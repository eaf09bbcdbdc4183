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
use eggtimer_base::access::KeyRecord;

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
    /// The query string (without the `?`), when there is one.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub query: String,
    /// The names of the fields a JSON body of the request gave (a secret's name, never its
    /// value); empty for a body that is not a JSON object or is larger than 64 KiB.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    /// The plugin concerned, when one is.
    pub plugin: String,
    pub status: u16,
}

impl AuditEntry {
    /// A request that changed nothing (any 4xx or 5xx answer: refused, not found, invalid, over
    /// a limit): kept in a stream of its own, so that no number of failed requests pushes a
    /// change out of the audit of changes.
    pub fn refused(&self) -> bool {
        self.status >= 400
    }
}

/// The field a refusal counts in: its key's id, `admin` for the runner's token, `-` for a
/// request without a key the runner knows.
fn refusal_counter(e: &AuditEntry) -> &str {
    if e.key_id.is_empty() { "-" } else { &e.key_id }
}

/// The suffix of a refusal's id: the entries of both streams come newest first, and at one
/// stream id the change first.
const REFUSED: char = 'r';

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

    /// Every key, with when each was last used (ms) and how many of its requests were refused,
    /// oldest first.
    pub async fn key_list(&self) -> Result<Vec<(KeyRecord, Option<i64>, u64)>> {
        let k = self.keys();
        let (all, used, refused): (
            HashMap<String, String>,
            HashMap<String, i64>,
            HashMap<String, u64>,
        ) = redis::pipe()
            .cmd("HGETALL")
            .arg(k.api_keys())
            .cmd("HGETALL")
            .arg(k.api_key_used())
            .cmd("HGETALL")
            .arg(k.audit_refused_counts())
            .query_async(&mut self.conn())
            .await
            .context("listing keys")?;
        let mut keys: Vec<_> = all
            .values()
            .filter_map(|s| serde_json::from_str::<StoredKey>(s).ok())
            .map(|s| {
                let at = used.get(&s.record.id).copied();
                let n = refused.get(&s.record.id).copied().unwrap_or(0);
                (s.record, at, n)
            })
            .collect();
        keys.sort_by(|a, b| (a.0.created_at, &a.0.id).cmp(&(b.0.created_at, &b.0.id)));
        Ok(keys)
    }

    /// A key's record, when it was last used and how many of its requests were refused (None:
    /// no such key), with the stored text that [`Store::key_replace`] compares against.
    pub async fn key_by_id(
        &self,
        id: &str,
    ) -> Result<Option<(KeyRecord, Option<i64>, u64, String)>> {
        let k = self.keys();
        let (stored, used, refused): (Option<String>, Option<i64>, Option<u64>) = redis::pipe()
            .cmd("HGET")
            .arg(k.api_keys())
            .arg(id)
            .cmd("HGET")
            .arg(k.api_key_used())
            .arg(id)
            .cmd("HGET")
            .arg(k.audit_refused_counts())
            .arg(id)
            .query_async(&mut self.conn())
            .await
            .context("reading a key")?;
        Ok(stored.and_then(|s| {
            let record = serde_json::from_str::<StoredKey>(&s).ok()?.record;
            Some((record, used, refused.unwrap_or(0), s))
        }))
    }

    /// Replaces a key's record (its secret's hash kept) if it is still what `was` read: false
    /// when it was changed or revoked since (a revoked key is never brought back).
    pub async fn key_replace(&self, was: &str, record: &KeyRecord) -> Result<bool> {
        let hash = serde_json::from_str::<StoredKey>(was)
            .context("reading a stored key")?
            .hash;
        let stored = serde_json::to_string(&StoredKey {
            record: record.clone(),
            hash,
        })?;
        let replaced: i64 = self
            .inner
            .scripts
            .key_replace
            .key(self.keys().api_keys())
            .arg(&record.id)
            .arg(was)
            .arg(stored)
            .invoke_async(&mut self.conn())
            .await
            .context("changing a key")?;
        Ok(replaced == 1)
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
        p.cmd("HDEL").arg(k.audit_refused_counts()).arg(id).ignore();
        p.query_async::<()>(&mut self.conn())
            .await
            .context("tidying a revoked key's index")?;
        Ok(removed == 1)
    }

    /// The namespace's key for sealing page cursors: made (random) by the first runner that needs
    /// it, the same for every runner after.
    pub async fn cursor_key(&self) -> Result<[u8; 32]> {
        let k = self.keys().cursor_key();
        let mut conn = self.conn();
        let mut hex_key: Option<String> = redis::cmd("GET")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .context("reading the cursor key")?;
        if hex_key.is_none() {
            let fresh: [u8; 32] = rand::random();
            let (got,): (Option<String>,) = redis::pipe()
                .cmd("SET")
                .arg(&k)
                .arg(hex::encode(fresh))
                .arg("NX")
                .ignore()
                .cmd("GET")
                .arg(&k)
                .query_async(&mut conn)
                .await
                .context("making the cursor key")?;
            hex_key = got;
        }
        let mut key = [0u8; 32];
        hex::decode_to_slice(hex_key.unwrap_or_default().trim(), &mut key)
            .context("the cursor key is not 64 hex digits")?;
        Ok(key)
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

    /// Appends to the audit (the changes' stream or the refusals'), keeping at most `max_len`
    /// entries in each and none older than `keep_ms`.
    pub async fn audit_add(&self, e: &AuditEntry, keep_ms: i64, max_len: u64) -> Result<()> {
        let k = self.keys();
        let stream = if e.refused() {
            k.audit_refused()
        } else {
            k.audit()
        };
        let mut inv = self.inner.scripts.audit.prepare_invoke();
        inv.key(stream)
            .arg(max_len)
            .arg(e.at.saturating_sub(keep_ms).max(0));
        if e.refused() {
            inv.key(k.audit_refused_counts()).arg(refusal_counter(e));
        } else {
            inv.arg("");
        }
        for (field, value) in [
            ("at", e.at.to_string()),
            ("key", e.key.clone()),
            ("key_id", e.key_id.clone()),
            ("method", e.method.clone()),
            ("path", e.path.clone()),
            ("query", e.query.clone()),
            ("fields", e.fields.join(",")),
            ("plugin", e.plugin.clone()),
            ("status", e.status.to_string()),
        ] {
            inv.arg(field).arg(value);
        }
        inv.invoke_async::<String>(&mut self.conn())
            .await
            .map(|_| ())
            .context("appending to the audit")
    }

    /// Up to `count` audit entries of both streams, newest first (at one stream id the change
    /// first), after the entry `cursor` (an entry's id; None: from the newest).
    pub async fn audit_page(&self, cursor: Option<&str>, count: usize) -> Result<Vec<AuditEntry>> {
        let k = self.keys();
        // after a change at X: the refusals from X on (X included), the changes before X; after
        // a refusal at X: both before X
        let (changes_end, refused_end) = match cursor {
            None => ("+".to_owned(), "+".to_owned()),
            Some(c) => match c.strip_suffix(REFUSED) {
                Some(x) => (format!("({x}"), format!("({x}")),
                None => (format!("({c}"), c.to_owned()),
            },
        };
        let mut all = self
            .audit_read(&k.audit(), &changes_end, count, false)
            .await?;
        all.extend(
            self.audit_read(&k.audit_refused(), &refused_end, count, true)
                .await?,
        );
        let place = |e: &AuditEntry| {
            let id = e.id.trim_end_matches(REFUSED);
            let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
            let n = |s: &str| s.parse::<u64>().unwrap_or(0);
            (n(ms), n(seq), !e.id.ends_with(REFUSED))
        };
        all.sort_by_key(|e| std::cmp::Reverse(place(e)));
        all.truncate(count);
        Ok(all)
    }

    /// Up to `count` entries of one audit stream from `end` down.
    async fn audit_read(
        &self,
        stream: &str,
        end: &str,
        count: usize,
        refused: bool,
    ) -> Result<Vec<AuditEntry>> {
        if end
            .trim_start_matches('(')
            .split('-')
            .all(|n| n.bytes().all(|c| c == b'0'))
            && end.starts_with('(')
        {
            return Ok(Vec::new()); // nothing is before 0-0
        }
        let rows: Vec<(String, Vec<(String, String)>)> = redis::cmd("XREVRANGE")
            .arg(stream)
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
                    id: if refused {
                        format!("{id}{REFUSED}")
                    } else {
                        id
                    },
                    ..AuditEntry::default()
                };
                for (f, v) in fields {
                    match f.as_str() {
                        "at" => e.at = v.parse().unwrap_or(0),
                        "key" => e.key = v,
                        "key_id" => e.key_id = v,
                        "method" => e.method = v,
                        "path" => e.path = v,
                        "query" => e.query = v,
                        "fields" => {
                            e.fields = v
                                .split(',')
                                .filter(|f| !f.is_empty())
                                .map(Into::into)
                                .collect()
                        }
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
