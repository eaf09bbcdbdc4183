//! Who may do what: API keys with a role and plugin patterns, and the caller of one request.
//!
//! A key's secret is `et_<id>_<64 hex>`; Redis keeps only its SHA-256 (the secret carries 256
//! random bits, so a fast hash is enough: there is nothing to guess). The runner's `--token` is
//! the admin key. Patterns: a plugin name, a prefix ending in `*` (`order-*`), or `*` for every
//! plugin.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::names::matches;

/// A key's role; each has the rights of the ones before it.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Every GET.
    Reader,
    /// Schedule, move, cancel, run now, owner-wide actions, dead letters, recurring schedules,
    /// pause and resume.
    Operator,
    /// Upload, roll back and delete plugins; their settings.
    Developer,
    /// Everything: keys, any setting, the audit of everyone.
    Admin,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Operator => "operator",
            Role::Developer => "developer",
            Role::Admin => "admin",
        }
    }
}

/// Most patterns on one key or one `may_schedule` setting.
pub const MAX_PATTERNS: usize = 100;

/// The topics a key may publish events to, and listen on (patterns as [`matches`] reads them).
/// A topic's owners are the keys whose `publish` covers it: no other key can cancel or start
/// the tasks listening on it, and only keys whose `listen` covers it see its events. `streams`:
/// the Redis Streams of the team's own that an admin granted the key to read through a source.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TopicRights {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub publish: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listen: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub streams: Vec<String>,
}

impl TopicRights {
    /// Every topic, both ways (the runner's own token).
    pub fn all() -> TopicRights {
        TopicRights {
            publish: vec!["*".into()],
            listen: vec!["*".into()],
            streams: vec!["*".into()],
        }
    }
}

/// A key as Redis keeps it (never its secret).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeyRecord {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub plugins: Vec<String>,
    pub created_at: i64,
    /// What the plugins its patterns hold may add up to (None: no ceiling of the key's own).
    #[serde(default, flatten)]
    pub limits: KeyLimits,
    /// The topics it may publish to and listen on (none: neither).
    #[serde(default, flatten)]
    pub topics: TopicRights,
}

/// An admin's ceilings on what one key's plugins hold together.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeyLimits {
    /// Most plugins its patterns hold: the key uploads no new plugin past it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_plugins: Option<u32>,
    /// Most tasks (scheduled, running and dead) its plugins hold together: each plugin the key
    /// uploads gets what is left of it as the ceiling of its `max_pending`; the key uploads no
    /// new plugin when nothing is left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending: Option<u64>,
    /// Most bytes of tasks its plugins make Redis hold together (None: `--team-task-bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_bytes: Option<u64>,
    /// Most bytes of events it publishes within the event retention (None: `--events-max-bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_bytes: Option<u64>,
    /// Most bytes of kv keys and values its plugins keep together (None: `--team-kv-bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_bytes: Option<u64>,
    /// Most bytes of entries its plugins' emitted streams hold together (None:
    /// `--team-emitted-bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emitted_bytes: Option<u64>,
}

impl KeyLimits {
    pub fn is_none(&self) -> bool {
        self.max_plugins.is_none()
            && self.max_pending.is_none()
            && self.task_bytes.is_none()
            && self.event_bytes.is_none()
            && self.kv_bytes.is_none()
            && self.emitted_bytes.is_none()
    }
}

/// The most an admin gives one key as `task_bytes`, `event_bytes`, `kv_bytes` or
/// `emitted_bytes`: 1 TiB.
pub const MAX_TASK_BYTES: u64 = 1 << 40;

/// A new key's id and secret.
pub fn new_secret() -> (String, String) {
    let id = format!("{:016x}", rand::random::<u64>());
    let secret: [u8; 32] = rand::random();
    let key = format!("et_{id}_{}", hex::encode(secret));
    (id, key)
}

/// What Redis keeps to recognise a secret.
pub fn secret_hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Who sent a request: the admin (the runner's token, or no token at all) or a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The key's id (`admin` for the runner's token).
    pub key_id: String,
    /// The key's name (`admin` for the runner's token).
    pub name: String,
    pub role: Role,
    pub plugins: Vec<String>,
    /// The key's ceilings on what its plugins hold together.
    pub limits: KeyLimits,
    pub topics: TopicRights,
}

impl Caller {
    /// The runner's own token (or anyone, when it has none).
    pub fn admin() -> Caller {
        Caller {
            key_id: "admin".into(),
            name: "admin".into(),
            role: Role::Admin,
            plugins: vec!["*".into()],
            limits: KeyLimits::default(),
            topics: TopicRights::all(),
        }
    }

    pub fn of_key(k: &KeyRecord) -> Caller {
        Caller {
            key_id: k.id.clone(),
            name: k.name.clone(),
            role: k.role,
            plugins: k.plugins.clone(),
            limits: k.limits,
            topics: k.topics.clone(),
        }
    }

    /// Why this key may not publish to (`publish`) or listen on a topic (None: it may).
    pub fn refuses_topic(&self, topic: &str, publish: bool) -> Option<String> {
        let (patterns, what) = if publish {
            (&self.topics.publish, "publish to")
        } else {
            (&self.topics.listen, "listen on")
        };
        (!patterns.iter().any(|p| matches(p, topic))).then(|| {
            format!(
                "key {:?} may not {what} topic {topic:?} (its {} patterns: {})",
                self.name,
                if publish { "publish" } else { "listen" },
                if patterns.is_empty() {
                    "none".to_owned()
                } else {
                    patterns.join(", ")
                }
            )
        })
    }

    /// Why this key may not read the Redis Stream `stream` through a source (None: it may): an
    /// admin reads any; another key the streams its `streams` patterns name (an admin grants
    /// them: a team reads its own streams, never another team's).
    pub fn refuses_stream(&self, stream: &str) -> Option<String> {
        if self.role >= Role::Admin || self.topics.streams.iter().any(|p| matches(p, stream)) {
            return None;
        }
        Some(format!(
            "key {:?} may not read stream {stream:?} (its streams patterns: {}; an admin grants them with the key)",
            self.name,
            if self.topics.streams.is_empty() {
                "none".to_owned()
            } else {
                self.topics.streams.join(", ")
            }
        ))
    }

    /// Whether the key's patterns cover the plugin `name`.
    pub fn sees(&self, name: &str) -> bool {
        self.plugins.iter().any(|p| matches(p, name))
    }

    /// Whether the key sees every plugin.
    pub fn sees_all(&self) -> bool {
        self.plugins.iter().any(|p| p == "*")
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// Why this key may not act on plugin `name` (None: it may).
    pub fn refuses(&self, name: &str) -> Option<String> {
        (!self.sees(name)).then(|| {
            format!(
                "key {:?} may not act on plugin {name:?} (its plugins: {})",
                self.name,
                self.plugins.join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_hashed_and_unique() {
        let (id, key) = new_secret();
        assert!(key.starts_with(&format!("et_{id}_")));
        assert_eq!(key.len(), 3 + 16 + 1 + 64);
        assert_ne!(new_secret().1, key);
        assert_eq!(secret_hash(&key).len(), 64);
        assert!(!secret_hash(&key).contains(&key[20..]));
        assert_eq!(Role::parse("developer"), Some(Role::Developer));
        assert!(Role::Reader < Role::Operator && Role::Developer < Role::Admin);
        assert_eq!(Role::parse("root"), None);
    }
}
