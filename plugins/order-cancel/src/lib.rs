//! `order-cancel`: cancels an order left unpaid. Scheduled when the order is placed, due when the
//! payment window ends; paying deletes the task. Emits `order_cancelled` on the `order` topic
//! exactly once per order, even if the task runs twice: the cancellation is recorded in the
//! plugin's kv store (applied atomically with the event).

use std::time::Duration;

use eggtimer_sdk::{Outcome, Task, emit, handler, kv};
use serde::Deserialize;
use serde_json::json;

/// An order left unpaid: which one, and whose.
// a task whose payload does not fit is refused when it is scheduled; `schema` below describes
// this type as JSON Schema (GET /v1/plugins/order-cancel shows it)
#[derive(Deserialize, schemars::JsonSchema)]
pub struct Order {
    pub order_id: String,
    pub user_id: String,
}

/// How long the "already cancelled" record is kept.
const REMEMBER: Duration = Duration::from_secs(30 * 24 * 3600);

pub fn handle(task: Task<Order>) -> eggtimer_sdk::Result {
    let o = &task.payload;
    let key = format!("cancelled:{}", o.order_id);
    if kv::get::<bool>(&key)?.is_some() {
        return Ok(Outcome::Done);
    }
    kv::set(&key, &true, Some(REMEMBER))?;
    emit(
        "order",
        &json!({"type": "order_cancelled", "order_id": o.order_id, "user_id": o.user_id}),
    )?;
    Ok(Outcome::Done)
}

handler!(handle, schema);

#[cfg(test)]
mod tests {
    use super::*;
    use eggtimer_sdk::testing::TestHost;

    #[test]
    fn cancels_once_even_when_run_twice() {
        let mut host = TestHost::new();
        let payload = r#"{"order_id":"o1","user_id":"u1"}"#;
        assert_eq!(host.run_json(handle, payload), Ok(Outcome::Done));
        assert_eq!(host.run_json(handle, payload), Ok(Outcome::Done));
        assert_eq!(
            host.events,
            vec![(
                "order".into(),
                json!({"type": "order_cancelled", "order_id": "o1", "user_id": "u1"})
            )]
        );
        assert!(host.kv.contains_key("cancelled:o1"));
    }
}
