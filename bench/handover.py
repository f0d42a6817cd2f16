"""What handing a batch of 1,000 messages to another core costs on this machine (issue 23,
"Using more than one core" in the README); prints JSON.

    .venv/bin/python bench/handover.py [--round-trips 2000] [--messages 1000]

A split of one node into processes moves work off the event loop but pays for each batch it
hands over. Two hand-overs, each a round trip from an event loop (uvloop when installed, as
``tarry serve`` runs), one at a time:
- ``thread``: ``run_in_executor`` on a one-thread pool, as the queue database's and the log
  writer's hand-overs are today. The batch is passed by reference.
- ``process``: a child process over a Unix socket, as an HTTP ingress process would hand a
  decoded batch to the core process (or the core a release to a queue-database process): the
  batch goes as columns (bodies joined, their lengths, delays: ~``messages`` × 112 bytes), the
  child reads it into arrays without an object per message and answers with 16-byte ids.
Per hand-over: wall µs, and CPU µs of the loop's process and of the other side (the pool's
thread or the child), with the CPU µs a message they come to.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from foundation import cpu_s, loop_sleep_cpu_us  # noqa: E402

_HEAD = struct.Struct("<II")  # messages, bytes of the bodies


def _batch(messages: int) -> bytes:
    bodies = b"x" * (100 * messages)
    lengths = np.full(messages, 100, dtype=np.uint32).tobytes()
    delays = np.arange(messages, dtype=np.int64).tobytes()
    return _HEAD.pack(messages, len(bodies)) + bodies + lengths + delays


def _ids(messages: int) -> bytes:
    return os.urandom(16 * messages)


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    view = bytearray(size)
    got = 0
    while got < size:
        n = conn.recv_into(memoryview(view)[got:])
        if n == 0:
            raise EOFError
        got += n
    return bytes(view)


def child(fd: int) -> None:
    """The other core: read a batch as columns, answer with its ids."""
    conn = socket.socket(fileno=fd)
    while True:
        try:
            count, body_bytes = _HEAD.unpack(_read_exactly(conn, _HEAD.size))
        except EOFError:
            return
        rest = _read_exactly(conn, body_bytes + count * 12)
        lengths = np.frombuffer(rest, dtype=np.uint32, count=count, offset=body_bytes)
        delays = np.frombuffer(rest, dtype=np.int64, count=count, offset=body_bytes + count * 4)
        assert int(lengths.sum()) == body_bytes and len(delays) == count
        conn.sendall(_ids(count))


async def _thread(round_trips: int, messages: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    batch = _batch(messages)
    with ThreadPoolExecutor(max_workers=1) as pool:
        worker_tid = await loop.run_in_executor(pool, threading.get_native_id)

        def take(data: bytes) -> bytes:
            # The batch is the caller's object, read in place: what a thread's hand-over is.
            count, _ = _HEAD.unpack_from(data)
            return _ids(count)

        await loop.run_in_executor(pool, take, batch)
        worker_before = _thread_cpu_s(worker_tid)
        cpu_before, started = time.process_time(), time.perf_counter()
        for _ in range(round_trips):
            await loop.run_in_executor(pool, take, batch)
        wall = time.perf_counter() - started
        worker = _thread_cpu_s(worker_tid) - worker_before
        total = time.process_time() - cpu_before
    return _figures(round_trips, messages, wall, total - worker, worker)


async def _process(round_trips: int, messages: int) -> dict[str, Any]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--child-fd", str(theirs.fileno()), pass_fds=(theirs.fileno(),)
    )
    theirs.close()
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    batch, answer = _batch(messages), 16 * messages
    try:
        writer.write(batch)
        await reader.readexactly(answer)
        child_before = cpu_s(proc.pid)
        cpu_before, started = time.process_time(), time.perf_counter()
        for _ in range(round_trips):
            writer.write(batch)
            await reader.readexactly(answer)
        wall = time.perf_counter() - started
        ours_cpu = time.process_time() - cpu_before
        child_cpu = cpu_s(proc.pid) - child_before
    finally:
        writer.close()
        await proc.wait()
    return _figures(round_trips, messages, wall, ours_cpu, child_cpu)


def _thread_cpu_s(tid: int) -> float:
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _figures(
    round_trips: int, messages: int, wall: float, loop_cpu: float, other_cpu: float
) -> dict[str, Any]:
    return {
        "wall_us_per_handover": round(wall / round_trips * 1e6, 1),
        "loop_cpu_us_per_handover": round(loop_cpu / round_trips * 1e6, 1),
        "other_side_cpu_us_per_handover": round(other_cpu / round_trips * 1e6, 1),
        "cpu_us_per_message": round((loop_cpu + other_cpu) / round_trips / messages * 1e6, 3),
    }


def _run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--round-trips", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=1000, help="messages a batch")
    parser.add_argument("--child-fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_fd is not None:
        child(args.child_fd)
        return
    results: dict[str, Any] = {
        "workload": {"round_trips": args.round_trips, "messages": args.messages},
        "loop_sleep_cpu_us": loop_sleep_cpu_us(),
        "load_average": os.getloadavg(),
    }
    for name, case in (("thread", _thread), ("process", _process)):
        print(f"{name} ...", file=sys.stderr)
        results[name] = _run(case(args.round_trips, args.messages))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
