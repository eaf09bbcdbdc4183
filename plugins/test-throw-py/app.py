"""Test plugin: raises ``ValueError(payload["message"])``: an exception is a failed attempt."""

from eggtimer_sdk import plugin


def handle(task):
    raise ValueError(task.payload["message"])


WitWorld = plugin(handle)
