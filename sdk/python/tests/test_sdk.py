"""The SDK over its native test host (pytest, with the WIT bindings on PYTHONPATH)."""

from dataclasses import dataclass, field
from typing import List, Optional

import pytest
from componentize_py_types import Err
from wit_world.imports import types

from eggtimer_sdk import Outcome, Task, canonical_json, emit, kv, log, now, plugin, schedule
from eggtimer_sdk.testing import TestHost, derive_id


@dataclass
class Greeting:
    user: str


def greet(task: Task[Greeting]):
    emit("push", {"user": task.payload.user, "b": 2, "a": 1})
    kv.set("seen", {"n": 1}, 60_000)
    log.info("hello")
    schedule("next", {"after": task.id}, at=now() + 5)


def test_a_handler_gets_a_typed_payload_and_its_effects_are_recorded():
    host = TestHost()
    assert host.run(plugin(greet, Greeting), {"user": "u1", "ignored": True}) == types.Outcome_Done()
    assert host.events == [("push", {"a": 1, "b": 2, "user": "u1"})]
    assert host.kv("seen") == {"n": 1}
    assert host.logs == [("info", "hello")]
    [(id, t)] = host.scheduled
    assert id == derive_id("test-task", 0, 0)
    assert t == {"plugin": "next", "payload": {"after": "test-task"}, "run_at": host.now + 5,
                 "owner": None, "max_attempts": None, "priority": None}


def test_a_follow_ups_priority_is_passed_on_and_outside_0_to_9_refused():
    def urgent(task):
        schedule("next", priority=9)
        schedule("next")
        for p in (10, -1, 1.5, "9", True):
            try:
                schedule("next", priority=p)
            except Err as e:
                assert e.value == "priority must be an integer from 0 to 9"
            else:
                raise AssertionError(f"priority {p!r} was taken")

    host = TestHost()
    assert host.run(plugin(urgent), {}) == types.Outcome_Done()
    assert [t["priority"] for _, t in host.scheduled] == [9, None]


def test_outcomes_are_the_wit_variants():
    host = TestHost()
    assert host.run(plugin(lambda t: Outcome.retry_after(5000)), {}) == types.Outcome_RetryAfter(5000)
    assert host.run(plugin(lambda t: Outcome.fail("no")), {}) == types.Outcome_Fail("no")
    assert host.run(plugin(lambda t: Outcome.run_again_at(7)), {}) == types.Outcome_RunAgainAt(7)


def test_a_payload_that_does_not_fit_fails_and_an_exception_is_a_failed_attempt():
    host = TestHost()
    out = host.run(plugin(greet, Greeting), {"nobody": 1})
    assert isinstance(out, types.Outcome_Fail) and "does not fit" in out.value
    with pytest.raises(Err) as e:
        host.run(plugin(lambda t: 1 / 0), {})
    assert e.value.value == "ZeroDivisionError: division by zero"
    with pytest.raises(Err) as e:
        host.run(plugin(lambda t: emit("Bad Topic", {})), {})
    assert "not a topic" in e.value.value


def test_json_is_written_as_the_rust_sdk_writes_it():
    assert canonical_json({"type": "t", "coupon_id": "c", "nested": {"z": 1, "a": [2, {"y": 1, "x": 2}]}}) == \
        '{"coupon_id":"c","nested":{"a":[2,{"x":2,"y":1}],"z":1},"type":"t"}'
    # the ids match the runner's (runner/src/plugins/host.rs derive_id)
    assert derive_id("a", 1, 0) == "84dd294af2ae10c149d7"


def test_http_config_and_secret_answer_what_the_test_queued():
    from eggtimer_sdk import config, http, secret
    from eggtimer_sdk.testing import idempotency_key

    def call(task):
        r = http.post("https://api.example.com/x", json_body={"b": 1, "a": "é"}, headers={"X-Region": config("region")})
        with pytest.raises(Err):
            http.get("https://api.example.com/y")
        assert secret("token") == "s3cret"
        assert secret("nope") is None
        return Outcome.done() if r.ok and r.json()["ok"] else Outcome.fail(r.text())

    host = TestHost()
    host.config["region"] = "eu"
    host.secrets["token"] = "s3cret"
    host.http_responses += [(202, '{"ok": true}'), Err("refused")]
    assert host.run(plugin(call), {}) == types.Outcome_Done()
    assert len(host.http_requests) == 2
    assert host.http_requests[0].body == '{"a":"é","b":1}'.encode()
    key = lambda i: dict(host.http_requests[i].headers)["Idempotency-Key"]
    assert key(0) == idempotency_key("test-task", 0, 0)
    assert key(0) != key(1)
    # the runner's vector (plugins::http tests)
    assert idempotency_key("order-1", 1700000000000, 0) == "639a89dd1912f80fb0a54ffc7bf232cb"


@dataclass
class Inner:
    n: int


@dataclass
class Order:
    order_id: str
    inner: Inner
    note: Optional[str] = None
    tags: List[str] = field(default_factory=list)


def test_check_names_what_does_not_fit_and_takes_what_does():
    check = plugin(lambda t: None, Order)().check
    check('{"order_id": "o1", "inner": {"n": 1}}')
    check('{"order_id": "o1", "inner": {"n": 1}, "note": null, "tags": ["a"], "extra": 1}')
    for payload, message in [
        ('{"inner": {"n": 1}}', "missing field order_id"),
        ('{"order_id": 7, "inner": {"n": 1}}', "field order_id: expected str, got a number"),
        ('{"order_id": "o", "inner": {"n": "x"}}', "field inner.n: expected int, got a string"),
        ('{"order_id": "o", "inner": {"n": 1}, "tags": [1]}', "field tags[0]: expected str, got a number"),
        ('[]', "the payload: expected an object, got an array"),
    ]:
        with pytest.raises(Err) as e:
            check(payload)
        assert e.value.value == message, payload
    with pytest.raises(Err) as e:
        check("not json")
    assert "Expecting value" in e.value.value


def test_integers_are_read_as_the_runner_reads_them():
    check = plugin(lambda t: None, Order)().check
    check('{"order_id": "o1", "inner": {"n": 12.0}}')
    check('{"order_id": "o1", "inner": {"n": -9223372036854775808}}')
    for n, got in [("12.5", "a number with a fraction"), ("9223372036854775808", "a number"),
                   ("true", "a boolean")]:
        with pytest.raises(Err) as e:
            check('{"order_id": "o1", "inner": {"n": %s}}' % n)
        assert e.value.value == f"field inner.n: expected int, got {got}", n
    seen = []
    TestHost().run(plugin(lambda t: seen.append(t.payload.inner.n), Order),
                   '{"order_id": "o1", "inner": {"n": 12.0}}')
    assert seen == [12] and type(seen[0]) is int


@dataclass
class Refund:
    amount_cents: int

    def __post_init__(self):
        if self.amount_cents <= 0:
            raise ValueError(f"amount_cents must be more than 0, got {self.amount_cents}")


def test_a_dataclass_checks_values_and_check_names_what_it_refused():
    check = plugin(lambda t: None, Refund)().check
    check('{"amount_cents": 100}')
    with pytest.raises(Err) as e:
        check('{"amount_cents": 0}')
    assert e.value.value == "amount_cents must be more than 0, got 0"


def test_the_payload_dataclass_is_described_as_json_schema():
    import json
    schema = json.loads(plugin(lambda t: None, Order)().payload_schema())
    assert schema["type"] == "object"
    assert schema["required"] == ["order_id", "inner"]
    assert schema["properties"]["order_id"] == {"type": "string"}
    assert schema["properties"]["inner"]["properties"]["n"] == {"type": "integer"}
    assert schema["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
    assert plugin(lambda t: None)().payload_schema() is None


def test_a_handler_gets_the_event_that_made_it_run_and_a_debounced_batch():
    host = TestHost()
    seen = []
    world = plugin(lambda t: seen.append(t), Greeting)
    ev = {"id": "3-1", "topic": "payments", "key": "o1", "at": 5, "data": {"amount": 7}}
    host.run(world, {"user": "u2"}, event=ev, batch=[{"user": "u1"}, {"user": "u2"}])
    assert (seen[0].event.topic, seen[0].event.key, seen[0].event.data) == ("payments", "o1", {"amount": 7})
    assert [g.user for g in seen[0].batch] == ["u1", "u2"]
    host.run(world, {"user": "u1"})
    assert (seen[1].event, seen[1].batch) == (None, [])
