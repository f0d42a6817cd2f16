"""Per-route delivery policy, end to end: a real `tarry serve` with routes declared in TOML, and a
real webhook receiver on a loopback port that records what arrives when (and how many requests
it has open at once)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tarry import Client


class Receiver:
    """Answers POSTs to any path; per path: the arrival times (epoch ms) of requests it
    accepted, scripted failures (status, headers) taken before it answers 200, a fixed
    handling time, and the most requests in flight at once."""

    def __init__(self) -> None:
        self.arrivals: dict[str, list[float]] = {}
        self.attempts: dict[str, list[float]] = {}
        self.script: dict[str, list[tuple[int, dict[str, str]]]] = {}
        self.always: dict[str, int] = {}
        self.handling_s: dict[str, float] = {}
        self.in_flight: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                now = time.time() * 1000
                path = self.path
                self.rfile.read(int(self.headers["content-length"]))
                with receiver.lock:
                    receiver.attempts.setdefault(path, []).append(now)
                    receiver.in_flight[path] = receiver.in_flight.get(path, 0) + 1
                    receiver.peak[path] = max(receiver.peak.get(path, 0), receiver.in_flight[path])
                    scripted = receiver.script.get(path)
                    status, headers = scripted.pop(0) if scripted else (200, {})
                    status = receiver.always.get(path, status)
                time.sleep(receiver.handling_s.get(path, 0.0))
                with receiver.lock:
                    receiver.in_flight[path] -= 1
                    if status == 200:
                        receiver.arrivals.setdefault(path, []).append(now)
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def got(self, path: str) -> list[float]:
        with self.lock:
            return list(self.arrivals.get(path, []))


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.time() + timeout_s
    while not predicate():
        assert time.time() < deadline, "condition not met in time"
        time.sleep(0.02)


def most_in_one_window(times_ms: list[float], window_ms: float) -> int:
    """The most arrivals in any window [t, t + window_ms) (enough to start one at each)."""
    ordered = sorted(times_ms)
    most = 0
    for i, start in enumerate(ordered):
        most = max(most, sum(1 for t in ordered[i:] if t < start + window_ms))
    return most


def route(name: str, url: str, **policy: object) -> str:
    lines = [f"[routes.{name}]", 'transport = "http"', f'url = "{url}"']
    lines += [f"{key} = {json.dumps(value)}" for key, value in policy.items()]
    return "\n".join(lines) + "\n"


def test_a_rate_limited_route_never_exceeds_its_rate_while_another_route_is_on_time(
    make_server, receiver
) -> None:
    # Given a route limited to 5 deliveries a second and one without a limit, same receiver
    server = make_server(
        route("slow", f"{receiver.base}/slow", rate_per_s=5)
        + route("fast", f"{receiver.base}/fast")
    )
    with Client(server.url) as client:
        # When 15 messages for the slow route fall due at once, and 10 for the fast route
        # fall due while the slow route's backlog is still being worked off
        now = int(time.time() * 1000)
        client.send_batch(
            [{"destination": "slow", "body": str(i), "deliver_at": now + 200} for i in range(15)]
        )
        fast_due = [now + 700 + 100 * i for i in range(10)]
        client.send_batch(
            [
                {"destination": "fast", "body": str(i), "deliver_at": at}
                for i, at in enumerate(fast_due)
            ]
        )
        wait_until(lambda: len(receiver.got("/slow")) == 15, timeout_s=15)
        wait_until(lambda: len(receiver.got("/fast")) == 10)
    slow, fast = receiver.got("/slow"), receiver.got("/fast")
    # Then no second at the receiver saw more than 5 slow deliveries, ...
    assert most_in_one_window(slow, 1_000) <= 5
    # ... the slow route still went at its rate (15 at 5/s: 14 gaps of 200 ms), ...
    assert 2_750 <= max(slow) - min(slow) <= 5_000
    # ... and the fast route's messages each arrived on time, long before the slow backlog
    # was through: nothing of it waited behind the slow route
    lateness = [arrived - due for arrived, due in zip(sorted(fast), fast_due, strict=True)]
    assert max(lateness) < 500, lateness
    assert max(fast) < max(slow) - 1_000


def test_a_concurrency_capped_route_never_has_more_requests_open_than_its_cap(
    make_server, receiver
) -> None:
    # Given a route capped at 2 deliveries under way, to a receiver that takes 150 ms each
    receiver.handling_s["/capped"] = 0.15
    server = make_server(route("capped", f"{receiver.base}/capped", concurrency=2))
    with Client(server.url) as client:
        # When 8 messages fall due at once
        client.send_batch([{"destination": "capped", "body": str(i)} for i in range(8)])
        wait_until(lambda: len(receiver.got("/capped")) == 8)
    # Then the receiver never had more than 2 open, and did have 2 (the cap is used)
    assert receiver.peak["/capped"] == 2


def test_a_429_with_retry_after_holds_the_whole_route_until_then(make_server, receiver) -> None:
    # Given a route (one delivery at a time, retries with a short back-off) whose receiver
    # answers the first request 429 with Retry-After: 2
    receiver.script["/busy"] = [(429, {"retry-after": "2"})]
    server = make_server(
        route("busy", f"{receiver.base}/busy", concurrency=1, retries=3, retry_backoff_ms=50)
    )
    with Client(server.url) as client:
        # When three messages fall due
        sent = [client.send("busy", str(i)) for i in range(3)]
        wait_until(lambda: len(receiver.got("/busy")) == 3)
        # Then the refused one was tried again (the 429 counted as a failed attempt) ...
        states = [client.get(s.id) for s in sent]
        assert sorted(m.raw["failures"] for m in states) == [0, 0, 1]
    refused_at = receiver.attempts["/busy"][0]
    # ... and nothing reached the route before the 2 s it asked for had passed, not even the
    # other messages (its own retry back-off was 50 ms)
    assert len(receiver.attempts["/busy"]) == 4
    assert min(receiver.got("/busy")) >= refused_at + 2_000 - 5


def test_a_route_retries_as_its_policy_says_then_dead_letters_and_reports_the_failure(
    make_server, receiver
) -> None:
    # Given a route with 2 retries of its own (the global default is none) that reports its
    # failures to a queue, and a receiver that always fails
    receiver.always["/down"] = 500
    server = make_server(
        "[dispatch]\nnumber_of_retries = 0\n[queues.failures]\n"
        + route(
            "down",
            f"{receiver.base}/down",
            retries=2,
            retry_backoff_ms=100,
            on_failure_report_to="failures",
        )
    )
    with Client(server.url) as client:
        # When a message for it falls due
        sent = client.send("down", "x", message_id="order-7", correlation_id="c-7")
        # Then it is dead-lettered after 3 attempts, backed off per the route ...
        [dead] = client.receive("tarry.error", wait="10s")
        assert dead.headers["tarry-original-id"] == sent.id
        attempts = receiver.attempts["/down"]
        assert len(attempts) == 3
        assert attempts[1] - attempts[0] >= 100 * 0.8 - 5  # 100 ms ± 20% jitter
        assert attempts[2] - attempts[1] >= 200 * 0.8 - 5
        # ... and the failure queue got a report saying what happened
        [report] = client.receive("failures", wait="5s")
        body = json.loads(report.body)
        assert body["report"] == "delivery_failed"
        assert body["id"] == sent.id and body["destination"] == "down"
        assert body["attempts"] == 3 and body["reason"] == "http_500"
        assert body["message_id"] == "order-7" and body["correlation_id"] == "c-7"
        assert report.headers["tarry-original-id"] == sent.id
        assert client.get(sent.id).state == "dead_lettered"


def test_a_failure_report_can_go_to_another_route(make_server, receiver) -> None:
    # Given a failing route whose failures are reported to another (working) route
    receiver.always["/flaky"] = 404
    server = make_server(
        route("flaky", f"{receiver.base}/flaky", on_failure_report_to="ops")
        + route("ops", f"{receiver.base}/ops")
    )
    with Client(server.url) as client:
        # When a message for it fails permanently
        sent = client.send("flaky", "x")
        # Then the report is POSTed to the other route
        wait_until(lambda: len(receiver.got("/ops")) == 1)
        [dead] = client.receive("tarry.error", wait="5s")
        assert dead.headers["tarry-original-id"] == sent.id


def test_a_route_with_a_bad_policy_is_refused_at_start_naming_the_key(make_server) -> None:
    with pytest.raises(RuntimeError) as refused:
        make_server(route("bad", "http://127.0.0.1:9/x", concurrency=0))
    assert "concurrency (0) must be between 1 and 10000" in str(refused.value)


def test_a_route_put_at_run_time_follows_its_own_policy(make_server, receiver) -> None:
    # Given a route put over the API (not in tarry.toml) with 1 retry of its own and a failure
    # queue, and a receiver that always fails
    receiver.always["/put"] = 503
    server = make_server("[dispatch]\nnumber_of_retries = 0\n[queues.failures]\n")
    with Client(server.url) as client:
        client.put_route(
            "put-down",
            transport="http",
            url=f"{receiver.base}/put",
            retries=1,
            retry_backoff="100ms",
            on_failure_report_to="failures",
        )
        # When a message for it falls due
        sent = client.send("put-down", "x")
        # Then it is tried twice (the route's retries, not the global none), then reported
        [report] = client.receive("failures", wait="10s")
        assert json.loads(report.body)["attempts"] == 2
        assert len(receiver.attempts["/put"]) == 2
        assert client.get(sent.id).state == "dead_lettered"
