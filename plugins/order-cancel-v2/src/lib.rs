//! `order-cancel`, version 2: the walkthrough's upgrade that waiting tasks can't take. A
//! cancellation now says why (`reason`, in the payload and the event), a field the tasks
//! scheduled for version 1 lack: uploaded as `order-cancel`, the runner's deploy check finds
//! them, keeps this version as a candidate and names them (README, "Five minutes", step 8).

use std::time::Duration;

use eggtimer_sdk::{Outcome, Task, emit, handler, kv};
use serde::Deserialize;
use serde_json::json;

/// An order left unpaid: which one, whose, and why it is cancelled.
#[derive(Deserialize, schemars::JsonSchema)]
pub struct Order {
    pub order_id: String,
    pub user_id: String,
    /// Why the order is cancelled (`unpaid`, `out_of_stock`, ...): new in version 2.
    pub reason: String,
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
        &json!({"type": "order_cancelled", "order_id": o.order_id, "user_id": o.user_id,
                "reason": o.reason}),
    )?;
    Ok(Outcome::Done)
}

handler!(handle, schema);

#[cfg(test)]
mod tests {
    use super::*;
    use eggtimer_sdk::testing::TestHost;

    #[test]
    fn a_payload_of_version_1_does_not_fit_and_one_with_a_reason_does() {
        let mut host = TestHost::new();
        let v1 = r#"{"order_id":"o1","user_id":"u1"}"#;
        assert!(
            matches!(host.run_json(handle, v1), Ok(Outcome::Fail(e)) if e.contains("reason")),
            "a v1 payload has no reason"
        );
        let v2 = r#"{"order_id":"o1","user_id":"u1","reason":"unpaid"}"#;
        assert_eq!(host.run_json(handle, v2), Ok(Outcome::Done));
        assert_eq!(host.events[0].1["reason"], "unpaid");
    }
}
