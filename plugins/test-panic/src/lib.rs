//! Test plugin: panics (a trap in wasm).

use eggtimer_sdk::{Task, handler};

fn handle(task: Task<serde_json::Value>) -> eggtimer_sdk::Result {
    panic!("test-panic was asked to panic by task {}", task.id);
}

handler!(handle);
