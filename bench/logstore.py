"""Log store benchmarks (issue 3), each against the SQLite store in the same run where the issue
asks for a comparison; prints JSON with the ratios.

    .venv/bin/python bench/logstore.py --scale 0.1            # while others use the machine
    .venv/bin/python bench/logstore.py                        # full scale (10M-message parts)
    .venv/bin/python bench/logstore.py --only year --year-messages 100000000   # the 100M case

Parts (``--only`` runs one):
- ``schedule``: in-process scheduling through ``store()`` in batches of 1,000, 8 in flight
  (goal ≥ 300k/s).
- ``http``: batch scheduling over HTTP against a real ``tarry serve`` (goal ≥ 50k/s).
- ``release``: releasing due messages into a local queue through the engine's dispatcher
  (goal ≥ 100k/s), with the event listeners ``tarry serve`` attaches (metrics, journal) and
  without any.
- ``steady``: 10,000 msg/s × scale with delays 1–60 s × scale over HTTP: lateness p99 (goal
  ≤ 5 ms), client-side and server-side (journal). ``--steady-rate``, ``--steady-seconds`` and
  ``--steady-ids`` (each message with a ``message_id``) make it an idempotent producer's run
  long enough to see a drained partition and its keys deleted.
- ``trickle``: in-process release at steady rates (1,000, 3,000 and 10,000 msg/s for 10 s ×
  scale, messages falling due one after another as steady traffic makes them), with the
  dispatcher's tick off (0) and at its default: CPU µs per message of the whole process and of
  each busy thread, and messages per round. Where ``release`` measures a backlog in full
  batches, this measures what a round costs when each finds a few messages.
- ``rerun``: 50,000 × scale sends with a ``message_id`` (due in 1 h, over 10 minutes: two or
  three partitions) through the engine in batches of 1,000, then the same sends again, as a
  rerun of an import makes them: msg/s and CPU µs per message of each pass, log and SQLite.
- ``inflight``: consumers' receive (20 at a time) and ack of 20,000 × scale ready messages
  in-process, while 0, 1,000 and 10,000 others are in flight (received, not acked): CPU µs per
  message of the whole process, log and SQLite. A consumer that holds many messages must not
  make every receive slower.
- ``index``: bytes per pending message of the current partition's index (goal ≤ 16 B at 10M).
- ``restart``: 10M × scale messages in the current partition: time until ready to release,
  with the snapshot and without it (goal ≤ 3 s with), and the CPU the start takes until its
  start-up scrub is done too.
- ``year``: messages spread over a year of partitions (default 1M × scale over a span that keeps
  ~950 messages per 5-minute partition, as 100M over a year does; the issue's case is
  ``--year-messages 100000000`` (365 days)): store RSS after a restart (goal ≤ 2 GB) and disk /
  raw message bytes (goal ≤ 1.5; raw = body + destination + id, 100-byte bodies).
  ``--year-order due`` fills in due order (a batch falls in one or two partitions, JSON bodies):
  fast enough to run the 100M case in under an hour; ``--year-dir`` keeps the store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from foundation import (  # noqa: E402
    batch_schedule,
    busiest_threads_cpu_s,
    cpu_s,
    journal_lateness,
    loop_sleep_cpu_us,
    rss_mb,
    start_server,
    steady,
    thread_cpu_s,
)

from tarry.config import DispatchConfig, load_config  # noqa: E402
from tarry.engine.core import Engine  # noqa: E402
from tarry.model.ids import IdGenerator  # noqa: E402
from tarry.model.message import Message  # noqa: E402
from tarry.model.time import SystemClock  # noqa: E402
from tarry.server.app import create_app, tune_runtime  # noqa: E402
from tarry.store.log import LogStore  # noqa: E402
from tarry.store.log.index import DueIndex  # noqa: E402
from tarry.store.sqlite import SQLiteStore  # noqa: E402

BODY = b"x" * 100
DAY_MS = 86_400_000


def messages(count: int, due_of: Any, destination: str = "bench") -> list[Message]:
    ids = IdGenerator()
    now = SystemClock().now_ms()
    out = []
    for i in range(count):
        due = due_of(i, now)
        out.append(
            Message(
                id=ids.new_due(now, due),
                destination=destination,
                body=BODY,
                headers={},
                sent_at_ms=now,
                deliver_at_ms=due,
                expires_at_ms=None,
                updated_at_ms=now,
            )
        )
    return out


async def _store_all(
    store: Any, batch: list[Message], size: int = 1000, in_flight: int = 8
) -> float:
    """Store ``batch`` in calls of ``size``, ``in_flight`` at a time (as concurrent producers
    would: they share group commits)."""
    chunks = [batch[start : start + size] for start in range(0, len(batch), size)]
    started = time.perf_counter()
    for first in range(0, len(chunks), in_flight):
        await asyncio.gather(*(store.store(c) for c in chunks[first : first + in_flight]))
    return time.perf_counter() - started


def ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b else float("nan")


# --- parts ------------------------------------------------------------------------------------
async def part_schedule(tmp: Path, scale: float) -> dict[str, Any]:
    count = int(2_000_000 * scale)
    batch = messages(count, lambda i, now: now + 3_600_000 + i % 60_000)
    log_store = LogStore(tmp / "sched-log")
    await log_store.open()
    cpu = time.process_time()
    log_s = await _store_all(log_store, batch)
    log_cpu = time.process_time() - cpu
    await log_store.close()
    sqlite_store = SQLiteStore(tmp / "sched.db")
    await sqlite_store.open()
    cpu = time.process_time()
    sqlite_s = await _store_all(sqlite_store, batch)
    sqlite_cpu = time.process_time() - cpu
    await sqlite_store.close()
    return {
        "messages": count,
        "log_messages_per_s": round(count / log_s),
        "sqlite_messages_per_s": round(count / sqlite_s),
        "ratio_log_to_sqlite": ratio(sqlite_s, log_s),
        # CPU of every thread of the process (the writer's too): steadier than msg/s on a
        # shared machine.
        "log_cpu_us_per_message": round(log_cpu / count * 1e6, 2),
        "sqlite_cpu_us_per_message": round(sqlite_cpu / count * 1e6, 2),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _serve(tmp: Path, name: str, store: str, work: Any) -> dict[str, Any]:
    """``work(url, pid)`` against a fresh ``tarry serve`` on ``store``, with the CPU seconds
    the server and this process spent meanwhile (``server_cpu_s``, ``bench_cpu_s``)."""
    proc, url = start_server(tmp / name, store)
    server_before, bench_before = cpu_s(proc.pid), time.process_time()
    try:
        result: dict[str, Any] = asyncio.run(work(url, proc.pid))
        result.setdefault("server_cpu_s", round(cpu_s(proc.pid) - server_before, 2))
        result["bench_cpu_s"] = round(time.process_time() - bench_before, 2)
        result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        proc.terminate()
        proc.wait()
    return result


def part_http(tmp: Path, scale: float) -> dict[str, Any]:
    total = max(10_000, int(500_000 * scale)) // 1000 * 1000
    out: dict[str, Any] = {"messages": total}
    for store in ("log", "sqlite"):
        result = _serve(
            tmp,
            f"http-{store}",
            store,
            lambda url, pid: batch_schedule(url, total, 1000, 2, server_pid=pid),
        )
        out[f"{store}_messages_per_s"] = result["messages_per_s"]
        # The client shares the cores with the server: CPU per 1,000 messages of each side
        # (while the batches were sent) says where the time went when msg/s alone is blurred
        # by the machine's load.
        out[f"{store}_server_cpu_s_per_1000"] = round(result["server_cpu_s"] / total * 1000, 4)
        out[f"{store}_client_cpu_s_per_1000"] = round(result["client_cpu_s"] / total * 1000, 4)
        out[f"{store}_load_average"] = result["load_average"]
    out["ratio_log_to_sqlite"] = ratio(out["log_messages_per_s"], out["sqlite_messages_per_s"])
    return out


async def _bench_engine(
    data_dir: Path,
    store: str,
    *,
    listeners: bool = False,
    tick_ms: int | None = None,
    queues_in_memory: bool = True,
    batch_size: int | None = None,
) -> Engine:
    """A started in-process engine on ``store`` with the queue ``bench``. With ``listeners``
    it has the event listeners ``tarry serve`` gives it by default (the metrics, and the
    journal, flushed as the server flushes it); without, neither (journal off)."""
    dispatch = {"tick_ms": tick_ms, "batch_size": batch_size}
    config = load_config(
        None,
        {
            "server": {"data_dir": str(data_dir)},
            "store": {"engine": store, "queues_in_memory": queues_in_memory},
            "journal": {"enabled": listeners},
            "dispatch": {key: value for key, value in dispatch.items() if value is not None},
        },
    )
    engine = Engine.from_config(config)
    if listeners:
        create_app(config, engine=engine)  # attaches the metrics, as for ``tarry serve``
    await engine.start(background=False)
    if engine.journal is not None:
        engine._spawn(engine.journal.run)  # the flush loop ``start(background=True)`` runs
    await engine.declare_queue("bench", {})
    return engine


async def _release_rate(
    tmp: Path, store: str, count: int, *, listeners: bool
) -> tuple[float, float]:
    """(messages/s, CPU µs per message of the whole process: every thread, the queue
    database's and the log writer's too, so a shared machine's load shows less in it)."""
    name = f"release-{store}-{'server' if listeners else 'bare'}"
    engine = await _bench_engine(tmp / name, store, listeners=listeners)
    try:
        # Steady state: the due partition is indexed before its messages arrive.
        await engine.store.next_due_time()
        batch = messages(count, lambda i, now: now - 1000 + i % 500)
        await _store_all(engine.store, batch)
        del batch  # as in a server, the released messages are not kept alive elsewhere
        tune_runtime()  # GC and thread switching as ``tarry serve`` sets them
        started, cpu = time.perf_counter(), time.process_time()
        await engine.dispatcher.release_all_due()  # the rounds ``run`` makes, without sleeping
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        info = await engine.queue_info("bench")
        assert info.ready == count, (info.ready, count)
        return count / elapsed, cpu / count * 1e6
    finally:
        await engine.stop()


#: How long after they are stored the first of ``start_trickle``'s messages falls due.
TRICKLE_LEAD_MS = 3000


async def start_trickle(engine: Engine, rate: int, seconds: float) -> int:
    """Store ``rate`` messages a second for ``seconds`` (returns how many), falling due one
    after another from ``TRICKLE_LEAD_MS`` on, and start the dispatcher's own loop."""
    await engine.store.next_due_time()
    count = int(rate * seconds)
    await _store_all(
        engine.store, messages(count, lambda i, now: now + TRICKLE_LEAD_MS + i * 1000 // rate)
    )
    tune_runtime()
    engine._spawn(engine.dispatcher.run)
    return count


async def _trickle(tmp: Path, rate: int, seconds: float, tick_ms: int | None) -> dict[str, Any]:
    """Release ``rate`` msg/s for ``seconds`` through the dispatcher's own loop (``run``, with
    its sleeps), the messages falling due one after another from 3 s after they were stored;
    with the listeners ``tarry serve`` attaches."""
    name = f"trickle-{rate}-{tick_ms}"
    engine = await _bench_engine(tmp / name, "log", listeners=True, tick_ms=tick_ms)
    try:
        count = await start_trickle(engine, rate, seconds)
        await asyncio.sleep(TRICKLE_LEAD_MS / 1000 - 0.5)
        threads, cpu = thread_cpu_s(os.getpid()), time.process_time()
        rounds = engine.dispatcher.stats.rounds
        while engine.dispatcher.stats.released < count:
            await asyncio.sleep(0.1)
        per_message = 1e6 / count
        spent = busiest_threads_cpu_s(os.getpid(), threads)
        rounds = engine.dispatcher.stats.rounds - rounds
        return {
            "cpu_us_per_message": round((time.process_time() - cpu) * per_message, 1),
            "busiest_threads_cpu_us_per_message": [round(t * per_message, 1) for t in spent],
            "messages_per_round": round(count / rounds, 1) if rounds else None,
        }
    finally:
        await engine.stop()


def part_trickle(tmp: Path, scale: float) -> dict[str, Any]:
    """Each rate with the tick off and at its default, one after the other (same minutes)."""
    seconds = max(2.0, 10 * scale)
    default_tick = DispatchConfig().tick_ms
    out: dict[str, Any] = {"seconds": seconds, "default_tick_ms": default_tick}
    for rate in (1_000, 3_000, 10_000):
        for tick_ms in (0, default_tick):
            out[f"{rate}_per_s_tick_{tick_ms}"] = asyncio.run(_trickle(tmp, rate, seconds, tick_ms))
        ratio_key = f"{rate}_per_s_cpu_ratio_tick_{default_tick}_to_0"
        out[ratio_key] = ratio(
            out[f"{rate}_per_s_tick_{default_tick}"]["cpu_us_per_message"],
            out[f"{rate}_per_s_tick_0"]["cpu_us_per_message"],
        )
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return out


async def _consume_cost(tmp: Path, store: str, held: int, count: int) -> float:
    """CPU µs per message of the whole process to receive (20 at a time) and ack ``count``
    ready messages while ``held`` others stay in flight."""
    engine = await _bench_engine(tmp / f"inflight-{store}-{held}", store)
    try:
        total = held + count
        for start in range(0, total, 1000):
            size = min(1000, total - start)
            await engine.send_batch([{"destination": "bench", "body": "x"}] * size)
        while held > 0:  # taken for an hour: in flight for the whole measurement
            held -= len(
                await engine.receive("bench", max_messages=min(held, 1000), visibility_ms=3_600_000)
            )
        tune_runtime()
        cpu, done = time.process_time(), 0
        while done < count:
            got = await engine.receive("bench", max_messages=20)
            await engine.ack("bench", [d.receipt for d in got])
            done += len(got)
        return (time.process_time() - cpu) / count * 1e6
    finally:
        await engine.stop()


def part_inflight(tmp: Path, scale: float) -> dict[str, Any]:
    count = max(2_000, int(20_000 * scale))
    out: dict[str, Any] = {"messages": count}
    for store in ("log", "sqlite"):
        costs = {
            held: round(asyncio.run(_consume_cost(tmp, store, held, count)), 1)
            for held in (0, 1_000, 10_000)
        }
        out[store] = {f"cpu_us_per_message_{held}_in_flight": c for held, c in costs.items()}
        out[store]["ratio_10000_to_0_in_flight"] = ratio(costs[10_000], costs[0])
    return out


def part_release(tmp: Path, scale: float) -> dict[str, Any]:
    """Each store twice: with the listeners ``tarry serve`` attaches (metrics and journal:
    the figure that counts) and bare (no listener; what the release path alone costs)."""
    count = int(500_000 * scale)
    out: dict[str, Any] = {"messages": count}
    for store in ("log", "sqlite"):
        for mode in ("server", "bare"):
            rate, cpu = asyncio.run(_release_rate(tmp, store, count, listeners=mode == "server"))
            out[f"{store}_{mode}_messages_per_s"] = round(rate)
            out[f"{store}_{mode}_cpu_us_per_message"] = round(cpu, 2)
    for mode in ("server", "bare"):
        out[f"ratio_log_to_sqlite_{mode}"] = ratio(
            out[f"log_{mode}_messages_per_s"], out[f"sqlite_{mode}_messages_per_s"]
        )
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return out


async def _rerun_rates(tmp: Path, store: str, count: int) -> dict[str, float]:
    engine = await _bench_engine(tmp / f"rerun-{store}", store)
    try:
        step = 600_000 / count
        items = [
            {
                "destination": "bench",
                "body": "x" * 100,
                "delay_ms": 3_600_000 + int(i * step),
                "message_id": f"m-{i}",
            }
            for i in range(count)
        ]
        out: dict[str, float] = {}
        for name in ("first", "rerun"):
            started, cpu = time.perf_counter(), time.process_time()
            created = 0
            for start in range(0, count, 1000):
                results = await engine.send_batch(items[start : start + 1000])
                created += sum(1 for r in results if getattr(r, "created", False))
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
            assert created == (count if name == "first" else 0), (name, created)
            out[f"{name}_messages_per_s"] = round(count / elapsed)
            out[f"{name}_cpu_us_per_message"] = round(cpu / count * 1e6, 1)
        return out
    finally:
        await engine.stop()


def part_rerun(tmp: Path, scale: float) -> dict[str, Any]:
    count = int(50_000 * scale)
    out: dict[str, Any] = {"messages": count}
    for store in ("log", "sqlite"):
        out[store] = asyncio.run(_rerun_rates(tmp, store, count))
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return out


def part_steady(
    tmp: Path,
    scale: float,
    stores: list[str],
    *,
    rate: int | None = None,
    seconds: int | None = None,
    message_ids: bool = False,
) -> dict[str, Any]:
    rate = rate or max(100, int(10_000 * scale))
    seconds = seconds or max(5, int(60 * scale))
    max_delay = max(2_000, int(60_000 * scale))
    out: dict[str, Any] = {
        "rate_per_s": rate,
        "seconds": seconds,
        "max_delay_ms": max_delay,
        "message_ids": message_ids,
    }

    async def work(url: str, pid: int) -> dict[str, Any]:
        before = thread_cpu_s(pid)
        result = await steady(url, rate, seconds, max_delay, message_ids=message_ids)
        spent = busiest_threads_cpu_s(pid, before)
        # The server's busiest threads (the event loop's and the queue database's): CPU each
        # spent over the run. Their sum near one core, with a core to spare on the machine,
        # says the run was bound by the GIL the two share, not by the cores.
        result["server_busiest_threads_cpu_s"] = [round(cpu, 2) for cpu in spent]
        return result

    for store in stores:
        name = f"steady-{store}"
        result = _serve(tmp, name, store, work)
        result["server_released"] = journal_lateness(tmp / name, "released")
        if result["received"]:
            per_k = 1000 / result["received"]
            result["server_cpu_s_per_1000"] = round(result["server_cpu_s"] * per_k, 3)
        out[store] = result
    return out


def part_index(scale: float) -> dict[str, Any]:
    count = int(10_000_000 * scale)
    before = rss_mb(os.getpid())
    index = DueIndex()
    start_ms = 1_700_000_000_000
    chunk = 100_000
    for first in range(0, count, chunk):
        n = min(chunk, count - first)
        index.add(
            [start_ms + random.randrange(300_000) for _ in range(n)],
            list(range(first * 100, (first + n) * 100, 100)),
        )
    index.pop_due(start_ms - 1, 1)  # merge: the steady state the dispatcher sees
    after = rss_mb(os.getpid())
    return {
        "entries": len(index),
        "index_bytes_per_message": round(index.nbytes / len(index), 2),
        "rss_mb_delta": round(after - before, 1),
        "pulsar_in_memory_tracker_bytes_per_message": 24,
    }


async def _fill_current(root: Path, count: int) -> None:
    now = SystemClock().now_ms()
    # All due late in one 1-hour partition that is current: everything is indexed.
    store = LogStore(root, granularity_ms=3_600_000)
    await store.open()
    end = (now // 3_600_000 + 1) * 3_600_000
    ids = IdGenerator()
    for first in range(0, count, 10_000):
        batch = [
            Message(
                id=ids.new_due(now, end - 1 - (first + i) % 1_000_000),
                destination="bench",
                body=b"r",
                headers={},
                sent_at_ms=now,
                deliver_at_ms=end - 1 - (first + i) % 1_000_000,
                expires_at_ms=None,
                updated_at_ms=now,
            )
            for i in range(min(10_000, count - first))
        ]
        await store.store(batch)
    await store.next_due_time()  # index it, so the closing snapshot holds it
    await store.close()


async def _ready_seconds(root: Path) -> tuple[float, int, float]:
    """Seconds until ready to release, entries indexed, and CPU seconds until the start-up
    scrub is done too (what a start costs beside the event loop)."""
    started, cpu = time.perf_counter(), time.process_time()
    store = LogStore(root, granularity_ms=3_600_000)
    await store.open()
    await store.next_due_time()
    elapsed = time.perf_counter() - started
    entries = store.inspect()["indexed_entries"]
    while not store.scrub_done:
        await asyncio.sleep(0.01)
    cpu = time.process_time() - cpu
    store._opened = False  # leave the snapshot as it is
    store.files.close()
    store._executor.shutdown()
    return elapsed, entries, cpu


def part_restart(tmp: Path, scale: float) -> dict[str, Any]:
    count = int(10_000_000 * scale)
    root = tmp / "restart"
    asyncio.run(_fill_current(root, count))
    with_snapshot, entries, cpu = asyncio.run(_ready_seconds(root))
    shutil.rmtree(root / "snapshots")
    without, entries2, cpu2 = asyncio.run(_ready_seconds(root))
    return {
        "messages_in_current_partition": count,
        "indexed_after_restart": [entries, entries2],
        "ready_s_with_snapshot": round(with_snapshot, 3),
        "ready_s_without_snapshot": round(without, 3),
        "cpu_s_until_scrubbed_with_snapshot": round(cpu, 3),
        "cpu_s_until_scrubbed_without_snapshot": round(cpu2, 3),
        "ratio_without_to_with": ratio(without, with_snapshot),
    }


#: Bodies of the due-order fill: JSON events as reminder and retry producers send them
#: (99–132 bytes, 121 on average; raw counts them as it counts the fixed 100-byte ones).
_EVENTS = (
    ("invoice.reminder", 'invoice":"INV-{n:010d}","customer":{c},"amount_cents":{a}'),
    ("order.cancel_unpaid", 'order":"ORD-{n:010d}","customer":{c}'),
    ("trial.ending", 'account":{c},"plan":"team-annual","seats":{s},"notify":["email","in_app"]'),
    ("payment.retry", 'payment":"pay_{n:012x}","attempt":{s},"amount_cents":{a},"currency":"EUR"'),
)


def json_body(rng: random.Random, n: int) -> bytes:
    name, fields = _EVENTS[n % len(_EVENTS)]
    values = fields.format(
        n=n, c=rng.randrange(10**7), a=rng.randrange(10**6), s=rng.randrange(1, 9)
    )
    return f'{{"event":"{name}","{values},"trace":"{rng.getrandbits(64):016x}"}}'.encode()


def year_batches(
    count: int, span_ms: int, order: str, batch_size: int = 1000, *, lead_ms: int = 60_000
) -> Any:
    """Batches of ``count`` messages due over ``span_ms`` from ``lead_ms`` ahead. ``random``: each
    due time uniform over the span (a batch touches ~1,000 partitions), fixed 100-byte bodies.
    ``due``: in due order, ``span_ms / count`` apart with jitter (a batch falls in one or two
    partitions, as a lake import or steady producers with similar delays give), JSON bodies."""
    rng = random.Random(3)
    ids = IdGenerator()
    now = SystemClock().now_ms()
    start = now + lead_ms
    for first in range(0, count, batch_size):
        n = min(batch_size, count - first)
        if order == "random":
            yield messages(n, lambda i, now: start + random.randrange(span_ms))
            continue
        batch = []
        for i in range(first, first + n):
            due = start + i * span_ms // count + rng.randrange(max(1, span_ms // count))
            batch.append(
                Message(
                    id=ids.new_due(now, due),
                    destination="bench",
                    body=json_body(rng, i),
                    headers={},
                    sent_at_ms=now,
                    deliver_at_ms=due,
                    expires_at_ms=None,
                    updated_at_ms=now,
                )
            )
        yield batch


async def _year_write(
    root: Path, count: int, span_days: float, fsync: str, order: str
) -> dict[str, Any]:
    span_ms = int(span_days * DAY_MS)
    store = LogStore(root, fsync=fsync)
    await store.open()
    started, cpu = time.perf_counter(), time.process_time()
    raw = 0
    in_flight: list[asyncio.Task[Any]] = []
    for batch in year_batches(count, span_ms, order):
        raw += sum(len(m.body) + len(m.destination) + len(m.id) for m in batch)
        # A few batches in flight, as concurrent producers: the next is built while the
        # writer thread writes the last.
        in_flight.append(asyncio.ensure_future(store.store(batch)))
        if len(in_flight) >= 4:
            await in_flight.pop(0)
    await asyncio.gather(*in_flight)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    partitions = len(store.partitions)
    await store.close()
    os.sync()  # under ``never`` the last groups may still be in the page cache
    disk = sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())
    return {
        "messages": count,
        "span_days": span_days,
        "fill_order": order,
        "fill_fsync": fsync,
        "partitions": partitions,
        "write_messages_per_s": round(count / elapsed),
        "write_cpu_s": round(cpu, 1),
        "write_rss_mb": round(rss_mb(os.getpid()), 1),
        "raw_message_bytes": raw,
        "disk_bytes": disk,
        "disk_to_raw": round(disk / raw, 3),
    }


async def _year_open(root: Path) -> dict[str, Any]:
    started, cpu = time.perf_counter(), time.process_time()
    store = LogStore(root)
    await store.open()
    await store.next_due_time()
    return {
        "restart_ready_s": round(time.perf_counter() - started, 3),
        "restart_cpu_s": round(time.process_time() - cpu, 3),
        "pending_after_restart": await store.count_scheduled(),
        "clean_start": store.inspect().get("clean_start", False),
        "rss_mb_after_restart": round(rss_mb(os.getpid()), 1),
    }


def part_year(root: Path, count: int, span_days: float, fsync: str, order: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for child in ("year-write", "year-open"):
        command = [sys.executable, __file__, "--child", child, "--dir", str(root)]
        command += ["--n", str(count), "--span-days", str(span_days), "--year-fsync", fsync]
        command += ["--year-order", order]
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            check=True,
        )
        out.update(json.loads(result.stdout))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument(
        "--only",
        choices=[
            "schedule",
            "http",
            "release",
            "trickle",
            "rerun",
            "steady",
            "inflight",
            "index",
            "restart",
            "year",
        ],
    )
    parser.add_argument(
        "--year-messages", type=int, help="messages over a year (default 1M × scale)"
    )
    parser.add_argument(
        "--year-span-days",
        type=float,
        help="span of due times (default: 365 days × messages / 100M, at least 1 day, so a "
        "partition holds as many messages as in the 100M-over-a-year case)",
    )
    parser.add_argument(
        "--year-fsync",
        choices=["batch", "always", "never"],
        default="never",
        help="durability policy while the year part fills its store (default never: a batch of "
        "random due times touches ~1,000 partitions, so group commit fsyncs ~1,000 files per "
        "1,000 messages and 100M messages would take hours; what is measured is the store "
        "holding them, after a restart, not how fast producers filled it)",
    )
    parser.add_argument(
        "--year-order",
        choices=["random", "due"],
        default="random",
        help="how the year part fills its store: random due times with 100-byte bodies "
        "(default), or in due order with JSON bodies (each batch falls in one or two "
        "partitions, as a lake import or steady producers with similar delays give: fast "
        "enough for 100M)",
    )
    parser.add_argument(
        "--year-dir",
        type=Path,
        help="fill the year part's store here and keep it (default: a temporary directory)",
    )
    parser.add_argument(
        "--stores",
        type=lambda text: text.split(","),
        default=["log", "sqlite"],
        help="stores the steady part runs, comma-separated (default log,sqlite)",
    )
    parser.add_argument("--steady-rate", type=int, help="steady's msg/s (default 10,000 × scale)")
    parser.add_argument(
        "--steady-seconds",
        type=int,
        help="steady's length (default 60 × scale; over 300 with the default granularity, a "
        "drained five-minute partition is deleted during the run)",
    )
    parser.add_argument(
        "--steady-ids",
        action="store_true",
        help="steady's messages each sent with a message_id of its own (an idempotent "
        "producer's: a de-duplication key each, kept until its partition is deleted)",
    )
    parser.add_argument("--span-days", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "year-write":
        print(
            json.dumps(
                asyncio.run(
                    _year_write(args.dir, args.n, args.span_days, args.year_fsync, args.year_order)
                )
            )
        )
        return
    if args.child == "year-open":
        print(json.dumps(asyncio.run(_year_open(args.dir))))
        return
    scale = args.scale
    year_messages = args.year_messages or int(1_000_000 * scale)
    year_span = args.year_span_days or max(1.0, 365 * year_messages / 100_000_000)
    results: dict[str, Any] = {
        "scale": scale,
        "cpus": os.cpu_count(),
        "loop_sleep_cpu_us": loop_sleep_cpu_us(),
    }
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        parts = {
            "schedule": lambda: asyncio.run(part_schedule(tmp, scale)),
            "http": lambda: part_http(tmp, scale),
            "release": lambda: part_release(tmp, scale),
            "trickle": lambda: part_trickle(tmp, scale),
            "rerun": lambda: part_rerun(tmp, scale),
            "steady": lambda: part_steady(
                tmp,
                scale,
                args.stores,
                rate=args.steady_rate,
                seconds=args.steady_seconds,
                message_ids=args.steady_ids,
            ),
            "inflight": lambda: part_inflight(tmp, scale),
            "index": lambda: part_index(scale),
            "restart": lambda: part_restart(tmp, scale),
            "year": lambda: part_year(
                args.year_dir or tmp / "year",
                year_messages,
                year_span,
                args.year_fsync,
                args.year_order,
            ),
        }
        for key, work in parts.items():
            if args.only in (None, key):
                results[key] = work()
                print(f"{key}: {json.dumps(results[key])}", file=sys.stderr)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
