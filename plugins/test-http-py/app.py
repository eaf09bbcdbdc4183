"""Test plugin: POSTs ``payload["body"]`` as JSON to ``config("url")`` with the header
``X-Token: secret("token")``, and emits on ``http`` what came back: status, the ``X-Echo``
header, the body."""

from eggtimer_sdk import config, emit, http, plugin, secret


def handle(task):
    r = http.post(config("url") or "http://missing", json_body=task.payload["body"],
                  headers={"X-Token": secret("token") or "none"})
    emit("http", {"status": r.status, "echo": r.header("x-echo"), "body": r.text()})


WitWorld = plugin(handle)
