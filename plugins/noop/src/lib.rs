//! `noop`: returns done at once. Used by the benchmarks.

use eggtimer_sdk::{Outcome, Task, handler};

fn handle(_task: Task<serde_json::Value>) -> eggtimer_sdk::Result {
    Ok(Outcome::Done)
}

handler!(handle);
