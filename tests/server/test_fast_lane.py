"""The consumer's routes served ahead of the route search (``tarry.server.fast_lane``): which
requests the lane takes, and that what it answers is what the router would have answered."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response

from tarry.config import load_config
from tarry.errors import NotFound, TarryError
from tarry.server.app import create_app
from tarry.server.fast_lane import FastLane
from tarry.server.responses import JSON


class _Inner:
    """The app behind the lane: records what reached it."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        await Response(b"inner")(scope, receive, send)


async def _receive_route(request: Request, name: str) -> Response:
    if name == "missing":
        raise NotFound(f"no queue named {name!r}")
    return JSON({"route": "receive", "name": name})


async def _on_error(request: Request, exc: TarryError) -> Response:
    return JSON({"error": exc.to_dict()}, status_code=exc.http_status)


class _App:
    exception_handlers = {TarryError: _on_error}


def _call(lane: FastLane, method: str, path: str, **scope: Any) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    base = {"type": "http", "method": method, "path": path, "headers": [], "app": _App()}
    asyncio.run(lane(base | scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_the_lane_takes_its_routes_and_passes_on_everything_else() -> None:
    inner = _Inner()
    lane = FastLane(inner, routes={("POST", "receive"): _receive_route})
    assert _call(lane, "POST", "/v1/queues/orders.eu/receive") == (
        200,
        b'{"route":"receive","name":"orders.eu"}',
    )
    assert inner.paths == []
    # Not one of its routes, or not one segment for the name: the app's router decides.
    for method, path in [
        ("GET", "/v1/queues/q/receive"),
        ("POST", "/v1/queues/q/ack"),
        ("POST", "/v1/queues/q"),
        ("POST", "/v1/queues//receive"),
        ("POST", "/v1/queues/a/b/receive"),
        ("POST", "/v1/queues/q/receive/"),
        ("POST", "/v1/topics/q/receive"),
    ]:
        assert _call(lane, method, path) == (200, b"inner")
    assert _call(lane, "POST", "/x/v1/queues/q/receive", root_path="/x") == (200, b"inner")
    assert len(inner.paths) == 8


def test_an_error_is_answered_by_the_apps_own_handler() -> None:
    lane = FastLane(_Inner(), routes={("POST", "receive"): _receive_route})
    status, body = _call(lane, "POST", "/v1/queues/missing/receive")
    assert status == 404
    assert body == b'{"error":{"code":"not_found","message":"no queue named \'missing\'"}}'


Scenario = Callable[[httpx.AsyncClient, list[str]], Awaitable[None]]


def _serve(tmp_path: Path, scenario: Scenario) -> None:
    """Run ``scenario`` against the whole app (started, with a token required), given a client
    and the paths that reached the router."""
    config = load_config(
        None,
        {
            "server": {"data_dir": str(tmp_path)},
            "store": {"engine": "memory"},
            "journal": {"enabled": False},
            "auth": {
                "tokens": [
                    {
                        "token": "s3cret",
                        "name": "all",
                        "send": ["*"],
                        "receive": ["*"],
                        "admin": ["*"],
                    }
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
        # The consumer's calls went by the lane; the declare and the send by the router.
        assert routed == ["/v1/queues/q", "/v1/messages"]

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
