"""A route to an HTTP endpoint: a real receiving server on loopback, a real tarry serve."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tarry import Client


class Hook:
    """A webhook receiver that answers with the statuses it is told, then 200."""

    def __init__(self) -> None:
        self.received: list[tuple[float, dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["content-length"]))
                status = hook.statuses.pop(0) if hook.statuses else 200
                if status == 200:
                    hook.received.append((time.time() * 1000, dict(self.headers), body))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    yield h
    h.server.shutdown()
    h.server.server_close()


def config_for(hook: Hook, retries: int = 0) -> str:
    return (
        f"[dispatch]\nnumber_of_retries = {retries}\nretry_backoff_ms = 100\n"
        f'[routes.hook]\ntransport = "http"\nurl = "{hook.url}"\n'
    )


def wait_until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.time() + timeout_s
    while not predicate():
        assert time.time() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_due_message_is_posted_to_the_route_with_its_ids_and_headers(make_server, hook) -> None:
    server = make_server(config_for(hook))
    with Client(server.url) as client:
        sent = client.send(
            "hook",
            b"payload",
            delay="300ms",
            headers={"x-kind": "reminder"},
            message_id="m-1",
            correlation_id="c-1",
        )
        wait_until(lambda: hook.received)
        received_at, headers, body = hook.received[0]
        assert body == b"payload" and received_at >= sent.deliver_at
        assert headers["tarry-id"] == sent.id and headers["x-kind"] == "reminder"
        assert headers["tarry-message-id"] == "m-1" and headers["tarry-correlation-id"] == "c-1"
        wait_until(lambda: client.get(sent.id).state == "delivered")


def test_a_transient_failure_is_retried_and_then_delivered(make_server, hook) -> None:
    hook.statuses = [503, 500]
    server = make_server(config_for(hook, retries=3))
    with Client(server.url) as client:
        sent = client.send("hook", "x")
        wait_until(lambda: hook.received)
        info = client.get(sent.id)
        assert info.raw["failures"] == 2


def test_a_permanent_failure_goes_to_the_error_queue(make_server, hook) -> None:
    hook.statuses = [404]
    server = make_server(config_for(hook, retries=3))
    with Client(server.url) as client:
        sent = client.send("hook", "x")
        [dead] = client.receive("tarry.error", wait="5s")
        assert dead.headers["tarry-original-id"] == sent.id
        assert "http_404" in dead.headers["tarry-failure"]
        assert hook.received == []


def test_while_the_endpoint_is_down_nothing_is_lost(make_server) -> None:
    # Given a route to a port where nothing listens yet, with retries
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    url = f"http://127.0.0.1:{port}/hook"
    server = make_server(
        f"[dispatch]\nnumber_of_retries = 50\nretry_backoff_ms = 100\nretry_backoff_max_ms = 200\n"
        f'[routes.hook]\ntransport = "http"\nurl = "{url}"\n'
    )
    with Client(server.url) as client:
        sent = client.send("hook", "x")
        time.sleep(0.5)
        assert client.get(sent.id).state == "scheduled"
        # When the endpoint comes up
        received: list[bytes] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                received.append(self.rfile.read(int(self.headers["content-length"])))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        up = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=up.serve_forever, daemon=True).start()
        try:
            wait_until(lambda: received == [b"x"])
            wait_until(lambda: client.get(sent.id).state == "delivered")
        finally:
            up.shutdown()
            up.server_close()
    assert httpx.get(f"{server.url}/healthz").json()["status"] == "ok"
