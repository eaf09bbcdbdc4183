"""``order-cancel-py``: the order-cancel sample in Python. Cancels an order left unpaid and emits
``order_cancelled`` on the ``order`` topic exactly once per order, even if the task runs twice: the
cancellation is recorded in the plugin's kv store (applied together with the event)."""

from dataclasses import dataclass

from eggtimer_sdk import Task, emit, kv, plugin

REMEMBER_MS = 30 * 24 * 3600 * 1000
"""How long the "already cancelled" record is kept."""


@dataclass
class Order:
    order_id: str
    user_id: str


def handle(task: Task[Order]) -> None:
    o = task.payload
    key = f"cancelled:{o.order_id}"
    if kv.get(key) is not None:
        return  # cancelled by an earlier run
    kv.set(key, True, REMEMBER_MS)
    emit("order", {"type": "order_cancelled", "order_id": o.order_id, "user_id": o.user_id})


WitWorld = plugin(handle, Order)
