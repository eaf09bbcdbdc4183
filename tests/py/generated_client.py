"""Reads a runner's answers through a client generated from its own OpenAPI document
(openapi-python-client) and fails when the client keeps a field the document does not describe
(it lands in a model's `additional_properties`) or could not parse an answer.

Usage: generated_client.py BASE_URL TOKEN TASK_ID PLUGIN
"""
import sys

import attrs

from eggtimer_admin_api_client import AuthenticatedClient
from eggtimer_admin_api_client.types import Unset
from eggtimer_admin_api_client.api.plugins import plugin_list, plugin_get, secret_list
from eggtimer_admin_api_client.api.keys import key_list, audit
from eggtimer_admin_api_client.api.operations import runners, stats
from eggtimer_admin_api_client.api.tasks import get_task, find_tasks
from eggtimer_admin_api_client.api.owners import owner_tasks
from eggtimer_admin_api_client.api.schedules import schedule_list
from eggtimer_admin_api_client.api.dead_letters import dead_list
from eggtimer_admin_api_client.api.events import source_list

base, token, task_id, plugin = sys.argv[1:5]
client = AuthenticatedClient(base_url=base, token=token, raise_on_unexpected_status=True)


def undescribed(value, path):
    """Paths of the fields a parsed answer kept outside its documented ones."""
    found = []
    if isinstance(value, list):
        for i, v in enumerate(value):
            found += undescribed(v, f"{path}[{i}]")
    elif attrs.has(type(value)):
        extra = getattr(value, "additional_properties", None)
        # a free-form map (a plugin's config, a task's payload) is documented as one
        free_form = [f.name for f in attrs.fields(type(value))] == ["additional_properties"]
        if extra and not free_form:
            found += [f"{path}.{k}" for k in extra]
        for f in attrs.fields(type(value)):
            if f.name != "additional_properties":
                found += undescribed(getattr(value, f.name), f"{path}.{f.name}")
    return found


calls = {
    "GET /v1/plugins": lambda: plugin_list.sync_detailed(client=client),
    f"GET /v1/plugins/{plugin}": lambda: plugin_get.sync_detailed(plugin, client=client),
    f"GET /v1/plugins/{plugin}/secrets": lambda: secret_list.sync_detailed(plugin, client=client),
    "GET /v1/keys": lambda: key_list.sync_detailed(client=client),
    "GET /v1/audit": lambda: audit.sync_detailed(client=client),
    "GET /v1/runners": lambda: runners.sync_detailed(client=client),
    "GET /v1/stats": lambda: stats.sync_detailed(client=client),
    f"GET /v1/tasks/{task_id}": lambda: get_task.sync_detailed(task_id, client=client),
    "GET /v1/tasks": lambda: find_tasks.sync_detailed(client=client),
    "GET /v1/owners/u1/tasks": lambda: owner_tasks.sync_detailed("u1", client=client),
    "GET /v1/schedules": lambda: schedule_list.sync_detailed(client=client),
    "GET /v1/dead": lambda: dead_list.sync_detailed(client=client),
    "GET /v1/sources": lambda: source_list.sync_detailed(client=client),
}
problems = []
for what, call in calls.items():
    r = call()
    if r.status_code != 200 or r.parsed is None or type(r.parsed).__name__ == "ErrorBody":
        problems.append(f"{what}: {r.status_code} {r.content[:300]!r}")
        continue
    problems += [f"{what}: {p} is not in the document" for p in undescribed(r.parsed, "")]
if problems:
    print("\n".join(problems))
    sys.exit(1)
print(f"{len(calls)} answers read, every field described")
