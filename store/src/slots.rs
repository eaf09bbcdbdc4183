//! What the store keeps beside a plugin's settings: the runs waiting for its slots, and what a
//! rollback came to.

use eggtimer_base::plugin_settings::PluginEntry;

/// A run put back to wait for a concurrency slot: its task, occurrence and attempts (as the put
/// back recorded them, the attempt given back).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotWaiter {
    pub id: String,
    pub created: i64,
    pub attempts: u32,
}

impl SlotWaiter {
    pub(super) fn member(&self) -> String {
        format!("{}\t{}\t{}", self.id, self.created, self.attempts)
    }

    pub(super) fn parse(member: &str) -> Option<SlotWaiter> {
        let mut f = member.rsplitn(3, '\t');
        let attempts = f.next()?.parse().ok()?;
        let created = f.next()?.parse().ok()?;
        Some(SlotWaiter {
            id: f.next()?.to_owned(),
            created,
            attempts,
        })
    }
}

/// The bands of the waiting runs' scores (`lua/slots.lua`): a run due at `due` of priority `p`
/// waits with the score `due - p * PRIORITY_BAND` (due times stay below 2^44 ms, the year
/// 2527), so the highest priority comes first, each in due order, and a priority-0 run's score
/// is its due time, as runs waited before priorities.
pub const PRIORITY_BAND: i64 = 1 << 44;

/// The score a run waits for a slot with.
pub(super) fn waiting_score(due: i64, priority: u8) -> i64 {
    due.clamp(0, PRIORITY_BAND - 1) - i64::from(priority) * PRIORITY_BAND
}

/// Whose concurrency slots: a plugin's (`max_concurrency`), or those of one owner's runs of a
/// plugin (`max_concurrency_per_owner`).
#[derive(Debug, Clone, Copy)]
pub enum SlotsOf<'a> {
    Plugin(&'a str),
    Owner { plugin: &'a str, owner: &'a str },
}

/// Outcome of a rollback.
#[derive(Debug, PartialEq, Eq)]
pub enum Promoted {
    /// Now current.
    Done(PluginEntry),
    /// No such plugin, or no such version in its history.
    Missing,
    /// The current version is no longer the one the caller checked against.
    Moved,
}
