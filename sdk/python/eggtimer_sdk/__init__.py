"""The eggtimer plugin SDK for Python: one handler over a typed payload, and what a handler may do
while it runs (the WIT world ``eggtimer:plugin/checked``, wit/plugin.wit).

The host's types (``Task``, the ``Outcome_*`` variants, ``FollowUp``, ``Level``) are the ones
componentize-py generates from the WIT (``wit_world``); this module only adds a typed payload,
JSON in and out, and errors turned into failed attempts. Build a plugin with
``componentize-py -d wit/plugin.wit -w checked componentize app -p . -p <sdk/python>`` (sdk/README.md);
test it natively with :class:`eggtimer_sdk.testing.TestHost`.
"""

from __future__ import annotations

import dataclasses
import json
import types as types_mod
import typing
from typing import Any, Callable, Generic, Optional, TypeVar

import wit_world
from componentize_py_types import Err
from wit_world.imports import host, types

__all__ = ["Task", "Outcome", "plugin", "log", "now", "schedule", "cancel", "emit", "kv", "canonical_json"]

P = TypeVar("P")


@dataclasses.dataclass
class Task(Generic[P]):
    """A task as the handler sees it: the payload decoded into the plugin's payload type."""

    id: str
    plugin: str
    attempt: int
    """1 for the first attempt."""
    max_attempts: int
    due: int
    """Due time, ms since the Unix epoch."""
    owner: Optional[str]
    payload: P
    event: Optional["Event"] = None
    """The event that made it run (it listened for it with ``then: run``); None at its due time."""
    batch: list = dataclasses.field(default_factory=list)
    """A debounced task's payloads, oldest first (at most 1,000); ``payload`` is the latest."""


@dataclasses.dataclass
class Event:
    """An event that reached a task (``POST /v1/events/{topic}``)."""

    id: str
    topic: str
    key: str
    at: int
    """When it arrived, ms since the Unix epoch."""
    data: Any


class Outcome:
    """What a handler decided. Returning ``None`` is ``Outcome.done()``; raising is a failed attempt."""

    @staticmethod
    def done() -> types.Outcome:
        return types.Outcome_Done()

    @staticmethod
    def retry_after(ms: int) -> types.Outcome:
        """Try again after ``ms`` (counts as a failed attempt)."""
        return types.Outcome_RetryAfter(int(ms))

    @staticmethod
    def fail(reason: str) -> types.Outcome:
        """Give up: dead-letter the task with this reason."""
        return types.Outcome_Fail(str(reason))

    @staticmethod
    def run_again_at(at: int) -> types.Outcome:
        """Run this same task again at ``at`` (ms since the epoch), attempts reset."""
        return types.Outcome_RunAgainAt(int(at))


def canonical_json(value: Any) -> str:
    """JSON text the way the Rust SDK writes it (serde_json): keys sorted, no spaces, UTF-8 as is,
    so a plugin emits byte for byte what its Rust twin emits."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, float) and not v.is_integer():
        return "a number with a fraction"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def _fit(t: Any, v: Any, name: str) -> Any:
    """``v`` as the annotation ``t`` of field ``name`` says (str, int, float, bool, Optional,
    list, dict, a nested dataclass; anything else as is), or a TypeError naming the field."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if t is Any:
        return v
    if origin in (typing.Union, types_mod.UnionType):
        if v is None and type(None) in args:
            return None
        for a in (a for a in args if a is not type(None)):
            try:
                return _fit(a, v, name)
            except TypeError:
                pass
        raise TypeError(f"field {name}: {_json_type(v)} fits none of {t}")
    if dataclasses.is_dataclass(t):
        return _decode(t, v, f"{name}.")
    ok = {
        str: lambda: isinstance(v, str),
        bool: lambda: isinstance(v, bool),
        # as the runner reads an integer: `12` or `12.0`, within i64
        int: lambda: _integer(v) is not None,
        float: lambda: isinstance(v, (int, float)) and not isinstance(v, bool),
        list: lambda: isinstance(v, list),
        dict: lambda: isinstance(v, dict),
    }.get(origin or t)
    if ok is None:
        return v
    if not ok():
        expected = getattr(origin or t, "__name__", str(t))
        raise TypeError(f"field {name}: expected {expected}, got {_json_type(v)}")
    if origin is list and args:
        return [_fit(args[0], x, f"{name}[{i}]") for i, x in enumerate(v)]
    if t is int:
        return _integer(v)
    return float(v) if t is float else v


_I64 = (-(2**63), 2**63 - 1)


def _integer(v: Any) -> Optional[int]:
    """``v`` as an integer the way the runner reads one (``12`` or ``12.0``, within i64), else
    None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not v.is_integer():
        return None
    n = int(v)
    return n if _I64[0] <= n <= _I64[1] else None


def _schema_of(t: Any) -> dict:
    """The JSON Schema of an annotation (the types ``_fit`` checks; anything else: any)."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.Union, types_mod.UnionType):
        return {"anyOf": [_schema_of(a) for a in args]}
    if t is type(None):
        return {"type": "null"}
    if dataclasses.is_dataclass(t):
        hints = typing.get_type_hints(t)
        fields = dataclasses.fields(t)
        return {
            "type": "object",
            "properties": {f.name: _schema_of(hints.get(f.name, Any)) for f in fields},
            "required": [f.name for f in fields
                         if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING],
        }
    if origin is list:
        return {"type": "array", "items": _schema_of(args[0])} if args else {"type": "array"}
    simple = {str: "string", bool: "boolean", int: "integer", float: "number", list: "array", dict: "object"}
    key = origin or t
    return {"type": simple[key]} if key in simple else {}


def _decode(payload_type: Any, raw: Any, prefix: str = "") -> Any:
    """The payload as ``payload_type`` (a dataclass, or ``None`` for the JSON as is): a field
    missing or of the wrong JSON type is a TypeError naming it; fields the type does not name are
    ignored, as serde does."""
    if payload_type is None or not dataclasses.is_dataclass(payload_type):
        return raw
    if not isinstance(raw, dict):
        raise TypeError(f"{prefix or 'the payload'}: expected an object, got {_json_type(raw)}")
    hints = typing.get_type_hints(payload_type)
    values = {}
    for f in dataclasses.fields(payload_type):
        if f.name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TypeError(f"missing field {prefix}{f.name}")
            continue
        values[f.name] = _fit(hints.get(f.name, Any), raw[f.name], prefix + f.name)
    return payload_type(**values)


def plugin(handle: Callable[[Task[Any]], Optional[types.Outcome]], payload_type: Any = None) -> type:
    """Declares the plugin's handler: ``WitWorld = plugin(handle, MyPayload)`` in the app module.

    ``payload_type`` is a dataclass (or ``None`` for the decoded JSON as is); its fields' types
    (str, int, float, bool, Optional, list, dict, nested dataclasses) are checked, and its
    ``__post_init__`` may check values (raise ``ValueError`` naming what is wrong). The plugin's
    ``check`` decodes a payload the same way, so the runner refuses a task whose payload does not
    fit when it is scheduled; one that gets through anyway fails the task at once (retrying would
    not help). An exception raised by ``handle`` is a failed attempt, retried with backoff, with
    its message as the task's last error.
    """

    class Plugin(wit_world.WitWorld):
        def check(self, payload: str) -> None:
            """Whether ``handle`` could read this payload (the runner asks when a task is
            scheduled): raises ``Err`` naming what does not fit."""
            try:
                _decode(payload_type, json.loads(payload))
            except (ValueError, TypeError) as e:
                raise Err(str(e)) from e

        def payload_schema(self) -> Optional[str]:
            """The payload dataclass as a JSON Schema (``GET /v1/plugins/{name}`` shows it)."""
            if payload_type is None or not dataclasses.is_dataclass(payload_type):
                return None
            schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **_schema_of(payload_type)}
            return json.dumps(schema, sort_keys=True)

        def handle(self, task: types.Task) -> types.Outcome:
            try:
                payload = _decode(payload_type, json.loads(task.payload))
                batch = [_decode(payload_type, json.loads(p)) for p in host.batch()]
            except (ValueError, TypeError) as e:
                return types.Outcome_Fail(f"the payload does not fit this plugin: {e}")
            ev = host.event()
            event = None
            if ev is not None:
                e = json.loads(ev)
                event = Event(id=e["id"], topic=e["topic"], key=e["key"], at=e["at"], data=e.get("data"))
            typed = Task(
                id=task.id,
                plugin=task.plugin,
                attempt=task.attempt,
                max_attempts=task.max_attempts,
                due=task.due,
                owner=task.owner,
                payload=payload,
                event=event,
                batch=batch,
            )
            try:
                out = handle(typed)
            except Err:
                raise  # a host call's error, as is
            except Exception as e:  # noqa: BLE001 - every error of the handler fails the attempt
                raise Err(f"{type(e).__name__}: {e}") from e
            return types.Outcome_Done() if out is None else out

    Plugin.__name__ = Plugin.__qualname__ = "WitWorld"
    return Plugin


class _Log:
    """Log lines (kept with the task's run, bounded by the effects budget)."""

    def debug(self, message: str) -> None:
        host.log(types.Level.DEBUG, str(message))

    def info(self, message: str) -> None:
        host.log(types.Level.INFO, str(message))

    def warn(self, message: str) -> None:
        host.log(types.Level.WARN, str(message))

    def error(self, message: str) -> None:
        host.log(types.Level.ERROR, str(message))


log = _Log()


def now() -> int:
    """The host's clock, ms since the Unix epoch."""
    return host.now()


def schedule(plugin: str, payload: Any = None, at: Optional[int] = None, owner: Optional[str] = None,
             max_attempts: Optional[int] = None, priority: Optional[int] = None) -> str:
    """Schedules a follow-up task (``at`` defaults to now); returns its id, derived from this run's
    task so a re-run never schedules it twice. ``priority``, 0 (lowest) to 9 (highest), defaults
    to the priority of the task that schedules it."""
    t = types.FollowUp(
        plugin=plugin,
        payload=canonical_json(payload),
        run_at=now() if at is None else int(at),
        owner=owner,
        max_attempts=max_attempts,
    )
    if priority is None:
        return host.schedule(t)
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
        raise Err("priority must be an integer from 0 to 9")
    return host.schedule_with_priority(t, priority)


def cancel(id: str) -> None:
    """Cancels a scheduled task of this plugin."""
    host.cancel(id)


def emit(topic: str, data: Any) -> None:
    """Appends an event (any JSON value) to the topic's stream."""
    host.emit(topic, canonical_json(data))


class _Kv:
    """The plugin's own key-value store; values are JSON."""

    def get(self, key: str) -> Any:
        v = host.kv_get(key)
        return None if v is None else json.loads(v)

    def set(self, key: str, value: Any, ttl_ms: Optional[int] = None) -> None:
        host.kv_set(key, canonical_json(value), ttl_ms)

    def delete(self, key: str) -> None:
        host.kv_delete(key)


kv = _Kv()


def config(name: str) -> Optional[str]:
    """A value of the plugin's ``config`` setting, or None."""
    return host.config(name)


def secret(name: str) -> Optional[str]:
    """One of the plugin's secrets, or None. Never log or emit it."""
    return host.secret(name)


@dataclasses.dataclass
class Response:
    """An answer: ``status``, ``headers`` ([(name, value)]), ``body`` (bytes)."""

    status: int
    headers: list
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def header(self, name: str) -> Optional[str]:
        """The first header of this name (any case)."""
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)


class _Http:
    """Outbound HTTP through the host: only to the origins of the plugin's ``allowed_hosts``,
    within the run's budgets and time limit; redirects are returned, not followed. Each request
    carries an ``Idempotency-Key`` that is the same on every attempt of this occurrence of the
    task. A refused or failed request raises ``componentize_py_types.Err`` (a failed attempt,
    unless caught)."""

    def request(self, method: str, url: str, headers: Optional[dict] = None, body: Any = None,
                json_body: Any = None) -> Response:
        hs = [(k, str(v)) for k, v in (headers or {}).items()]
        if json_body is not None:
            hs.append(("Content-Type", "application/json"))
            data = canonical_json(json_body).encode()
        elif isinstance(body, str):
            data = body.encode()
        else:
            data = bytes(body or b"")
        r = host.http_send(types.HttpRequest(method=method, url=url, headers=hs, body=data))
        return Response(status=r.status, headers=list(r.headers), body=bytes(r.body))

    def get(self, url: str, **kw: Any) -> Response:
        return self.request("GET", url, **kw)

    def post(self, url: str, **kw: Any) -> Response:
        return self.request("POST", url, **kw)

    def put(self, url: str, **kw: Any) -> Response:
        return self.request("PUT", url, **kw)

    def delete(self, url: str, **kw: Any) -> Response:
        return self.request("DELETE", url, **kw)


http = _Http()
