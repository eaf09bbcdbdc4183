"""``coupon-expiry-py``: the coupon-expiry sample in Python. Scheduled at ``expires_at`` − 2 h; emits
a ``coupon_expiring`` event on the ``push`` topic (byte for byte what the Rust sample emits)."""

from dataclasses import dataclass

from eggtimer_sdk import Task, emit, plugin


@dataclass
class Coupon:
    coupon_id: str
    user_id: str
    expires_at: int


def handle(task: Task[Coupon]) -> None:
    c = task.payload
    emit("push", {"type": "coupon_expiring", "coupon_id": c.coupon_id, "user_id": c.user_id,
                  "expires_at": c.expires_at})


WitWorld = plugin(handle, Coupon)
