//! `coupon-expiry`: reminds a user that a coupon expires soon. Scheduled at `expires_at` − 2 h;
//! emits a `coupon_expiring` event on the `push` topic for the push sender.

use eggtimer_sdk::{Outcome, Task, emit, handler};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
pub struct Coupon {
    pub coupon_id: String,
    pub user_id: String,
    pub expires_at: i64,
}

pub fn handle(task: Task<Coupon>) -> eggtimer_sdk::Result {
    let c = &task.payload;
    emit(
        "push",
        &json!({"type": "coupon_expiring", "coupon_id": c.coupon_id, "user_id": c.user_id, "expires_at": c.expires_at}),
    )?;
    Ok(Outcome::Done)
}

handler!(handle);

#[cfg(test)]
mod tests {
    use super::*;
    use eggtimer_sdk::testing::TestHost;

    #[test]
    fn emits_the_reminder() {
        let mut host = TestHost::new();
        let out = host.run_json(
            handle,
            r#"{"coupon_id":"c9","user_id":"u1","expires_at":1700007200000}"#,
        );
        assert_eq!(out, Ok(Outcome::Done));
        assert_eq!(
            host.events,
            vec![(
                "push".into(),
                json!({"type": "coupon_expiring", "coupon_id": "c9", "user_id": "u1", "expires_at": 1700007200000i64})
            )]
        );
    }
}
