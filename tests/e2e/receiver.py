"""A real webhook receiver for tests: a threaded ``http.server`` on a loopback port that records
every request (headers and body) and answers with the statuses it is told, then 200."""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass(frozen=True)
class Attempt:
    at_ms: float
    path: str
    headers: dict[str, str]
    body: bytes
    status: int


class Receiver:
    def __init__(self, port: int = 0, statuses: list[int] | None = None) -> None:
        self.attempts: list[Attempt] = []
        self.statuses = list(statuses or [])
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["content-length"]))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.attempts.append(
                    Attempt(time.time() * 1000, self.path, headers, body, status)
                )
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def accepted(self) -> list[Attempt]:
        return [a for a in self.attempts if a.status < 300]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_until(predicate: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = time.time() + timeout_s
    while not predicate():
        assert time.time() < deadline, "condition not met in time"
        time.sleep(0.02)


def new_secret() -> str:
    """A fresh Standard Webhooks secret (32 random bytes)."""
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def other() -> Iterator[Receiver]:
    """A second receiver."""
    r = Receiver()
    yield r
    r.close()
