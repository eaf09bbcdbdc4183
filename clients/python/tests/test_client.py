"""eggtimer_client against a real runner: EGGTIMER_URL (and EGGTIMER_TOKEN) name it; the plugin
EGGTIMER_PLUGIN (default `noop`) must be loaded there. tests/tests/clients.rs starts both."""

import os
import sys
import time
import unittest
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from eggtimer_client import Client, EggtimerError  # noqa: E402

URL = os.environ.get("EGGTIMER_URL")
PLUGIN = os.environ.get("EGGTIMER_PLUGIN", "noop")
HOUR = 3_600_000


def now_ms() -> int:
    return int(time.time() * 1000)


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not URL:
            raise RuntimeError("set EGGTIMER_URL to a running eggtimer (cargo xtask run serves http://127.0.0.1:8080)")
        cls.et = Client(URL, token=os.environ.get("EGGTIMER_TOKEN"))

    def fresh(self, what: str) -> str:
        return f"py-{what}-{uuid.uuid4().hex[:8]}"

    def test_schedule_move_cancel(self):
        id = self.fresh("order")
        at = now_ms() + HOUR
        got = self.et.schedule(PLUGIN, {"order_id": "o-17", "n": 1}, id=id, run_at=at, owner="u-py", priority=4)
        self.assertEqual(got, {"id": id, "run_at": at})
        task = self.et.get(id)
        self.assertEqual(task["state"], "scheduled")
        self.assertEqual(task["payload"], {"order_id": "o-17", "n": 1})
        self.assertEqual(task["owner"], "u-py")
        self.assertEqual(task["priority"], 4)

        self.assertEqual(self.et.move(id, shift_ms=-HOUR // 2)["run_at"], at - HOUR // 2)
        self.assertEqual(self.et.get(id)["run_at"], at - HOUR // 2)
        self.assertEqual(self.et.move(id, run_at=at + 5)["run_at"], at + 5)
        with self.assertRaises(ValueError):
            self.et.move(id)

        self.assertTrue(self.et.cancel(id))
        self.assertIsNone(self.et.get(id))
        self.assertFalse(self.et.cancel(id))

    def test_one_id_in_two_plugins_in_plugin_names_one(self):
        other = os.environ.get("EGGTIMER_PLUGIN_2", "bench-record")
        id = self.fresh("twin")
        at = now_ms() + HOUR
        for plugin in (PLUGIN, other):
            self.et.schedule(plugin, {}, id=id, run_at=at)
        with self.assertRaises(EggtimerError) as e:
            self.et.get(id)
        self.assertEqual(e.exception.code, "ambiguous_id")
        mine = self.et.in_plugin(other)
        self.assertEqual(mine.get(id)["plugin"], other)
        self.assertEqual(mine.move(id, shift_ms=5)["run_at"], at + 5)
        self.assertTrue(mine.cancel(id))
        self.assertEqual(self.et.get(id)["plugin"], PLUGIN)
        self.assertTrue(self.et.cancel(id))

    def test_a_task_due_now_runs(self):
        got = self.et.schedule(PLUGIN, {"n": 2})
        self.assertTrue(got["id"])
        deadline = time.monotonic() + 30
        state = None
        while time.monotonic() < deadline:
            state = (self.et.get(got["id"]) or {}).get("state")
            if state == "done":
                break
            time.sleep(0.05)
        self.assertEqual(state, "done")

    def test_run_now(self):
        id = self.fresh("later")
        self.et.schedule(PLUGIN, {}, id=id, delay_ms=HOUR)
        self.et.run_now(id)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.et.get(id)["state"] != "done":
            time.sleep(0.05)
        self.assertEqual(self.et.get(id)["state"], "done")

    def test_an_error_reply_raises_with_status_code_and_message(self):
        with self.assertRaises(EggtimerError) as e:
            self.et.schedule("no-such-plugin-py", {})
        self.assertEqual(e.exception.status, 422)
        self.assertIn("no-such-plugin-py", e.exception.message)
        with self.assertRaises(EggtimerError) as e:
            self.et.schedule(PLUGIN, {}, run_at=2**63 - 1)
        self.assertEqual(e.exception.status, 400)
        self.assertEqual(e.exception.code, "bad_request")

    def test_unreachable_says_so(self):
        with self.assertRaises(EggtimerError) as e:
            Client("http://127.0.0.1:9", timeout=2).get("x")
        self.assertEqual(e.exception.status, 0)
        self.assertIn("is eggtimer running there?", e.exception.message)

    def test_an_owners_tasks(self):
        owner = self.fresh("owner")
        at = now_ms() + HOUR
        made = self.et.schedule_many(
            [{"plugin": PLUGIN, "id": f"{owner}-{i}", "owner": owner, "run_at": at + i} for i in range(3)]
        )
        self.assertEqual([m["id"] for m in made], [f"{owner}-{i}" for i in range(3)])
        self.assertEqual([t["id"] for t in self.et.owner_tasks(owner)], [f"{owner}-{i}" for i in range(3)])
        self.assertEqual(self.et.shift_owner(owner, -1000, plugin=PLUGIN), 3)
        self.assertEqual([t["run_at"] for t in self.et.owner_tasks(owner)], [at - 1000 + i for i in range(3)])
        self.assertEqual(self.et.pause_owner(owner, plugin=PLUGIN), {"all": False, "plugins": [PLUGIN]})
        stats = self.et.owner_stats(owner)
        self.assertEqual(stats["plugins"], [{"plugin": PLUGIN, "scheduled": 3, "running": 0, "dead": 0, "pending": 3}])
        self.assertEqual(stats["paused"], {"all": False, "plugins": [PLUGIN]})
        self.assertEqual(self.et.resume_owner(owner), 0)  # none was due: none was parked
        self.assertEqual(self.et.owner_stats(owner)["paused"], {"all": False, "plugins": []})
        self.assertEqual(self.et.cancel_owner(owner), 3)
        self.assertEqual(list(self.et.owner_tasks(owner)), [])

    def test_an_event_cancels_the_task_listening_for_it(self):
        id = self.fresh("paid")
        self.et.schedule(PLUGIN, {}, id=id, run_at=int(time.time() * 1000) + HOUR,
                         on=[{"topic": "payments", "key": id, "then": "cancel"}])
        self.assertEqual(self.et.publish("payments", id, {"amount": 5}), 1)
        self.assertIsNone(self.et.get(id))
        self.assertEqual(self.et.publish("payments", id), 0)

    def test_a_debounced_task_gathers_the_payloads_of_its_key(self):
        key = self.fresh("feed")
        window = {"key": key, "quiet_ms": HOUR, "max_wait_ms": 2 * HOUR}
        self.assertEqual(self.et.schedule(PLUGIN, {"n": 1}, debounce=window), {"id": key, "debounced": "new"})
        got = self.et.schedule_many([{"plugin": PLUGIN, "payload": {"n": 2}, "debounce": window}])
        self.assertEqual(got, [{"id": key, "debounced": "merged"}])
        self.assertEqual(self.et.get(key)["batch"], [{"n": 1}, {"n": 2}])
        self.assertTrue(self.et.cancel(key))

    def test_a_recurring_schedule(self):
        id = self.fresh("sweep")
        got = self.et.put_schedule(id, PLUGIN, {"sweep": True}, cron="30 9 * * *", tz="Europe/Berlin")
        self.assertEqual(got["id"], id)
        self.assertGreater(got["next_run_at"], now_ms())
        self.assertEqual(self.et.get_schedule(id)["cron"], "30 9 * * *")
        self.et.delete_schedule(id)
        self.assertIsNone(self.et.get_schedule(id))


if __name__ == "__main__":
    unittest.main()
