//! What a task carries beyond its payload (the events it listens for, the one that reached it, a
//! debounced task's window), as `lua/lib/extras.lua` stores it in the record's last field.

use serde::Serialize;

/// What a task carries beyond its payload, as `lua/lib/extras.lua` stores it: entries separated
/// by `\x1f`, each a letter and its value. (The task object shows each as a field of its own.)
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Extras {
    pub on: Vec<Listener>,
    pub lookback_ms: Option<u64>,
    /// JSON text.
    pub event: Option<String>,
    pub debounce: Option<Window>,
    /// JSON texts (held in the record by 0.2.0; see `window`).
    pub batch: Vec<String>,
    /// How many of the window's payloads are held in its list beside the record
    /// ([`ShardKeys::window`](super::keys::ShardKeys::window)), after `batch`.
    pub window: u64,
    pub batch_dropped: u64,
    pub next_batch: u64,
    /// 0 to 9 (0 is not stored).
    pub priority: u8,
}

/// How long before a task was scheduled an event still matches, when its spec does not say.
pub const DEFAULT_LOOKBACK_MS: u64 = 60_000;

/// An event a task listens for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct Listener {
    pub topic: String,
    pub key: String,
    /// `cancel` or `run`.
    pub then: Then,
}

/// What an event does to a task that listens for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Then {
    /// The task is cancelled.
    Cancel,
    /// The task runs now, with the event.
    Run,
}

impl Then {
    fn letter(self) -> char {
        match self {
            Then::Cancel => 'c',
            Then::Run => 'r',
        }
    }
}

/// A debounced task's window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Window {
    pub quiet_ms: u64,
    pub max_wait_ms: u64,
    /// When its first payload came (ms).
    pub first_at: i64,
}

impl Extras {
    /// Reads stored entries.
    pub fn decode(entries: &str) -> Extras {
        let mut x = Extras::default();
        for e in entries.split('\x1f') {
            let mut chars = e.chars();
            let Some(letter) = chars.next() else { continue };
            let v = chars.as_str();
            match letter {
                'o' => {
                    let then = if v.starts_with('c') {
                        Then::Cancel
                    } else {
                        Then::Run
                    };
                    if let Some((topic, key)) = v.get(1..).and_then(|r| r.split_once('\x1e')) {
                        x.on.push(Listener {
                            topic: topic.into(),
                            key: key.into(),
                            then,
                        });
                    }
                }
                'l' => x.lookback_ms = v.parse().ok(),
                // a listener's lookback is stored only when it is not the default
                's' => {
                    x.lookback_ms.get_or_insert(DEFAULT_LOOKBACK_MS);
                }
                'e' => x.event = Some(v.to_owned()),
                'q' => {
                    let mut p = v.split('\x1e').map(|n| n.parse::<i64>().unwrap_or(0));
                    let (q, m, f) = (p.next(), p.next(), p.next());
                    x.debounce = Some(Window {
                        quiet_ms: q.unwrap_or(0).max(0) as u64,
                        max_wait_ms: m.unwrap_or(0).max(0) as u64,
                        first_at: f.unwrap_or(0),
                    });
                }
                'b' => x.batch.push(v.to_owned()),
                'w' => x.window = held(v),
                'N' => x.next_batch += held(v),
                'm' => x.batch_dropped = v.parse().unwrap_or(0),
                'n' => x.next_batch += 1,
                'M' => x.next_batch += v.parse().unwrap_or(0),
                'P' => x.priority = v.parse().unwrap_or(0),
                _ => {}
            }
        }
        x
    }

    /// The entries a new task is scheduled with: its priority, and what it listens for (the
    /// scripts add a listening task's stamp). None when it has none.
    pub fn of_new(on: &[Listener], lookback_ms: u64, priority: u8) -> Option<String> {
        let mut parts: Vec<String> = on
            .iter()
            .map(|l| format!("o{}{}\x1e{}", l.then.letter(), l.topic, l.key))
            .collect();
        // (the default is not stored: a listener costs Redis what it must, see W9)
        if !on.is_empty() && lookback_ms != DEFAULT_LOOKBACK_MS {
            parts.push(format!("l{lookback_ms}"));
        }
        if priority > 0 {
            parts.push(format!("P{priority}"));
        }
        (!parts.is_empty()).then(|| parts.join("\x1f"))
    }
}

/// The count of a `w` or `N` entry (`<count>\x1e<bytes>`).
fn held(v: &str) -> u64 {
    v.split('\x1e')
        .next()
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}
