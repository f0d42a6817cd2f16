"""A local queue's share of a message's life (issue 23): release into the queue, receive and
ack, in-process through the engine on the log store (the default); prints JSON.

    .venv/bin/python bench/queuelife.py [--messages 50000] [--receive 1000] [--listeners]
                                        [--in-database]
    .venv/bin/python bench/queuelife.py --per-round [--listeners] [--in-database]
    .venv/bin/python bench/queuelife.py --contended [--rate 10000] [--seconds 10]

``--messages`` messages of 100 bytes, sent with a delay and due within 0.5 s, are stored first
(not measured); then the dispatcher releases them all (``release``), and one consumer receives
up to ``--receive`` at a time and acks each batch (``receive_ack``). Per phase: CPU µs per
message of the whole process (every thread: the queue database's and the log writer's too,
which is steadier than wall time on a shared machine) and of the queue database thread alone.
``--listeners`` attaches the metrics and the journal as ``tarry serve`` does; without, the
queue path alone is measured. ``--in-database``: ``[store] queues_in_memory = false`` (every
release, receive and ack a queue-database transaction); the default keeps them in memory.

``--per-round``: what a release round and a consumer's receive and ack cost for their size.
Rounds of 1, 16, 64 and 256 messages (``dispatch.batch_size``), a receive of everything ready
and its ack after every second round; CPU µs of the event loop's thread per round and per
receive with its ack, and a least-squares line through them: the fixed cost (what a round or
a receive costs whatever it carries) and the cost of each message.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from foundation import percentile, thread_cpu_s  # noqa: E402
from logstore import _bench_engine, _store_all, messages, start_trickle  # noqa: E402

from tarry.server.app import tune_runtime  # noqa: E402
from tarry.store.sqlite.database import Database  # noqa: E402


def _db_thread_ids() -> set[int]:
    return {t.native_id for t in threading.enumerate() if t.name.startswith("tarry-db_")}


def _db_cpu_s() -> float:
    spent = thread_cpu_s(os.getpid())
    return sum(spent.get(tid, 0.0) for tid in _db_thread_ids() if tid is not None)


async def _stored_due(engine: Any, count: int) -> None:
    """``count`` messages sent now with a delay, due within 0.5 s, stored; returns once all are
    due. Sent with a delay and due after the engine started, as a delayed send's messages are,
    so local queues kept in memory take them (a message due before it was sent, or before the
    process started, takes the queue database's path)."""
    await engine.store.next_due_time()
    await _store_all(engine.store, messages(count, lambda i, now: now + 50 + i % 450))
    await asyncio.sleep(0.6)


async def _life(
    tmp: Path, count: int, receive: int, listeners: bool, in_database: bool
) -> dict[str, Any]:
    engine = await _bench_engine(
        tmp / "life", "log", listeners=listeners, queues_in_memory=not in_database
    )
    try:
        await _stored_due(engine, count)
        tune_runtime()
        out: dict[str, Any] = {"messages": count, "receive_max": receive}
        cpu, db = time.process_time(), _db_cpu_s()
        await engine.dispatcher.release_all_due()
        out["release_cpu_us_per_message"] = round((time.process_time() - cpu) / count * 1e6, 2)
        out["release_db_thread_us_per_message"] = round((_db_cpu_s() - db) / count * 1e6, 2)
        assert (await engine.queue_info("bench")).ready == count
        cpu, db, done = time.process_time(), _db_cpu_s(), 0
        while done < count:
            got = await engine.receive("bench", max_messages=receive)
            result = await engine.ack("bench", [d.receipt for d in got])
            assert result["acked"] == len(got), result
            done += len(got)
        out["receive_ack_cpu_us_per_message"] = round((time.process_time() - cpu) / count * 1e6, 2)
        out["receive_ack_db_thread_us_per_message"] = round((_db_cpu_s() - db) / count * 1e6, 2)
        out["life_cpu_us_per_message"] = round(
            out["release_cpu_us_per_message"] + out["receive_ack_cpu_us_per_message"], 2
        )
        return out
    finally:
        await engine.stop()


async def _per_round(tmp: Path, listeners: bool, in_database: bool) -> dict[str, Any]:
    sizes: dict[str, Any] = {}
    for size in (1, 16, 64, 256):
        engine = await _bench_engine(
            tmp / f"round-{size}",
            "log",
            listeners=listeners,
            queues_in_memory=not in_database,
            batch_size=size,
        )
        try:
            rounds = max(2, 16_000 // size)
            await _stored_due(engine, rounds * size)
            tune_runtime()
            release_s = receive_s = 0.0
            for k in range(rounds):
                cpu = time.thread_time()
                assert await engine.dispatcher.run_once()
                release_s += time.thread_time() - cpu
                if k % 2:
                    cpu = time.thread_time()
                    got = await engine.receive("bench", max_messages=1000)
                    await engine.ack("bench", [d.receipt for d in got])
                    receive_s += time.thread_time() - cpu
            sizes[str(size)] = {
                "round_cpu_us": round(release_s / rounds * 1e6, 1),
                "receive_ack_cpu_us": round(receive_s / (rounds // 2) * 1e6, 1),
            }
        finally:
            await engine.stop()
    out: dict[str, Any] = {"by_messages": sizes}
    for part, per_call in (("round", "round_cpu_us"), ("receive_ack", "receive_ack_cpu_us")):
        # A receive takes what two rounds released: twice the round's size.
        carried = [int(size) * (2 if part == "receive_ack" else 1) for size in sizes]
        fixed, each = _line(carried, [figures[per_call] for figures in sizes.values()])
        out[f"{part}_fixed_cpu_us"], out[f"{part}_cpu_us_per_message"] = fixed, each
    return out


def _line(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through the points."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return round(my - slope * mx, 1), round(slope, 2)


def _timing_releases(waits: list[float], commits: list[float]) -> Any:
    """``Database.write`` that times each release's transaction (its work is the release's)."""
    write = Database.write

    async def timed(self: Database, work: Any, **options: Any) -> Any:
        if not getattr(work, "__qualname__", "").startswith("_release."):
            return await write(self, work, **options)
        submitted = time.perf_counter()

        def started(conn: Any) -> Any:
            waits.append((time.perf_counter() - submitted) * 1000)
            return work(conn)

        try:
            return await write(self, started, **options)
        finally:
            commits.append((time.perf_counter() - submitted) * 1000)

    return timed


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50), 2),
        "p99": round(percentile(values, 99), 2),
        "max": round(max(values), 2),
    }


async def _contended(tmp: Path, rate: int, seconds: float) -> dict[str, Any]:
    engine = await _bench_engine(tmp / "contended", "log", listeners=True)
    waits: list[float] = []
    commits: list[float] = []
    late: list[float] = []
    early = 0

    def released(events: Any) -> None:
        late.extend(t - m.deliver_at_ms for e, m, t, _, _ in events if e == "released")

    engine.add_listener(lambda event: released([event]), many=released)
    Database.write = _timing_releases(waits, commits)  # type: ignore[method-assign]
    try:
        count = await start_trickle(engine, rate, seconds)
        received = 0

        async def consume() -> None:
            nonlocal received, early
            while received < count:
                got = await engine.receive("bench", max_messages=50, wait_ms=1000)
                now = time.time() * 1000
                early += sum(1 for d in got if d.message.deliver_at_ms > now)
                received += len(got)
                if got:
                    await engine.ack("bench", [d.receipt for d in got])

        await asyncio.wait_for(asyncio.gather(consume(), consume()), seconds + 60)
        return {
            "rate_per_s": rate,
            "seconds": seconds,
            "received": received,
            "early": early,
            "release_transactions": len(commits),
            "release_waited_for_the_thread_ms": _spread(waits),
            "release_waited_for_its_commit_ms": _spread(commits),
            "release_lateness_ms": _spread(late),
        }
    finally:
        await engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--receive", type=int, default=1000)
    parser.add_argument("--listeners", action="store_true")
    parser.add_argument("--in-database", action="store_true")
    parser.add_argument("--per-round", action="store_true")
    parser.add_argument("--contended", action="store_true")
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tarry-queuelife-") as tmp:
        if args.contended:
            result = asyncio.run(_contended(Path(tmp), args.rate, args.seconds))
        else:
            if args.per_round:
                result = asyncio.run(_per_round(Path(tmp), args.listeners, args.in_database))
            else:
                result = asyncio.run(
                    _life(Path(tmp), args.messages, args.receive, args.listeners, args.in_database)
                )
            result["listeners"] = args.listeners
            result["queues_in_memory"] = not args.in_database
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
