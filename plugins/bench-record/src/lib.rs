//! `bench-record`: records when it ran, for the benchmarks (W5, W9) and the event tests. Emits
//! on topic `bench` `{"id", "due", "start", "payload", "event", "batch"}` (ms; `start` is the
//! host's clock when the handler began; `event` the event that made it run, if any; `batch` a
//! debounced task's payloads).

use eggtimer_sdk::{Outcome, Task, emit, handler, now};
use serde_json::json;

fn handle(task: Task<serde_json::Value>) -> eggtimer_sdk::Result {
    let start = now();
    emit(
        "bench",
        &json!({
            "id": task.id,
            "due": task.due,
            "start": start,
            "payload": task.payload,
            "event": task.event()?,
            "batch": task.batch()?,
        }),
    )?;
    Ok(Outcome::Done)
}

handler!(handle);
