//! Test plugin: never returns (the host's time limit must stop it).

use eggtimer_sdk::{Task, handler};

fn handle(_task: Task<serde_json::Value>) -> eggtimer_sdk::Result {
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

handler!(handle);
