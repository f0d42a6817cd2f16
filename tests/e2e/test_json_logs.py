"""`tarry serve --log-format json` (or `[server] log_format`, or the environment) writes one
JSON object a line on stderr; plain text stays the default. Read off a real server's stderr."""

from __future__ import annotations

import json
import socket
import time

import httpx


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


ROUTE = """
[routes.hook]
transport = "http"
url = "http://127.0.0.1:{port}/nobody-listens"
timeout_ms = 500
"""


def _wait_for_line(server, predicate, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(predicate(line) for line in list(server.stderr_lines)):
            return
        time.sleep(0.05)


def _records(server) -> list[dict]:
    return [json.loads(line) for line in list(server.stderr_lines) if line.strip()]


def test_json_logs_are_one_object_a_line_with_the_message_id_and_destination(
    make_server,
) -> None:
    # Given a server started with --log-format json and a route nobody listens on
    server = make_server(ROUTE.format(port=_closed_port()), args=["--log-format", "json"])
    # When a message to that route cannot be delivered
    sent = httpx.post(
        f"{server.url}/v1/messages", json={"destination": "hook", "body": "ping"}
    ).json()
    _wait_for_line(server, lambda line: sent["id"] in line)
    server.stop()
    # Then every line of stderr is a JSON object with time, level, logger and message
    records = _records(server)
    assert len(records) >= 4
    for record in records:
        assert {"time", "level", "logger", "message"} <= set(record), record
        assert record["time"].endswith("Z") and record["level"] in (
            "debug",
            "info",
            "warning",
            "error",
            "critical",
        )
    # And the failure names the message and its destination as fields of their own
    [failure] = [r for r in records if r.get("id") == sent["id"]]
    assert failure["destination"] == "hook" and failure["level"] == "warning"
    assert failure["logger"] == "tarry.dispatch.dispatcher"
    # And uvicorn's own lines are JSON too
    assert any(r["logger"].startswith("uvicorn") for r in records)


def test_the_config_file_and_the_environment_choose_json_too_and_text_stays_the_default(
    make_server,
) -> None:
    by_file = make_server('[server]\nlog_format = "json"\n')
    by_env = make_server(env={"TARRY_SERVER__LOG_FORMAT": "json"})
    plain = make_server()
    for server in (by_file, by_env, plain):
        server.stop()
    assert {r["logger"] for r in _records(by_file)} >= {"tarry", "tarry.engine.core"}
    assert any(r["message"].startswith("engine started") for r in _records(by_env))
    text = [line for line in plain.stderr_lines if line.strip()]
    assert text and not any(line.lstrip().startswith("{") for line in text)
    assert any(" INFO tarry.engine.core: engine started" in line for line in text)
