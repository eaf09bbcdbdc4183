//! `auto-feed`: a pet finishes eating. Scheduled when the pet starts a meal, due when it is over;
//! the owner is the pet's user. With auto-feed cards left the pet is fed again: one card fewer, and
//! the next finish is scheduled `meal_ms` after this one. An acceleration card is an owner-wide
//! shift of −2 h (`POST /v1/owners/{user}/shift`), which needs nothing from this plugin.

use eggtimer_sdk::{FollowUp, Outcome, Task, emit, handler};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Four hours.
pub const DEFAULT_MEAL_MS: i64 = 4 * 3600 * 1000;

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Meal {
    pub pet_id: String,
    pub user_id: String,
    #[serde(default = "default_meal")]
    pub meal_ms: i64,
    #[serde(default)]
    pub auto_feed_cards: u32,
}

fn default_meal() -> i64 {
    DEFAULT_MEAL_MS
}

pub fn handle(task: Task<Meal>) -> eggtimer_sdk::Result {
    let m = &task.payload;
    emit(
        "pet",
        &json!({"type": "finished_eating", "pet_id": m.pet_id, "user_id": m.user_id}),
    )?;
    if m.auto_feed_cards > 0 {
        let cards_left = m.auto_feed_cards - 1;
        emit(
            "pet",
            &json!({"type": "auto_fed", "pet_id": m.pet_id, "user_id": m.user_id, "cards_left": cards_left}),
        )?;
        let next = Meal {
            auto_feed_cards: cards_left,
            ..m.clone()
        };
        eggtimer_sdk::schedule(
            FollowUp::new("auto-feed", &next)?
                .at(task.due + m.meal_ms)
                .owner(&m.user_id),
        )?;
    }
    Ok(Outcome::Done)
}

handler!(handle);

#[cfg(test)]
mod tests {
    use super::*;
    use eggtimer_sdk::testing::{TestHost, task};

    fn meal(cards: u32) -> Meal {
        Meal {
            pet_id: "p1".into(),
            user_id: "u1".into(),
            meal_ms: DEFAULT_MEAL_MS,
            auto_feed_cards: cards,
        }
    }

    #[test]
    fn without_cards_it_only_reports_the_finish() {
        let mut host = TestHost::new();
        assert_eq!(host.run(handle, task(meal(0))), Ok(Outcome::Done));
        assert_eq!(
            host.events,
            vec![(
                "pet".into(),
                json!({"type": "finished_eating", "pet_id": "p1", "user_id": "u1"})
            )]
        );
        assert!(host.scheduled.is_empty());
    }

    #[test]
    fn with_a_card_it_feeds_again_and_schedules_the_next_finish() {
        let mut host = TestHost::new();
        let t = task(meal(2));
        let due = t.due;
        assert_eq!(host.run(handle, t), Ok(Outcome::Done));
        assert_eq!(host.events[1].1["type"], "auto_fed");
        assert_eq!(host.events[1].1["cards_left"], 1);
        let (_, next) = &host.scheduled[0];
        assert_eq!(next.plugin, "auto-feed");
        assert_eq!(next.run_at, due + DEFAULT_MEAL_MS);
        assert_eq!(next.owner.as_deref(), Some("u1"));
        let payload: Meal = serde_json::from_str(&next.payload).unwrap();
        assert_eq!(payload.auto_feed_cards, 1);
    }

    #[test]
    fn defaults_apply_to_a_minimal_payload() {
        let mut host = TestHost::new();
        assert_eq!(
            host.run_json(handle, r#"{"pet_id":"p","user_id":"u"}"#),
            Ok(Outcome::Done)
        );
        assert!(matches!(
            host.run_json(handle, r#"{"pet":1}"#),
            Ok(Outcome::Fail(_))
        ));
    }
}
