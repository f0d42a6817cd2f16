"""What this machine can do at best for issue 3's speed goals: the essential work of each goal,
written as plainly as Python allows and with none of tarry around it. Prints JSON.

    .venv/bin/python bench/floor.py                 # every part
    .venv/bin/python bench/floor.py --only release  # one part

A floor is not tarry. It keeps what the issue's design cannot drop (frame and checksum a
record, append it, fsync in groups, note due time and position; on release read and check the
record, insert it into a queue table keyed by id, append a marker) and drops everything else
(validation, events, breakers, partitions, claims, errors). If a floor is below a goal on this
machine, no Python implementation of that design reaches the goal here; the bench says how
far tarry is above its floor.

Parts:
- ``python``: seconds for a 10M-iteration ``+=`` loop in a function (compare figures across
  machines with it).
- ``schedule``: frame + CRC32C + append the records of ``Message`` objects (what the store's
  batch API takes) in calls of 1,000, an fsync per 8 calls, due times and positions into numpy
  arrays (goal ≥ 300k msg/s).
- ``release``: for records due in due order, in batches of 1,000: read, check length and CRC,
  unpack (stage ``decode``); insert (id, queue, seq, body, due) into an SQLite queue table
  (WAL, ``synchronous=NORMAL``, unique key on id, ordered by seq) and commit (stage
  ``queue_db``); frame and append a marker per message, fsync (stage ``markers``). The
  ceiling gives the queue database a core of its own, as tarry's thread would at best
  (goal ≥ 100k msg/s).
- ``http``: the same client as ``bench/logstore.py --only http`` (batches of 1,000, 2 in
  flight) against uvicorn serving (a) an app that answers without reading the body and (b)
  one that parses the batch with orjson, checks each item's three fields, and appends and
  fsyncs its records as ``schedule`` does, answering an id per item (goal ≥ 50k msg/s).
- ``requests``: server CPU per request, one at a time, of requests that do next to nothing
  (a receive from an empty queue, a queue's info, an ack of an unknown receipt, a batch of
  one message) against a real ``tarry serve``, and of a GET against uvicorn's unread app. A
  steady load pays these per release round, not per message: this is what the steady goal's
  consumers and producers cost on top of their messages here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import os
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import google_crc32c
import httpx
import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from foundation import (  # noqa: E402
    batch_schedule,
    cpu_s,
    free_port,
    read_asgi_body,
    start_server,
    wait_for_port,
)  # noqa: E402
from logstore import messages  # noqa: E402

from tarry.model.ids import IdGenerator  # noqa: E402
from tarry.model.message import Message  # noqa: E402

BATCH = 1000
FSYNC_EVERY = 8  # calls per fsync: the store's 8 producers in flight share one group commit
_HEAD = struct.Struct("<BBHI")
_U32 = struct.Struct("<I")
_FIXED = struct.Struct("<qqqHH")
_MARK = struct.Struct("<qq")
_crc, _extend = google_crc32c.value, google_crc32c.extend


def python_loop() -> float:
    started = time.perf_counter()
    total = 0
    for i in range(10_000_000):
        total += i
    return time.perf_counter() - started


def _due_batch(count: int) -> list[Message]:
    """``count`` messages with 100-byte bodies, due within the last second (as the release
    part of ``bench/logstore.py`` makes them)."""
    return messages(count, lambda i, now: now - 1000 + i % 500)


def _frame_messages(batch: Iterable[Message]) -> tuple[bytes, list[int], list[int]]:
    """The records of ``batch`` joined, with each one's due time and offset in the join."""
    parts: list[bytes] = []
    dues: list[int] = []
    offsets: list[int] = []
    at = 0
    head, u32, fixed = _HEAD.pack, _U32.pack, _FIXED.pack
    for m in batch:
        destination = m.destination.encode()
        payload = m.id.encode() + fixed(m.deliver_at_ms, m.sent_at_ms, -1, 0, len(destination))
        payload += destination + m.body
        header = head(1, 1, 0, len(payload))
        parts += (header, u32(_extend(_crc(header), payload)), payload)
        dues.append(m.deliver_at_ms)
        offsets.append(at)
        at += 12 + len(payload)
    return b"".join(parts), dues, offsets


def schedule(path: Path, batch: list[Message]) -> tuple[float, float, np.ndarray, np.ndarray]:
    """(seconds, CPU seconds, due times, positions) of appending ``batch`` as ``schedule``
    says."""
    due_of = np.empty(len(batch), np.int64)
    position_of = np.empty(len(batch), np.int64)
    started, cpu = time.perf_counter(), time.process_time()
    with path.open("ab") as file:
        position = 0
        for call, start in enumerate(range(0, len(batch), BATCH)):
            data, dues, offsets = _frame_messages(batch[start : start + BATCH])
            file.write(data)
            if call % FSYNC_EVERY == FSYNC_EVERY - 1:
                file.flush()
                os.fsync(file.fileno())
            end = start + len(dues)
            due_of[start:end] = dues
            position_of[start:end] = np.asarray(offsets, np.int64) + position
            position += len(data)
        file.flush()
        os.fsync(file.fileno())
    return time.perf_counter() - started, time.process_time() - cpu, due_of, position_of


def _decode(buf: mmap.mmap, positions: Iterable[int]) -> list[tuple[str, bytes, int]]:
    """(id, body, due) of the record at each position, length and CRC checked."""
    rows = []
    head, fixed = _HEAD.unpack_from, _FIXED.unpack_from
    for at in positions:
        _, _, _, length = head(buf, at)
        end = at + 12 + length
        payload = buf[at + 12 : end]
        if _extend(_crc(buf[at : at + 8]), payload) != _U32.unpack_from(buf, at + 8)[0]:
            raise ValueError(f"checksum mismatch at {at}")
        due, _, _, _, dest_len = fixed(payload, 26)
        rows.append((payload[:26].decode(), payload[48 + dest_len :], due))
    return rows


def _queue_db(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(
        "CREATE TABLE q (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, queue TEXT NOT NULL, "
        "body BLOB NOT NULL, due INTEGER NOT NULL)"
    )
    return conn


def release(tmp: Path, count: int) -> dict[str, Any]:
    _, _, due_of, position_of = schedule(tmp / "release.log", _due_batch(count))
    conn = _queue_db(tmp / "queue.db")
    order = position_of[np.argsort(due_of, kind="stable")].tolist()
    stages = {"decode": 0.0, "queue_db": 0.0, "markers": 0.0}
    marker_head = _HEAD.pack(2, 2, 0, 26 + _MARK.size + len(b"bench"))
    marker_crc = _crc(marker_head)
    started = time.perf_counter()
    with (tmp / "release.log").open("rb") as log, (tmp / "markers.log").open("ab") as markers:
        buf = mmap.mmap(log.fileno(), 0, access=mmap.ACCESS_READ)
        seq = 0
        for start in range(0, count, BATCH):
            chunk = order[start : start + BATCH]
            t0 = time.process_time()
            rows = _decode(buf, chunk)
            t1 = time.process_time()
            conn.execute("BEGIN")
            conn.executemany(
                "INSERT INTO q (seq, id, queue, body, due) VALUES (?, ?, 'bench', ?, ?)",
                [(seq + i, id_, body, due) for i, (id_, body, due) in enumerate(rows)],
            )
            conn.execute("COMMIT")
            seq += len(rows)
            t2 = time.process_time()
            parts: list[bytes] = []
            for (id_, _, _), target in zip(rows, chunk, strict=True):
                payload = id_.encode() + _MARK.pack(target, 2) + b"bench"
                parts += (marker_head, _U32.pack(_extend(marker_crc, payload)), payload)
            markers.write(b"".join(parts))
            markers.flush()
            os.fsync(markers.fileno())
            t3 = time.process_time()
            stages["decode"] += t1 - t0
            stages["queue_db"] += t2 - t1
            stages["markers"] += t3 - t2
        buf.close()
    elapsed = time.perf_counter() - started
    assert conn.execute("SELECT count(*) FROM q").fetchone()[0] == count
    conn.close()
    us = {name: seconds / count * 1e6 for name, seconds in stages.items()}
    one_core = sum(us.values())
    # The queue database on a core of its own, the rest on the other, with nothing shared:
    two_cores = max(us["decode"] + us["markers"], us["queue_db"])
    return {
        "messages": count,
        "messages_per_s": round(count / elapsed),
        "cpu_us_per_message": {name: round(value, 2) for name, value in us.items()},
        "ceiling_one_core_messages_per_s": round(1e6 / one_core),
        "ceiling_two_cores_messages_per_s": round(1e6 / two_cores),
    }


def part_schedule(tmp: Path, count: int) -> dict[str, Any]:
    batch = _due_batch(count)
    seconds, cpu, _, _ = schedule(tmp / "schedule.log", batch)
    return {
        "messages": count,
        "messages_per_s": round(count / seconds),
        "cpu_us_per_message": round(cpu / count * 1e6, 2),
    }


# --- http -------------------------------------------------------------------------------------
def _answer(body: bytes) -> Callable[[Callable[[dict[str, Any]], Any]], Any]:
    async def send_all(send: Callable[[dict[str, Any]], Any]) -> None:
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return send_all


def floor_app(log_path: str | None) -> Callable[..., Any]:
    """The ASGI app of the http part: answers ``{}`` unread (``log_path`` None), or keeps the
    batch as ``schedule`` does and answers an id per item."""
    ids = IdGenerator()
    file = open(log_path, "ab") if log_path else None  # noqa: SIM115  (open for the app's life)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_asgi_body(receive)
        if file is None or scope["method"] != "POST":
            await _answer(b"{}")(send)
            return
        now = int(time.time() * 1000)
        batch = []
        for item in orjson.loads(body)["messages"]:
            destination, text, delay = item["destination"], item["body"], item["delay_ms"]
            if type(destination) is not str or type(text) is not str or type(delay) is not int:
                raise ValueError("bad item")
            batch.append(
                Message(
                    id=ids.new_due(now, now + delay),
                    destination=destination,
                    body=text.encode(),
                    headers={},
                    sent_at_ms=now,
                    deliver_at_ms=now + delay,
                    expires_at_ms=None,
                    updated_at_ms=now,
                )
            )
        data, _, _ = _frame_messages(batch)
        file.write(data)
        file.flush()
        await asyncio.get_running_loop().run_in_executor(None, os.fsync, file.fileno())
        await _answer(orjson.dumps({"results": [{"id": m.id, "status": 201} for m in batch]}))(send)

    return app


def part_http(tmp: Path, count: int) -> dict[str, Any]:
    out: dict[str, Any] = {"messages": count}
    for name, log_path in (("unread", None), ("floor", str(tmp / "http.log"))):
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(port), "--log", log_path or ""],
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_port(port)
            server_cpu, client_cpu = cpu_s(server.pid), time.process_time()
            result = asyncio.run(batch_schedule(f"http://127.0.0.1:{port}", count, BATCH, 2))
            out[name] = {
                "messages_per_s": result["messages_per_s"],
                "server_cpu_us_per_message": round(
                    (cpu_s(server.pid) - server_cpu) / count * 1e6, 2
                ),
                "client_cpu_us_per_message": round(
                    (time.process_time() - client_cpu) / count * 1e6, 2
                ),
            }
        finally:
            server.terminate()
            server.wait()
    return out


async def _request_costs(url: str, pid: int, calls: dict[str, Any], count: int) -> dict[str, float]:
    out: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=url) as client:
        for name, call in calls.items():
            for _ in range(50):  # warm-up: first-call imports and caches
                (await call(client)).raise_for_status()
            before = cpu_s(pid)
            for _ in range(count):
                (await call(client)).raise_for_status()
            out[name] = round((cpu_s(pid) - before) / count * 1e6)
    return out


_TARRY_CALLS: dict[str, Any] = {
    "receive_from_empty": lambda c: c.post("/v1/queues/q/receive", json={"max": 10}),
    "queue_info": lambda c: c.get("/v1/queues/q"),
    "ack_unknown_receipt": lambda c: c.post("/v1/queues/q/ack", json={"receipts": ["r"]}),
    "send_batch_of_one": lambda c: c.post(
        "/v1/messages/batch",
        json={"messages": [{"destination": "q", "body": "x", "delay_ms": 3_600_000}]},
    ),
}


def part_requests(tmp: Path, count: int) -> dict[str, Any]:
    proc, url = start_server(tmp / "requests", "log")
    try:
        httpx.put(f"{url}/v1/queues/q", json={}).raise_for_status()
        tarry = asyncio.run(_request_costs(url, proc.pid, _TARRY_CALLS, count))
    finally:
        proc.terminate()
        proc.wait()
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--log", ""], stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(port)
        calls = {"get": lambda c: c.get("/")}
        bare = asyncio.run(_request_costs(f"http://127.0.0.1:{port}", server.pid, calls, count))
    finally:
        server.terminate()
        server.wait()
    return {"requests": count, "tarry_server_cpu_us": tarry, "uvicorn_unread_server_cpu_us": bare}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", choices=["python", "schedule", "release", "http", "requests"])
    parser.add_argument("--messages", type=int, default=500_000, help="per part (http: / 5)")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        import uvicorn

        uvicorn.run(
            floor_app(args.log or None), host="127.0.0.1", port=args.serve, log_level="warning"
        )
        return
    parts = [args.only] if args.only else ["python", "schedule", "release", "http", "requests"]
    out: dict[str, Any] = {"cpus": os.cpu_count(), "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="tarry-floor-") as name:
        tmp = Path(name)
        for part in parts:
            if part == "python":
                out["python_10m_adds_s"] = round(python_loop(), 3)
            elif part == "schedule":
                out["schedule"] = part_schedule(tmp, args.messages)
            elif part == "release":
                out["release"] = release(tmp, args.messages)
            elif part == "requests":
                out["requests"] = part_requests(tmp, 1000)
            else:
                out["http"] = part_http(tmp, max(BATCH, args.messages // 5 // BATCH * BATCH))
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
