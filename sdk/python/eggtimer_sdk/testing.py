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


def idempotency_key(task: str, occurrence: int, index: int) -> str:
    """The Idempotency-Key the runner gives the ``index``-th request of an occurrence."""
    return hashlib.sha256(f"http\n{task}\n{occurrence}\n{index}".encode()).hexdigest()[:32]


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
        #: What ``config(name)`` and ``secret(name)`` answer.
        self.config: dict[str, str] = {}
        self.secrets: dict[str, str] = {}
        #: The answers requests get, in order: ``(status, body)`` tuples, or an ``Err``.
        self.http_responses: list[Any] = []
        #: The requests sent, with the runner's Idempotency-Key.
        self.http_requests: list[types.HttpRequest] = []

    def kv(self, key: str) -> Any:
        v = self.kv_store.get(key)
        return None if v is None else json.loads(v)

    def run(self, world: type, payload: Any, id: str = "test-task", attempt: int = 1,
            max_attempts: int = 5, due: Optional[int] = None, owner: Optional[str] = None,
            event: Any = None, batch: Optional[list] = None) -> types.Outcome:
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
            "schedule_with_priority": self._schedule,
            "cancel": self.cancelled.append,
            "emit": self._emit,
            "kv_get": self.kv_store.get,
            "kv_set": lambda key, value, ttl_ms: self.kv_store.__setitem__(key, value),
            "kv_delete": lambda key: self.kv_store.pop(key, None),
            "config": self.config.get,
            "secret": self.secrets.get,
            "http_send": self._http_send,
            "event": lambda: None if event is None else json.dumps(event),
            "batch": lambda: [json.dumps(p) for p in (batch or [])],
        }
        self.http_requests = []
        saved = {name: getattr(host, name) for name in calls}
        for name, f in calls.items():
            setattr(host, name, f)
        try:
            return world().handle(task)
        finally:
            for name, f in saved.items():
                setattr(host, name, f)

    def _http_send(self, r: types.HttpRequest) -> types.HttpResponse:
        headers = list(r.headers)
        if not any(k.lower() == "idempotency-key" for k, _ in headers):
            headers.append(("Idempotency-Key", idempotency_key(self._task_id, self.occurrence, len(self.http_requests))))
        self.http_requests.append(types.HttpRequest(method=r.method, url=r.url, headers=headers, body=r.body))
        if not self.http_responses:
            raise Err(f"the test host has no response queued for {r.method} {r.url} (append one to http_responses)")
        answer = self.http_responses.pop(0)
        if isinstance(answer, Err):
            raise answer
        status, body = answer
        return types.HttpResponse(status=status, headers=[], body=body.encode() if isinstance(body, str) else body)

    def _emit(self, topic: str, data: str) -> None:
        if not _TOPIC.match(topic):
            raise Err(f"{topic!r} is not a topic: use 1 to 64 of a-z 0-9 . _ -")
        self.events.append((topic, json.loads(data)))

    def _schedule(self, t: types.FollowUp, priority: Optional[int] = None) -> str:
        if priority is not None and priority > 9:
            raise Err("priority must be an integer from 0 to 9")
        id = derive_id(self._task_id, self.occurrence, len(self.scheduled))
        self.scheduled.append((id, {"plugin": t.plugin, "payload": json.loads(t.payload), "run_at": t.run_at,
                                    "owner": t.owner, "max_attempts": t.max_attempts, "priority": priority}))
        return id
