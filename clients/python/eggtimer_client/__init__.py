"""A client for eggtimer's HTTP API: schedule, move, cancel and read tasks from your own services.

Standard library only (urllib). Every call is one HTTP request; an error reply raises `EggtimerError`
with the API's status, code and message.

    from eggtimer_client import Client
    et = Client("http://127.0.0.1:8080", token=os.environ.get("EGGTIMER_TOKEN"))
    et.schedule("order-cancel", {"order_id": "o-17"}, id="cancel-o-17", delay_ms=15 * 60_000)
    et.move("cancel-o-17", shift_ms=-5 * 60_000)
    et.cancel("cancel-o-17")
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterator, Literal, Optional, TypedDict, Union, overload

__all__ = ["Client", "EggtimerError", "Task", "Scheduled", "Debounced", "TaskSpec", "Schedule"]


class EggtimerError(Exception):
    """An error reply of the API (`status`, `code`, `message`), or `status` 0 when it was unreachable."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class Met(TypedDict):
    """An event of a task's lookback that was already there when it was scheduled: the task was
    cancelled at once (`then`: `cancel`) or runs now with it (`run`)."""

    topic: str
    key: str
    then: Literal["cancel", "run"]


class _Scheduled(TypedDict):
    id: str
    run_at: int


class Scheduled(_Scheduled, total=False):
    """What scheduling answers: the task's id (generated when you gave none) and its due time
    (ms); `met` only when an event of its lookback was already there."""

    met: Met


class Debounced(TypedDict):
    """What scheduling a debounced task answers: its id (the debounce key) and what became of it:
    `new` (a window, due in quiet_ms), `merged` (joined the waiting task, which moved) or `queued`
    (the task runs, so the payload waits for its next window, which starts when the run ends)."""

    id: str
    debounced: Literal["new", "merged", "queued"]


class Task(TypedDict, total=False):
    """A task as the API shows it. Times are milliseconds since the Unix epoch."""

    id: str
    plugin: str
    payload: Any
    run_at: int
    owner: str
    max_attempts: int
    state: Literal["scheduled", "running", "done", "dead"]
    attempts: int
    last_error: str
    created_at: int
    finished_at: int
    traceparent: str
    on: list[dict[str, str]]
    event: dict[str, Any]
    batch: list[Any]
    priority: int


class TaskSpec(TypedDict, total=False):
    """One task of `schedule_many` (the fields of `POST /v1/tasks`)."""

    plugin: str
    payload: Any
    run_at: int
    delay_ms: int
    id: str
    owner: str
    max_attempts: int
    unique_for_ms: int
    traceparent: str
    on: list[dict[str, str]]
    lookback_ms: int
    debounce: dict[str, Any]
    priority: int


class Schedule(TypedDict, total=False):
    """A recurring schedule as the API shows it."""

    id: str
    plugin: str
    payload: Any
    cron: str
    every_ms: int
    tz: str
    owner: str
    paused: bool
    next_run_at: int
    upcoming: list
    last_task_id: str


def _segment(s: str) -> str:
    return urllib.parse.quote(s, safe="")


class Client:
    """One eggtimer (any runner of a namespace serves the whole namespace)."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        token: Optional[str] = None,
        timeout: float = 10.0,
        plugin: Optional[str] = None,
    ):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.plugin = plugin

    def in_plugin(self, plugin: str) -> "Client":
        """A client whose calls by task id name the task of this plugin (`?plugin=`): needed only
        where plugins your key may see each have a task of one id (else 409 `ambiguous_id`)."""
        return Client(self.url, self.token, self.timeout, plugin)

    def _task(self, id: str, then: str = "") -> str:
        q = "" if self.plugin is None else f"?plugin={_segment(self.plugin)}"
        return f"/v1/tasks/{_segment(id)}{then}{q}"

    # --- tasks -----------------------------------------------------------------------------

    @overload
    def schedule(self, plugin: str, payload: Any = None, *, run_at: Optional[int] = None,
                 delay_ms: Optional[int] = None, id: Optional[str] = None, owner: Optional[str] = None,
                 max_attempts: Optional[int] = None, unique_for_ms: Optional[int] = None,
                 traceparent: Optional[str] = None, on: Optional[list[dict[str, str]]] = None,
                 lookback_ms: Optional[int] = None, debounce: None = None,
                 priority: Optional[int] = None) -> Scheduled: ...

    @overload
    def schedule(self, plugin: str, payload: Any = None, *, run_at: Optional[int] = None,
                 delay_ms: Optional[int] = None, id: Optional[str] = None, owner: Optional[str] = None,
                 max_attempts: Optional[int] = None, unique_for_ms: Optional[int] = None,
                 traceparent: Optional[str] = None, on: Optional[list[dict[str, str]]] = None,
                 lookback_ms: Optional[int] = None, debounce: dict[str, Any]) -> Debounced: ...

    def schedule(
        self,
        plugin: str,
        payload: Any = None,
        *,
        run_at: Optional[int] = None,
        delay_ms: Optional[int] = None,
        id: Optional[str] = None,
        owner: Optional[str] = None,
        max_attempts: Optional[int] = None,
        unique_for_ms: Optional[int] = None,
        traceparent: Optional[str] = None,
        on: Optional[list[dict[str, str]]] = None,
        lookback_ms: Optional[int] = None,
        debounce: Optional[dict[str, Any]] = None,
        priority: Optional[int] = None,
    ) -> Union[Scheduled, Debounced]:
        """Schedules one task of `plugin` at `run_at` (ms) or after `delay_ms` (now without either).

        The same `id` again replaces a task that has not started (409 `conflict` while it runs).
        `on` lists events it listens for (`{"topic", "key", "then": "cancel" | "run"}`); `debounce`
        (`{"key", "quiet_ms", "max_wait_ms"}`) makes it one task per key that gathers payloads,
        answered with a `Debounced` (no due time) instead of a `Scheduled`. `priority` 0 (default)
        to 9: among the plugin's due tasks the higher starts first (not with `debounce`)."""
        spec: dict[str, Any] = {"plugin": plugin}
        for name, value in (
            ("payload", payload),
            ("run_at", run_at),
            ("delay_ms", delay_ms),
            ("id", id),
            ("owner", owner),
            ("max_attempts", max_attempts),
            ("unique_for_ms", unique_for_ms),
            ("traceparent", traceparent),
            ("on", on),
            ("lookback_ms", lookback_ms),
            ("debounce", debounce),
            ("priority", priority),
        ):
            if value is not None:
                spec[name] = value
        return self._call("POST", "/v1/tasks", spec)

    def schedule_many(self, specs: list[TaskSpec]) -> Union[list[Scheduled], list[Debounced]]:
        """Schedules up to 10,000 tasks at once, all or none (an error names the refused index):
        all debounced (answered with `Debounced`s) or none."""
        return self._call("POST", "/v1/tasks", list(specs))

    def get(self, id: str) -> Optional[Task]:
        """The task, or None when there is no such task (never scheduled, cancelled, or forgotten)."""
        try:
            return self._call("GET", self._task(id))
        except EggtimerError as e:
            if e.status == 404:
                return None
            raise

    def move(self, id: str, *, run_at: Optional[int] = None, shift_ms: Optional[int] = None) -> Scheduled:
        """Moves a scheduled task to `run_at` or by `shift_ms` (negative: earlier)."""
        if (run_at is None) == (shift_ms is None):
            raise ValueError("move takes one of run_at or shift_ms")
        body = {"run_at": run_at} if run_at is not None else {"shift_ms": shift_ms}
        return self._call("PATCH", self._task(id), body)

    def cancel(self, id: str) -> bool:
        """Cancels a scheduled task: True if it was cancelled, False if there was none."""
        try:
            self._call("DELETE", self._task(id))
            return True
        except EggtimerError as e:
            if e.status == 404:
                return False
            raise

    def run_now(self, id: str) -> None:
        """Makes a scheduled task due now."""
        self._call("POST", self._task(id, "/run"))

    # --- an owner's tasks ------------------------------------------------------------------

    def owner_tasks(self, owner: str) -> Iterator[Task]:
        """Every scheduled task of `owner`, soonest first, page by page."""
        cursor = None
        while True:
            query = {"limit": "1000"}
            if cursor:
                query["cursor"] = cursor
            page, headers = self._request("GET", f"/v1/owners/{_segment(owner)}/tasks", None, query)
            yield from page
            cursor = headers.get("X-Next-Cursor")
            if not cursor:
                return

    def shift_owner(self, owner: str, shift_ms: int, plugin: Optional[str] = None) -> int:
        """Moves every scheduled task of `owner` (of one plugin, if given) by `shift_ms`: how many moved."""
        body: dict[str, Any] = {"shift_ms": shift_ms}
        if plugin is not None:
            body["plugin"] = plugin
        return self._call("POST", f"/v1/owners/{_segment(owner)}/shift", body)["shifted"]

    def cancel_owner(self, owner: str, plugin: Optional[str] = None) -> int:
        """Cancels every scheduled task of `owner` (of one plugin, if given): how many were cancelled."""
        query = {"plugin": plugin} if plugin is not None else None
        return self._request("DELETE", f"/v1/owners/{_segment(owner)}/tasks", None, query)[0]["cancelled"]

    def pause_owner(self, owner: str, plugin: Optional[str] = None) -> dict[str, Any]:
        """Pauses the owner's tasks (of one plugin, if given): they wait, scheduled, until resumed.
        Returns the owner's pauses: {"all", "plugins"}."""
        body = {"plugin": plugin} if plugin is not None else {}
        return self._call("POST", f"/v1/owners/{_segment(owner)}/pause", body)["paused"]

    def resume_owner(self, owner: str, plugin: Optional[str] = None) -> int:
        """Resumes the owner's tasks (of one plugin; without one, every pause): how many were put back."""
        body = {"plugin": plugin} if plugin is not None else {}
        return self._call("POST", f"/v1/owners/{_segment(owner)}/resume", body)["resumed"]

    def owner_stats(self, owner: str) -> dict[str, Any]:
        """The owner's scheduled, running and dead tasks per plugin, and its pauses:
        {"owner", "plugins": [{"plugin", "scheduled", "running", "dead"}], "scheduled", "running", "dead",
        "paused": {"all", "plugins"}}."""
        return self._call("GET", f"/v1/owners/{_segment(owner)}/stats")

    # --- events ----------------------------------------------------------------------------

    def publish(self, topic: str, key: str, data: Any = None) -> int:
        """Publishes an event: the tasks listening on `topic` with `key` are cancelled or run now; how many it reached."""
        return self._call("POST", f"/v1/events/{_segment(topic)}", {"key": key, "data": data})["matched"]

    # --- recurring schedules ---------------------------------------------------------------

    def put_schedule(
        self,
        id: str,
        plugin: str,
        payload: Any = None,
        *,
        cron: Optional[str] = None,
        every_ms: Optional[int] = None,
        tz: Optional[str] = None,
        owner: Optional[str] = None,
        start_at: Optional[int] = None,
        end_at: Optional[int] = None,
        max_attempts: Optional[int] = None,
        overlap: Optional[Literal["skip", "allow"]] = None,
    ) -> dict:
        """Creates or replaces a recurring schedule (`cron` in `tz`, or `every_ms`): `{"id", "next_run_at"}`."""
        body: dict[str, Any] = {"plugin": plugin}
        for name, value in (
            ("payload", payload),
            ("cron", cron),
            ("every_ms", every_ms),
            ("tz", tz),
            ("owner", owner),
            ("start_at", start_at),
            ("end_at", end_at),
            ("max_attempts", max_attempts),
            ("overlap", overlap),
        ):
            if value is not None:
                body[name] = value
        return self._call("PUT", f"/v1/schedules/{_segment(id)}", body)

    def get_schedule(self, id: str) -> Optional[Schedule]:
        """The schedule with its next fire times, or None."""
        try:
            return self._call("GET", f"/v1/schedules/{_segment(id)}")
        except EggtimerError as e:
            if e.status == 404:
                return None
            raise

    def delete_schedule(self, id: str) -> None:
        """Deletes a schedule (firings already created stay)."""
        self._call("DELETE", f"/v1/schedules/{_segment(id)}")

    # --- the wire --------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        return self._request(method, path, body, None)[0]

    def _request(
        self, method: str, path: str, body: Any, query: Optional[dict[str, str]]
    ) -> tuple[Any, dict[str, str]]:
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None
        headers = {"Accept": "application/json"}
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                text = resp.read().decode()
                return (json.loads(text) if text else None), dict(resp.headers.items())
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            code, message = "http_error", text
            try:
                err = json.loads(text)["error"]
                code, message = err["code"], err["message"]
            except (ValueError, KeyError, TypeError):
                pass
            raise EggtimerError(e.code, code, message) from None
        except urllib.error.URLError as e:
            raise EggtimerError(0, "unreachable", f"{method} {url}: is eggtimer running there? ({e.reason})") from None
