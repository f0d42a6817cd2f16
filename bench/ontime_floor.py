"""The least a Python server on tarry's HTTP stack can spend on ``ontime.py``'s workload: the
``floor`` part of ``ontime.py``, which starts this file as a server of its own.

    .venv/bin/python bench/ontime_floor.py --port PORT --data DIR [--memory]

It answers the three requests ``ontime.py``'s producer and consumer make, in the shapes they
read, and nothing else:

- ``POST /v1/messages/batch``: each message gets an id and its due time and goes into a heap;
  the batch is appended to a file and fsynced before the answer (``--memory``: not at all);
- ``POST /v1/queues/{queue}/receive``: up to ``max`` due messages (waiting up to ``wait_ms``
  for the first), each given a receipt and held in flight;
- ``POST /v1/queues/{queue}/ack``: the receipts appended and fsynced (``--memory``: not at
  all), then forgotten.

A timer set for the next due time (at most one every 2 ms, tarry's default
``dispatch.tick_ms``) moves due messages to the ready list and wakes a waiting receive, as
tarry's release rounds do. Everything tarry promises beyond a durable send and a
durable ack is left out: no validation, no checksums, no index on disk, no recovery, no
journal, no metrics, no tenants, no FastAPI. The same uvicorn as tarry serves it, with uvloop
and httptools, and fsyncs run on a thread as tarry's writer does. So what it spends a message
is below what any Python server of this design can spend on this workload on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import os
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from itertools import count
from pathlib import Path
from typing import Any

import orjson
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from foundation import read_asgi_body  # noqa: E402

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
#: Releases at most this often, as tarry's default ``dispatch.tick_ms``.
TICK_MS = 2
_HEADERS = [(b"content-type", b"application/json")]


class FloorServer:
    """The heap of messages not due yet, the ready list, the receipts in flight and the log."""

    def __init__(self, log_path: Path | None) -> None:
        self._fd = None if log_path is None else os.open(log_path, os.O_WRONLY | os.O_CREAT, 0o644)
        self._pending: list[tuple[int, int, str, str]] = []  # (due, sequence, id, body)
        self._ready: deque[tuple[int, str, str]] = deque()  # (due, id, body)
        self._in_flight: dict[str, str] = {}
        self._numbers = count()
        self._filled = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0
        self._released_at = 0.0

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = await read_asgi_body(receive)
        path: str = scope["path"]
        if path == "/v1/messages/batch":
            answer = await self._send_batch(orjson.loads(body)["messages"])
        elif path.endswith("/receive"):
            asked = orjson.loads(body)
            answer = await self._receive(asked.get("max", 1), asked.get("wait_ms", 0))
        elif path.endswith("/ack"):
            answer = await self._ack(orjson.loads(body)["receipts"])
        else:
            answer = b"{}"  # the queue's creation, or anything else: nothing to do
        await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
        await send({"type": "http.response.body", "body": answer})

    async def _send_batch(self, messages: list[dict[str, Any]]) -> bytes:
        now = int(time.time() * 1000)
        kept = []
        for message in messages:
            number = next(self._numbers)
            kept.append((now + message["delay_ms"], number, f"m{number}", message["body"]))
        await self._durable(orjson.dumps(kept))
        for entry in kept:
            heapq.heappush(self._pending, entry)
        self._wake_at(self._pending[0][0])
        return orjson.dumps({"results": [{"id": entry[2], "status": 201} for entry in kept]})

    async def _receive(self, most: int, wait_ms: int) -> bytes:
        deadline = time.monotonic() + wait_ms / 1000
        while not self._ready and (left := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(self._filled.wait(), left)
            except TimeoutError:
                break
        taken = []
        ready, in_flight = self._ready, self._in_flight
        while ready and len(taken) < most:
            due, id, body = ready.popleft()
            receipt = f"r{id}"
            in_flight[receipt] = id
            taken.append({"id": id, "receipt": receipt, "body": body, "deliver_at": due})
        return orjson.dumps({"messages": taken})

    async def _ack(self, receipts: list[str]) -> bytes:
        await self._durable(orjson.dumps(receipts))
        acked = sum(self._in_flight.pop(receipt, None) is not None for receipt in receipts)
        return orjson.dumps({"acked": acked, "unknown": []})

    async def _durable(self, record: bytes) -> None:
        if self._fd is not None:
            os.write(self._fd, record + b"\n")
            await asyncio.get_running_loop().run_in_executor(None, os.fsync, self._fd)

    def _wake_at(self, due_ms: int) -> None:
        if self._timer is not None and self._timer_at <= due_ms:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer_at = due_ms
        # At most a round every ``TICK_MS``, as tarry's dispatcher (``dispatch.tick_ms``).
        at = max(due_ms, self._released_at + TICK_MS)
        self._timer = loop.call_later((at - time.time() * 1000) / 1000, self._release)

    def _release(self) -> None:
        self._timer = None
        now = self._released_at = time.time() * 1000
        pending, ready = self._pending, self._ready
        while pending and pending[0][0] <= now:
            due, _, id, body = heapq.heappop(pending)
            ready.append((due, id, body))
        if ready:
            self._filled.set()
            self._filled = asyncio.Event()
        if pending:
            self._wake_at(pending[0][0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--memory", action="store_true", help="no file, no fsync")
    args = parser.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    app = FloorServer(None if args.memory else args.data / "floor.log")
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
