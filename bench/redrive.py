"""Redrive of many dead letters through a real `tarry serve` (issue 24): how long it takes and at
what rate, and a kill -9 halfway through a second one: afterwards every dead letter must be in
its queue exactly once. Prints JSON.

    .venv/bin/python bench/redrive.py [--count 1000000] [--store log|sqlite] [--delay-ms 0]
        [--per-request 5000]

The dead letters are made the quick way: a queue with ``max_length = 0`` dead-letters every
message it gets (reason ``maxlen``) into ``src.dead``; then ``src`` is declared again without
the limit and ``src.dead`` is redriven page after page (``max`` and ``next_cursor``), as
``tarry redrive`` does. Lost and twice are counted in the queue database file once the server
has stopped: every body is a distinct number.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
from crash import Server as CrashServer
from crash import free_port

SOURCE, DEAD = "src", "src.dead"


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Server(CrashServer):
    """crash.py's server (journal off), with its CPU time and queue database file."""

    def __init__(self, data_dir: Path, store: str) -> None:
        super().__init__(data_dir, free_port(), store, "batch")

    def cpu_s(self) -> float:
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    @property
    def queue_db(self) -> Path:
        return self.data_dir / ("tarry.db" if self.store == "sqlite" else "queues.db")


def ready(url: str, queue: str) -> int:
    return int(httpx.get(f"{url}/v1/queues/{queue}", timeout=60).json()["ready"])


def make_dead_letters(url: str, count: int) -> float:
    started = time.monotonic()
    with httpx.Client(base_url=url, timeout=600) as c:
        c.put(f"/v1/queues/{DEAD}", json={}).raise_for_status()
        c.put(f"/v1/queues/{SOURCE}", json={"max_length": 0, "dead_letter_to": DEAD})
        for start in range(0, count, 10_000):
            batch = [
                {"destination": SOURCE, "body": str(i)}
                for i in range(start, min(count, start + 10_000))
            ]
            c.post("/v1/messages/batch", json={"messages": batch}).raise_for_status()
            if start % 100_000 == 0:
                log(f"  {start + len(batch):,} dead letters made")
        c.delete(f"/v1/queues/{SOURCE}").raise_for_status()
        c.put(f"/v1/queues/{SOURCE}", json={}).raise_for_status()
    return time.monotonic() - started


class Redrive(threading.Thread):
    """``POST /v1/queues/src.dead/redrive`` page after page until done (or the server dies)."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.body = url, body
        self.moved, self.requests, self.done = 0, 0, False

    def run(self) -> None:
        cursor = None
        try:
            with httpx.Client(base_url=self.url, timeout=600) as c:
                while True:
                    page = {**self.body, **({"cursor": cursor} if cursor else {})}
                    response = c.post(f"/v1/queues/{DEAD}/redrive", json=page)
                    response.raise_for_status()
                    answer = response.json()
                    self.moved += answer["moved"]
                    self.requests += 1
                    cursor = answer["next_cursor"]
                    if cursor is None:
                        self.done = True
                        return
        except httpx.HTTPError:
            return  # killed under us


def wait_arrived(url: str, count: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    got = 0
    while time.monotonic() < deadline:
        got = ready(url, SOURCE)
        if got >= count:
            break
        time.sleep(0.2)
    return got


def count_in_db(path: Path, count: int) -> dict[str, int]:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        rows = db.execute(
            "SELECT CAST(body AS TEXT), count(*) FROM messages WHERE queue = ? AND state = 'ready' "
            "GROUP BY body",
            (SOURCE,),
        ).fetchall()
        left = db.execute(
            "SELECT count(*) FROM messages WHERE queue = ? AND state IN ('ready', 'delivered')",
            (DEAD,),
        ).fetchone()[0]
    seen = {int(body): n for body, n in rows}
    return {
        "arrived": sum(seen.values()),
        "lost": sum(1 for i in range(count) if i not in seen),
        "duplicates": sum(n - 1 for n in seen.values() if n > 1),
        "left_in_dead_letter_queue": int(left),
    }


def full_run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    server = Server(root / "full", args.store)
    server.start()
    try:
        log(f"full run: making {args.count:,} dead letters")
        setup_s = make_dead_letters(server.url, args.count)
        cpu_before = server.cpu_s()
        log("full run: redriving")
        started = time.monotonic()
        worker = Redrive(server.url, {"max": args.per_request, "delay_ms": args.delay_ms})
        worker.run()
        redrive_s = time.monotonic() - started
        cpu = server.cpu_s() - cpu_before
        arrived = wait_arrived(server.url, args.count, 600)
    finally:
        server.stop()
    checked = count_in_db(server.queue_db, args.count)
    return {
        "setup_s": round(setup_s, 1),
        "redrive_s": round(redrive_s, 2),
        "messages_per_s": round(worker.moved / redrive_s),
        "server_cpu_s": round(cpu, 2),
        "server_cpu_us_per_message": round(cpu / max(worker.moved, 1) * 1e6, 1),
        "requests": worker.requests,
        "moved": worker.moved,
        "arrived_by_api": arrived,
        **checked,
    }


def crash_run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    server = Server(root / "crash", args.store)
    server.start()
    try:
        log(f"crash run: making {args.count:,} dead letters")
        make_dead_letters(server.url, args.count)
        body = {"max": args.per_request, "delay_ms": args.delay_ms}
        first = Redrive(server.url, body)
        started = time.monotonic()
        first.start()
        while first.is_alive() and ready(server.url, DEAD) > args.count // 2:
            time.sleep(0.05)
        left = ready(server.url, DEAD)
        server.kill()
        log(f"crash run: killed with {left:,} dead letters left")
        first.join(60)
        server.start()
        second = Redrive(server.url, body)
        second.run()
        total_s = time.monotonic() - started
        arrived = wait_arrived(server.url, args.count, 600)
    finally:
        server.stop()
    checked = count_in_db(server.queue_db, args.count)
    return {
        "killed_with_left": left,
        "moved_before_kill_acknowledged": first.moved,
        "moved_after_restart": second.moved,
        "redrive_s_with_restart": round(total_s, 2),
        "arrived_by_api": arrived,
        **checked,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--store", choices=["log", "sqlite"], default="log")
    parser.add_argument("--delay-ms", type=int, default=0)
    parser.add_argument("--per-request", type=int, default=5000)
    parser.add_argument("--only", choices=["full", "crash"])
    args = parser.parse_args()
    result: dict[str, Any] = {
        "count": args.count,
        "store": args.store,
        "delay_ms": args.delay_ms,
        "per_request": args.per_request,
        "load_average": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory(prefix="tarry-redrive-") as tmp:
        if args.only in (None, "full"):
            result["full"] = full_run(args, Path(tmp))
        if args.only in (None, "crash"):
            result["kill_9_halfway"] = crash_run(args, Path(tmp))
    result["load_average_after"] = os.getloadavg()[0]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
