//! `bench-record`: records when it ran, for the multi-process benchmark (W5). Emits on topic
//! `bench` `{"due", "start"}` (ms; `start` is the host's clock when the handler began).

use eggtimer_sdk::{Outcome, Task, emit, handler, now};
use serde_json::json;

fn handle(task: Task<serde_json::Value>) -> eggtimer_sdk::Result {
    let start = now();
    emit("bench", &json!({"due": task.due, "start": start}))?;
    Ok(Outcome::Done)
}

handler!(handle);
