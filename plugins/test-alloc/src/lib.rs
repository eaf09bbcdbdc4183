//! Test plugin: allocates without bound (the host's memory cap must stop it).

use eggtimer_sdk::{Outcome, Task, handler};

fn handle(_task: Task<serde_json::Value>) -> eggtimer_sdk::Result {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        hoard.push(vec![1u8; 1 << 20]);
        if hoard.len() == usize::MAX {
            return Ok(Outcome::Done);
        }
    }
}

handler!(handle);
