"""A response's head and body leave in one send (``tarry.server.connections``): writes in one
turn of the loop are joined, in order, and nothing held is lost at close."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tarry.server.connections import _JoinedWrites
from tests.conftest import ServerProcess


class _Transport:
    """Records what reaches the socket."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[bytes, ...]]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", (data,)))

    def writelines(self, data: Any) -> None:
        self.calls.append(("writelines", tuple(data)))

    def close(self) -> None:
        self.closing = True
        self.calls.append(("close", ()))

    def abort(self) -> None:
        self.closing = True
        self.calls.append(("abort", ()))

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str) -> str:
        return f"extra {name}"


def test_a_head_and_its_body_go_out_in_one_send_and_a_lone_write_at_the_end_of_the_turn() -> None:
    async def scenario() -> list[tuple[str, tuple[bytes, ...]]]:
        real = _Transport()
        joined = _JoinedWrites(real, asyncio.get_running_loop())
        joined.write(b"head")
        assert real.calls == []  # held for the body
        joined.write(b"body")
        assert real.calls == [("writelines", (b"head", b"body"))]
        joined.write(b"alone")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert real.calls[-1] == ("write", (b"alone",))
        # Writes after a held one keep their order.
        joined.write(b"1")
        joined.writelines([b"2", b"3"])
        joined.write(b"4")
        joined.close()
        assert joined.get_extra_info("peername") == "extra peername"
        await asyncio.sleep(0)
        return real.calls[2:]

    assert asyncio.run(scenario()) == [
        ("write", (b"1",)),
        ("writelines", (b"2", b"3")),
        ("write", (b"4",)),
        ("close", ()),
    ]


def test_an_abort_drops_what_is_held_and_nothing_is_written_after_it() -> None:
    async def scenario() -> list[tuple[str, tuple[bytes, ...]]]:
        real = _Transport()
        joined = _JoinedWrites(real, asyncio.get_running_loop())
        joined.write(b"head")
        joined.abort()
        await asyncio.sleep(0)
        return real.calls

    assert asyncio.run(scenario()) == [("abort", ())]


def test_responses_through_a_real_server_arrive_whole(server: ServerProcess) -> None:
    # Given a server whose connections join their writes
    with httpx.Client(base_url=server.url) as client:
        # When a keep-alive connection asks for answers of every shape: small, large, an error,
        # metrics, and an answer that closes the connection
        assert client.put("/v1/queues/q", json={}).status_code == 201
        for _ in range(3):
            assert client.post("/v1/queues/q/ack", json={"receipts": []}).json() == {
                "acked": 0,
                "unknown": [],
            }
        body = "x" * 300_000
        sent = client.post("/v1/messages", json={"destination": "q", "body": body})
        assert sent.status_code == 201
        got = client.post("/v1/queues/q/receive", json={"max": 1}).json()["messages"]
        # Then each arrives whole and in order
        assert [m["body"] for m in got] == [body]
        assert client.post("/v1/queues/q/ack", content=b"{").status_code == 400
        metrics = client.get("/metrics")
        assert metrics.status_code == 200 and b"tarry_messages" in metrics.content
        big = client.post("/v1/queues/q/ack", content=b"[" + b" " * (2 * 1024 * 1024) + b"]")
        assert big.status_code == 413 and big.headers["connection"] == "close"
        assert client.get("/healthz").status_code == 200
