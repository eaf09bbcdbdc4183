"""A native test host: runs a plugin's handler in plain Python (pytest) and records what it asked
for. Needs the WIT bindings on the path (``componentize-py -d wit/plugin.wit -w plugin bindings
<dir>``; sdk/README.md)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Optional

from componentize_py_types import Err
from wit_world.imports import host, types

_TOPIC = re.compile(r"^[a-z0-9._-]{1,64}$")


def derive_id(parent: str, occurrence: int, index: int) -> str:
    """The id the runner gives a follow-up (the host's derivation)."""
    return hashlib.sha256(f"{parent}\n{occurrence}\n{index}".encode()).hexdigest()[:20]


class TestHost:
    """Runs a handler against recorded effects: ``events`` ([(topic, data)]), ``scheduled``
    ([(id, follow-up)]), ``cancelled``, ``logs`` and the kv store (``kv(key)``)."""

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self.now = 1_700_000_000_000
        self.kv_store: dict[str, str] = {}
        self.events: list[tuple[str, Any]] = []
        self.scheduled: list[tuple[str, dict[str, Any]]] = []
        self.cancelled: list[str] = []
        self.logs: list[tuple[str, str]] = []
        self.occurrence = 0
        self._task_id = ""

    def kv(self, key: str) -> Any:
        v = self.kv_store.get(key)
        return None if v is None else json.loads(v)

    def run(self, world: type, payload: Any, id: str = "test-task", attempt: int = 1,
            max_attempts: int = 5, due: Optional[int] = None, owner: Optional[str] = None) -> types.Outcome:
        """Runs the plugin class (``WitWorld`` of the app module) over ``payload`` (a value or JSON
        text). Returns the outcome; a failed attempt raises ``componentize_py_types.Err``."""
        self._task_id = id
        task = types.Task(id=id, plugin="test", attempt=attempt, max_attempts=max_attempts,
                          due=self.now if due is None else due, owner=owner,
                          payload=payload if isinstance(payload, str) else json.dumps(payload))
        calls = {
            "log": lambda level, message: self.logs.append((level.name.lower(), message)),
            "now": lambda: self.now,
            "schedule": self._schedule,
            "cancel": self.cancelled.append,
            "emit": self._emit,
            "kv_get": self.kv_store.get,
            "kv_set": lambda key, value, ttl_ms: self.kv_store.__setitem__(key, value),
            "kv_delete": lambda key: self.kv_store.pop(key, None),
        }
        saved = {name: getattr(host, name) for name in calls}
        for name, f in calls.items():
            setattr(host, name, f)
        try:
            return world().handle(task)
        finally:
            for name, f in saved.items():
                setattr(host, name, f)

    def _emit(self, topic: str, data: str) -> None:
        if not _TOPIC.match(topic):
            raise Err(f"{topic!r} is not a topic: use 1 to 64 of a-z 0-9 . _ -")
        self.events.append((topic, json.loads(data)))

    def _schedule(self, t: types.FollowUp) -> str:
        id = derive_id(self._task_id, self.occurrence, len(self.scheduled))
        self.scheduled.append((id, {"plugin": t.plugin, "payload": json.loads(t.payload), "run_at": t.run_at,
                                    "owner": t.owner, "max_attempts": t.max_attempts}))
        return id
