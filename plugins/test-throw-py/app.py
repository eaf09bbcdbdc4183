"""Test plugin: raises ``ValueError(payload["message"])``: an exception is a failed attempt. With
``priority`` instead, it schedules a follow-up of itself an hour ahead (of the task's owner) with
that priority, through the SDK's ``schedule``, and is done."""

from eggtimer_sdk import now, plugin, schedule


def handle(task):
    if "priority" in task.payload:
        schedule("test-throw-py", {"message": "a follow-up"}, at=now() + 3_600_000, owner=task.owner,
                 priority=task.payload["priority"])
        return
    raise ValueError(task.payload["message"])


WitWorld = plugin(handle)
