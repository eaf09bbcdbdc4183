//! Test plugin: sleeps in a blocking WASI call (`std::thread::sleep`, a poll on a monotonic
//! clock) for `ms` milliseconds, then emits `{"slept": ms, "tag", "started_at"}` on the `sleep`
//! topic. Longer than the time limit it is a hostile plugin the host must cut at its deadline;
//! shorter, a slow handler.

use std::time::Duration;

use eggtimer_sdk::{Outcome, Task, emit, handler};
use serde::Deserialize;

#[derive(Deserialize)]
pub struct Sleep {
    pub ms: u64,
    /// A tag echoed in the event (tests tell runs apart by it).
    #[serde(default)]
    pub tag: String,
}

pub fn handle(task: Task<Sleep>) -> eggtimer_sdk::Result {
    let started_at = eggtimer_sdk::now();
    std::thread::sleep(Duration::from_millis(task.payload.ms));
    emit(
        "sleep",
        &serde_json::json!({"slept": task.payload.ms, "tag": task.payload.tag, "started_at": started_at}),
    )?;
    Ok(Outcome::Done)
}

handler!(handle);
