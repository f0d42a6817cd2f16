"""The consumer's and the batch send's routes served ahead of the app (``tarry.server.fast_lane``):
which requests the lane takes, and that what it answers is what the app would have answered."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import Response

from tarry.config import load_config
from tarry.errors import NotFound, TarryError
from tarry.server.app import create_app
from tarry.server.fast_lane import FastLane
from tarry.server.responses import JSON


async def _receive_route(request: Request, name: str) -> Response:
    if name == "missing":
        raise NotFound(f"no queue named {name!r}")
    if name == "broken":
        raise RuntimeError("a bug")
    return JSON({"route": "receive", "name": name})


async def _batch_route(request: Request) -> Response:
    return JSON({"route": "batch"})


async def _on_error(request: Request, exc: TarryError) -> Response:
    return JSON({"error": exc.to_dict()}, status_code=exc.http_status)


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    return JSON({"error": {"code": "internal"}}, status_code=500)


_HANDLERS = {TarryError: _on_error, Exception: _on_unexpected}
_LANE = FastLane(
    queue_routes={("POST", "receive"): _receive_route},
    routes={("POST", "/v1/messages/batch"): _batch_route},
)


def _scope(method: str, path: str, **scope: Any) -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "headers": []} | scope


def _call(method: str, path: str, sent: list[dict[str, Any]] | None = None) -> tuple[int, bytes]:
    sent = [] if sent is None else sent

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    route = _LANE.match(_scope(method, path))
    assert route is not None
    asyncio.run(_LANE.serve(route, _HANDLERS, _scope(method, path), receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_the_lane_takes_its_routes_and_leaves_everything_else_to_the_app() -> None:
    assert _call("POST", "/v1/queues/orders.eu/receive") == (
        200,
        b'{"route":"receive","name":"orders.eu"}',
    )
    assert _call("POST", "/v1/messages/batch") == (200, b'{"route":"batch"}')
    # Not one of its routes, or not one segment for the name: the app's router decides.
    for method, path in [
        ("GET", "/v1/queues/q/receive"),
        ("POST", "/v1/queues/q/ack"),
        ("POST", "/v1/queues/q"),
        ("POST", "/v1/queues//receive"),
        ("POST", "/v1/queues/a/b/receive"),
        ("POST", "/v1/queues/q/receive/"),
        ("POST", "/v1/topics/q/receive"),
        ("GET", "/v1/messages/batch"),
        ("POST", "/v1/messages/batch/"),
        ("POST", "/v1/messages"),
    ]:
        assert _LANE.match(_scope(method, path)) is None, (method, path)
    assert _LANE.match(_scope("POST", "/x/v1/queues/q/receive", root_path="/x")) is None
    assert _LANE.match({"type": "lifespan"}) is None


def test_an_error_is_answered_by_the_apps_own_handler() -> None:
    status, body = _call("POST", "/v1/queues/missing/receive")
    assert status == 404
    assert body == b'{"error":{"code":"not_found","message":"no queue named \'missing\'"}}'


def test_an_unexpected_error_is_answered_with_a_500_and_goes_on_to_the_server() -> None:
    # As FastAPI's ServerErrorMiddleware: the app's handler answers, then the error is raised
    # on (the server logs it and closes the connection).
    sent: list[dict[str, Any]] = []
    with pytest.raises(RuntimeError, match="a bug"):
        _call("POST", "/v1/queues/broken/receive", sent)
    assert sent[0]["status"] == 500
    assert sent[1]["body"] == b'{"error":{"code":"internal"}}'


Scenario = Callable[[httpx.AsyncClient, list[str]], Awaitable[None]]


def _serve(tmp_path: Path, scenario: Scenario, *, lane: bool = True) -> None:
    """Run ``scenario`` against the whole app (started, with a token required), given a client
    and the paths that reached the router; with ``lane`` False the lane stays closed (every
    request goes through the whole app)."""
    config = load_config(
        None,
        {
            "store": {"engine": "memory"},
            "journal": {"enabled": False},
            "server": {"data_dir": str(tmp_path), "max_batch": 3},
            "auth": {
                "tokens": [
                    {
                        "token": "s3cret",
                        "name": "all",
                        "send": ["*"],
                        "receive": ["*"],
                        "admin": ["*"],
                    },
                    {
                        "token": "eu-s3cret",
                        "name": "eu",
                        "send": ["eu.*"],
                        "receive": ["eu.*"],
                        "admin": ["eu.*"],
                    },
                ]
            },
        },
    )
    app = create_app(config)
    routed: list[str] = []
    router = app.router

    async def spy(scope: Any, receive: Any, send: Any) -> None:
        routed.append(scope["path"])
        await router(scope, receive, send)

    async def run() -> None:
        async with router.lifespan_context(app):
            app.router = spy  # type: ignore[assignment]
            if not lane:
                app._lane_open = False  # type: ignore[attr-defined]
            transport = httpx.ASGITransport(app=app)
            headers = {"authorization": "Bearer s3cret"}
            async with httpx.AsyncClient(
                transport=transport, base_url="http://tarry", headers=headers
            ) as client:
                await scenario(client, routed)

    asyncio.run(run())


def test_receive_ack_and_nack_through_the_server_as_the_api_says(tmp_path: Path) -> None:
    async def scenario(client: httpx.AsyncClient, routed: list[str]) -> None:
        assert (await client.put("/v1/queues/q", json={})).status_code == 201
        sent = await client.post("/v1/messages", json={"destination": "q", "body": "hi"})
        assert sent.status_code == 201
        got = (await client.post("/v1/queues/q/receive", json={"max": 10})).json()["messages"]
        assert [m["body"] for m in got] == ["hi"]
        nacked = await client.post("/v1/queues/q/nack", json={"receipts": [got[0]["receipt"]]})
        assert nacked.json() == {"nacked": 1, "unknown": []}
        again = (await client.post("/v1/queues/q/receive", json={"max": 10})).json()["messages"]
        assert [m["redelivered"] for m in again] == [True]
        acked = await client.post(
            "/v1/queues/q/ack", json={"receipts": [again[0]["receipt"], "x.1"]}
        )
        assert acked.json() == {"acked": 1, "unknown": ["x.1"]}
        # The send and the consumer's calls went by the lane; the declare by the router.
        assert routed == ["/v1/queues/q"]

    _serve(tmp_path, scenario)


def test_errors_through_the_lane_are_the_documented_ones(tmp_path: Path) -> None:
    async def scenario(client: httpx.AsyncClient, routed: list[str]) -> None:
        missing = await client.post("/v1/queues/nope/receive", json={})
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found")
        bad = await client.post("/v1/queues/nope/ack", json={"receipts": "r"})
        assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_argument")
        await client.put("/v1/queues/q", json={})
        invalid = await client.post("/v1/queues/q/receive", json={"max": 0})
        assert (invalid.status_code, invalid.json()["error"]["code"]) == (400, "invalid_argument")
        unknown = await client.post("/v1/queues/q/receive", json={"nax": 1})
        assert unknown.json()["error"]["message"] == "unknown field(s) nax"
        not_json = await client.post("/v1/queues/q/ack", content=b"{")
        assert not_json.json()["error"]["code"] == "invalid_argument"
        stranger = await client.post("/v1/queues/q/receive", json={}, headers={"authorization": ""})
        assert (stranger.status_code, stranger.json()["error"]["code"]) == (401, "unauthenticated")
        assert routed == ["/v1/queues/q"]

    _serve(tmp_path, scenario)


def test_the_lane_answers_byte_for_byte_as_the_whole_app(tmp_path: Path) -> None:
    """Requests whose answers do not depend on ids or times, answered with the lane open and
    closed: the same status, headers and body, errors and refusals included."""
    big = b'{"receipts": ["' + b"x" * (1024 * 1024) + b'"]}'
    requests: list[tuple[str, dict[str, Any]]] = [
        ("/v1/queues/q/receive", {"json": {"max": 10}}),
        ("/v1/queues/q/receive", {"json": {"max": 10, "ack": ["x.1"]}}),
        ("/v1/queues/q/receive", {"json": {"ack": "x.1"}}),
        ("/v1/queues/q/ack", {"json": {"receipts": ["x.1"]}}),
        ("/v1/queues/q/nack", {"json": {"receipts": ["x.1"], "requeue": False}}),
        ("/v1/queues/q/nack", {"json": {"receipts": [], "requeue": 1}}),
        ("/v1/queues/nope/receive", {"json": {}}),
        ("/v1/queues/q/receive", {"json": {"nax": 1}}),
        ("/v1/queues/q/receive", {"json": {"max": True}}),
        ("/v1/queues/q/ack", {"content": b"{"}),
        ("/v1/queues/q/ack", {"content": b"[]"}),
        ("/v1/queues/q/ack", {"content": b""}),
        ("/v1/queues/q/ack", {"content": big}),
        # No token, an unknown one, and a tenant's token on another tenant's queue.
        ("/v1/queues/q/receive", {"json": {}, "headers": {"authorization": ""}}),
        ("/v1/queues/q/ack", {"json": {}, "headers": {"authorization": "Bearer nope"}}),
        ("/v1/queues/q/ack", {"json": {"receipts": []}, "headers": _EU}),
        ("/v1/queues/eu.q/receive", {"json": {"max": 1}, "headers": _EU}),
        ("/v1/messages/batch", {"json": {"messages": []}}),
        ("/v1/messages/batch", {"json": {"messages": [{"destination": "q", "delay_ms": "x"}, 1]}}),
        ("/v1/messages/batch", {"json": {"messages": [{}, {}, {}, {}]}}),
        ("/v1/messages/batch", {"json": {"message": []}}),
        ("/v1/messages/batch", {"content": b"{"}),
        ("/v1/messages/batch", {"json": {"messages": [{"destination": "q"}]}, "headers": _EU}),
        ("/v1/messages/batch", {"json": {"messages": []}, "headers": {"authorization": ""}}),
        ("/v1/messages", {"json": {"destination": "q", "delay_ms": "x"}}),
        ("/v1/messages", {"json": {"destination": "nope", "body": "x"}}),
        ("/v1/messages", {"json": ["q"]}),
        ("/v1/messages", {"content": b"{"}),
        ("/v1/messages", {"json": {"destination": "q", "body": "x" * (5 * 1024 * 1024)}}),
        ("/v1/messages", {"json": {"destination": "q"}, "headers": _EU}),
        ("/v1/messages", {"json": {"destination": "q"}, "headers": {"authorization": ""}}),
    ]

    def run(lane: bool) -> tuple[list[tuple[int, list[tuple[str, str]], bytes]], list[str]]:
        answers: list[tuple[int, list[tuple[str, str]], bytes]] = []
        seen: list[str] = []

        async def scenario(client: httpx.AsyncClient, routed: list[str]) -> None:
            await client.put("/v1/queues/q", json={})
            await client.put("/v1/queues/eu.q", json={}, headers=_EU)
            for path, options in requests:
                answer = await client.post(path, **options)
                answers.append((answer.status_code, answer.headers.multi_items(), answer.content))
            seen.extend(routed)

        _serve(tmp_path / ("lane" if lane else "app"), scenario, lane=lane)
        return answers, seen

    by_lane, routed_by_lane = run(lane=True)
    by_app, routed_by_app = run(lane=False)
    assert by_lane == by_app
    # What the answers are: a refusal by auth, a 413 that closes the connection.
    statuses = [status for status, _, _ in by_lane]
    assert statuses == [
        *(200, 200, 400, 200, 200, 400, 404, 400, 400, 400, 400, 400, 413),
        *(401, 401, 403, 200, 400, 200, 400, 400, 400, 200, 401),
        *(400, 404, 400, 400, 413, 403, 401),
    ]
    assert b'"acked":0,"unknown":["x.1"]}' in by_lane[1][2]
    assert ("connection", "close") in by_lane[12][1]
    assert b"not_authorized" in by_lane[15][2]
    # Every request but the declares went by the lane when it was open, none when closed.
    assert routed_by_lane == ["/v1/queues/q", "/v1/queues/eu.q"]
    assert routed_by_app == routed_by_lane + [path for path, _ in requests]


_EU = {"authorization": "Bearer eu-s3cret"}
