"""Every error code of api.md, provoked against a real server over HTTP and from the CLI
(exit status and ``code: message`` on stderr)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import httpx
import pytest

TOKENS = """
[[auth.tokens]]
token = "alice-secret"
name = "alice"
send = ["a.*"]
receive = ["a.*"]
admin = ["a.*"]
"""

# code -> (HTTP status, requests to make first, the provoking request)
Request = tuple[str, str, Any]
SETUP: list[Request] = [
    ("PUT", "/v1/queues/q", {}),
    ("PUT", "/v1/queues/off", {"put_enabled": False}),
    ("PUT", "/v1/queues/tiny", {"max_message_bytes": 4}),
    ("PUT", "/v1/queues/one", {"max_length": 1, "overflow": "reject_publish"}),
    ("POST", "/v1/messages", {"destination": "one", "body": "fills it"}),
    # A route a message waits for (nothing listens on port 9: it is never tried within the hour).
    ("PUT", "/v1/routes/busy", {"transport": "http", "url": "http://127.0.0.1:9/hook"}),
    ("POST", "/v1/messages", {"destination": "busy", "body": "x", "delay_ms": 3_600_000}),
]
CASES: dict[str, tuple[int, Request]] = {
    "invalid_argument": (
        400,
        ("POST", "/v1/messages", {"destination": "q", "delay_ms": 1, "deliver_at": 5}),
    ),
    "expiry_error": (
        400,
        ("POST", "/v1/messages", {"destination": "q", "delay_ms": 5000, "ttl_ms": 10}),
    ),
    "options_error": (
        400,
        ("POST", "/v1/messages", {"destination": "q", "delay_ms": 5000, "group_id": "g"}),
    ),
    "not_found": (404, ("GET", "/v1/messages/01M823NX2A455N3NW7GDWRCSYG", None)),
    "unknown_destination": (404, ("POST", "/v1/messages", {"destination": "nowhere", "body": "x"})),
    "put_disabled": (409, ("POST", "/v1/messages", {"destination": "off", "body": "x"})),
    "precondition_failed": (409, ("PUT", "/v1/queues/q", {"message_ttl_ms": 5})),
    "message_too_large": (
        413,
        ("POST", "/v1/messages", {"destination": "tiny", "body": "too big"}),
    ),
    "destination_full": (429, ("POST", "/v1/messages", {"destination": "one", "body": "x"})),
    "in_use": (409, ("DELETE", "/v1/routes/busy", None)),
}


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory):
    from tests.conftest import ServerProcess

    server = ServerProcess(tmp_path_factory.mktemp("errors"), config=None, env=None, args=[])
    with httpx.Client(base_url=server.url) as client:
        for method, path, body in SETUP:
            client.request(method, path, json=body).raise_for_status()
    yield server
    server.stop()


def tarry(url: str, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TARRY_")}
    if token:
        env["TARRY_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "tarry.cli.main", "--url", url, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


@pytest.mark.parametrize("code", sorted(CASES))
def test_each_error_code_comes_back_over_http_with_its_status(open_server, code: str) -> None:
    status, (method, path, body) = CASES[code]
    with httpx.Client(base_url=open_server.url) as client:
        response = client.request(method, path, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code
    assert len(error["message"]) > 10  # a sentence that says what to fix


def test_not_cancellable_comes_back_once_a_message_left_scheduled(open_server) -> None:
    with httpx.Client(base_url=open_server.url) as client:
        sent = client.post("/v1/messages", json={"destination": "q", "body": "x"}).json()
        response = client.delete(f"/v1/messages/{sent['id']}")
    assert (response.status_code, response.json()["error"]["code"]) == (409, "not_cancellable")


CLI_CASES: dict[str, list[str]] = {
    "invalid_argument": ["send", "bad name!", "x"],
    "expiry_error": ["send", "q", "x", "--delay", "5s", "--ttl", "10ms"],
    "options_error": ["send", "q", "x", "--delay", "5s", "--group-id", "g"],
    "not_found": ["show", "01M823NX2A455N3NW7GDWRCSYG"],
    "unknown_destination": ["send", "nowhere", "x"],
    "put_disabled": ["send", "off", "x"],
    "precondition_failed": ["queue", "declare", "q", "--ttl", "5ms"],
    "message_too_large": ["send", "tiny", "too big"],
    "destination_full": ["send", "one", "x"],
    "in_use": ["route", "delete", "busy"],
}


@pytest.mark.parametrize("code", sorted(CLI_CASES))
def test_each_error_code_comes_back_from_the_cli_with_a_non_zero_exit(
    open_server, code: str
) -> None:
    result = tarry(open_server.url, *CLI_CASES[code])
    assert result.returncode == 1
    assert result.stderr.startswith(f"{code}: ")


def test_the_cli_refuses_a_malformed_duration_with_exit_status_2(open_server) -> None:
    result = tarry(open_server.url, "send", "q", "x", "--delay", "soon")
    assert result.returncode == 2
    assert result.stderr.startswith("invalid_argument: ")


def test_not_cancellable_from_the_cli(open_server) -> None:
    sent = tarry(open_server.url, "send", "q", "x")
    result = tarry(open_server.url, "cancel", sent.stdout.strip())
    assert result.returncode == 1 and result.stderr.startswith("not_cancellable: ")


def test_unavailable_when_nothing_listens_from_the_client_and_the_cli() -> None:
    result = tarry("http://127.0.0.1:1", "stats")
    assert result.returncode == 3 and result.stderr.startswith("unavailable: ")


def test_unavailable_when_the_store_cannot_take_writes(make_server, tmp_path) -> None:
    # Given a store whose file may not grow past a few pages
    server = make_server('[store]\nengine = "sqlite"\nmax_pages = 40\n')
    big = "x" * 400_000
    with httpx.Client(base_url=server.url) as client:
        client.put("/v1/queues/q", json={}).raise_for_status()
        response = client.post("/v1/messages", json={"destination": "q", "body": big})
        assert (response.status_code, response.json()["error"]["code"]) == (503, "unavailable")
        # nothing half-stored, and small messages still go through
        assert client.get("/v1/queues/q").json()["ready"] == 0
    body_file = tmp_path / "big.txt"
    body_file.write_text(big)
    result = tarry(server.url, "send", "q", "--body-file", str(body_file))
    assert result.returncode == 3 and result.stderr.startswith("unavailable: ")


def test_tokens_are_required_and_checked_per_destination(make_server) -> None:
    server = make_server(TOKENS)
    with httpx.Client(base_url=server.url) as anonymous:
        response = anonymous.put("/v1/queues/a.orders", json={})
        assert (response.status_code, response.json()["error"]["code"]) == (401, "unauthenticated")
    headers = {"authorization": "Bearer alice-secret"}
    with httpx.Client(base_url=server.url, headers=headers) as alice:
        assert alice.put("/v1/queues/a.orders", json={}).status_code == 201
        response = alice.put("/v1/queues/b.orders", json={})
        assert (response.status_code, response.json()["error"]["code"]) == (403, "not_authorized")
        response = alice.post("/v1/messages", json={"destination": "b.orders", "body": "x"})
        assert (response.status_code, response.json()["error"]["code"]) == (403, "not_authorized")
        assert (
            alice.post("/v1/messages", json={"destination": "a.orders", "body": "x"}).status_code
            == 201
        )
    result = tarry(server.url, "send", "a.orders", "x")
    assert result.returncode == 1 and result.stderr.startswith("unauthenticated: ")
    result = tarry(server.url, "send", "b.orders", "x", token="alice-secret")
    assert result.returncode == 1 and result.stderr.startswith("not_authorized: ")
    result = tarry(server.url, "send", "a.orders", "x", token="alice-secret")
    assert result.returncode == 0 and len(result.stdout.strip()) == 26


def test_binding_beyond_loopback_without_tokens_refuses_to_start(tmp_path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tarry.cli.main",
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--data",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "invalid_argument" in result.stderr and "auth.tokens" in result.stderr
