//! Test plugin: a hostile payload check. Its payload type's deserializer (which the SDK's
//! `check` runs when a task is scheduled) sleeps `check_ms` milliseconds in a blocking WASI
//! call, holding whatever the runner gave the check for as long as it may.

use std::time::Duration;

use eggtimer_sdk::{Outcome, Task, handler};
use serde::{Deserialize, Deserializer};

pub struct Slow;

impl<'de> Deserialize<'de> for Slow {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Slow, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        let ms = v.get("check_ms").and_then(|m| m.as_u64()).unwrap_or(0);
        std::thread::sleep(Duration::from_millis(ms));
        Ok(Slow)
    }
}

pub fn handle(_task: Task<Slow>) -> eggtimer_sdk::Result {
    Ok(Outcome::Done)
}

handler!(handle);
