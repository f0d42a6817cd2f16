"""On time under load (issue 23): a burst scheduled as fast as one producer can, then delivered;
tarry against a Redis sorted set in the same run; prints JSON.

    .venv/bin/python bench/ontime.py [--messages 100000] [--baseline-src DIR] [--only redis,tarry]

The workload every peer was measured on: ``--messages`` messages of ~100 bytes, scheduled in
HTTP batches of 1,000 by one producer process as fast as it can, due uniformly 1-10 s after
they are sent, received by one consumer process (long-poll receive of up to 1,000, then ack;
``--ack-on-receive``: the ack goes with the next receive).
Producer and consumer run as separate processes on the same machine as the server.

Per system: schedule rate, lateness at the consumer (receive time - due time) p50 / p99 / max,
early, lost, duplicates, and the server's CPU per message over the messages' whole life (from
the first send to the last ack); for tarry also by thread (``/metrics``): the event loop
(``MainThread``), the queue database (``tarry-db_0``), the log store's writer (``tarry-log_0``).
The Redis baseline is what teams build by hand: ``ZADD`` into a sorted set, a poller process
running a Lua script that moves due members to a list, a consumer popping the list. It is not
durable; its CPU is Redis's plus the poller's.
``--baseline-src`` runs tarry from another source tree too (e.g. a worktree of main before a
change), in the same run. ``--only ...,in-database`` runs this tree once more with
``[store] queues_in_memory = false``: every release, receive and ack a transaction of the
queue database, so the run shows what the local queues kept in memory save. ``floor`` runs
the same producer and consumer against ``ontime_floor.py``: a bare ASGI app on the same
uvicorn that keeps messages in a heap and fsyncs each send and ack and does nothing else (the
least any Python server of this design can spend here); ``floor-memory``, the same without
its file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from foundation import (  # noqa: E402
    cpu_s,
    free_port,
    journal_lateness,
    percentile,
    start_server,
    wait_for_port,
)

QUEUE = "bench.ontime"
BODY = "x" * 100
BATCH = 1000
ZSET = "bench:ontime:due"
READY = "bench:ontime:ready"

# Moves every due member (score <= now) to the ready list, at most ARGV[2] at a time.
MOVE_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #due > 0 then
  redis.call('ZREM', KEYS[1], unpack(due))
  redis.call('RPUSH', KEYS[2], unpack(due))
end
return #due
"""


def _now_ms() -> float:
    return time.time() * 1000


def _delays(count: int, low_ms: int, high_ms: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(low_ms, high_ms) for _ in range(count)]


# --- roles, each run in its own process -----------------------------------------------------


def produce_tarry(
    url: str,
    count: int,
    low_ms: int,
    high_ms: int,
    *,
    message_ids: bool = False,
    correlation_ids: bool = False,
) -> dict[str, Any]:
    delays = _delays(count, low_ms, high_ms, seed=1)
    refused = refused_items = 0
    started = time.perf_counter()
    with httpx.Client(base_url=url, timeout=120) as client:
        for start in range(0, count, BATCH):
            batch: list[dict[str, Any]] = [
                {"destination": QUEUE, "body": BODY, "delay_ms": delay}
                for delay in delays[start : start + BATCH]
            ]
            if message_ids:  # an idempotent producer's: a key of its own per message
                for i, message in enumerate(batch):
                    message["message_id"] = f"ontime-{start + i}"
            if correlation_ids:  # a saga's: ten messages a saga
                for i, message in enumerate(batch):
                    message["correlation_id"] = f"saga-{(start + i) // 10}"
            while True:
                response = client.post(
                    "/v1/messages/batch",
                    content=orjson.dumps({"messages": batch}),
                    headers={"content-type": "application/json"},
                )
                if response.status_code == 200:
                    # A batch is answered 200 with an error for each message refused on its
                    # own (consumers behind: ``overloaded``): those are sent again.
                    results = orjson.loads(response.content)["results"]
                    again = [m for m, r in zip(batch, results, strict=True) if "error" in r]
                    if again:
                        refused_items += len(again)
                        batch = again
                        time.sleep(1)
                        continue
                if response.status_code != 429:
                    break
                # A producer that is told the server is behind waits as told and sends again;
                # the count says the run was not at the rate it asked for.
                refused += 1
                time.sleep(float(response.headers.get("retry-after", "1")))
            response.raise_for_status()
    seconds = time.perf_counter() - started
    return {
        "sent": count,
        "seconds": seconds,
        "batches_refused_overloaded": refused,
        "messages_refused_on_their_own": refused_items,
    }


def consume_tarry(
    url: str, count: int, deadline_s: float, *, ack_on_receive: bool = False
) -> dict[str, Any]:
    """``ack_on_receive``: each batch acked with the next receive (its ``ack`` field), the
    last one on its own; otherwise each with an ack of its own before the next receive."""
    lateness: list[float] = []
    seen: set[str] = set()
    duplicates = 0
    receives = 0
    to_ack: list[str] = []
    deadline = time.monotonic() + deadline_s
    with httpx.Client(base_url=url, timeout=120) as client:
        while len(seen) < count and time.monotonic() < deadline:
            receives += 1
            body: dict[str, Any] = {"max": BATCH, "wait_ms": 1000}
            if to_ack:
                body["ack"], to_ack = to_ack, []
            response = client.post(f"/v1/queues/{QUEUE}/receive", json=body)
            response.raise_for_status()
            now = _now_ms()
            messages = orjson.loads(response.content)["messages"]
            for m in messages:
                lateness.append(now - m["deliver_at"])
                if m["id"] in seen:
                    duplicates += 1
                seen.add(m["id"])
            if messages:
                to_ack = [m["receipt"] for m in messages]
            if to_ack and not ack_on_receive:
                client.post(f"/v1/queues/{QUEUE}/ack", json={"receipts": to_ack}).raise_for_status()
                to_ack = []
        if to_ack:
            client.post(f"/v1/queues/{QUEUE}/ack", json={"receipts": to_ack}).raise_for_status()
    return {
        "received": len(seen),
        "duplicates": duplicates,
        "lateness": lateness,
        "receives": receives,
    }


def produce_redis(count: int, low_ms: int, high_ms: int) -> dict[str, Any]:
    import redis

    r = redis.Redis()
    delays = _delays(count, low_ms, high_ms, seed=1)
    started = time.perf_counter()
    for start in range(0, count, BATCH):
        now = _now_ms()
        # The member carries its due time and a body as big as tarry's.
        members = {
            f"{start + i}:{now + delay:.3f}:{BODY}": now + delay
            for i, delay in enumerate(delays[start : start + BATCH])
        }
        r.zadd(ZSET, members)
    return {"sent": count, "seconds": time.perf_counter() - started}


def poll_redis(count: int, deadline_s: float) -> dict[str, Any]:
    import redis

    r = redis.Redis()
    move = r.register_script(MOVE_DUE)
    moved = 0
    deadline = time.monotonic() + deadline_s
    while moved < count and time.monotonic() < deadline:
        got = int(move(keys=[ZSET, READY], args=[_now_ms(), BATCH]))
        moved += got
        if got < BATCH:
            time.sleep(0.001)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"moved": moved, "cpu_s": usage.ru_utime + usage.ru_stime}


def consume_redis(count: int, deadline_s: float) -> dict[str, Any]:
    import redis

    r = redis.Redis()
    lateness: list[float] = []
    seen: set[str] = set()
    duplicates = 0
    deadline = time.monotonic() + deadline_s
    while len(seen) < count and time.monotonic() < deadline:
        first = r.blpop([READY], timeout=1)
        if first is None:
            continue
        rest = r.lpop(READY, BATCH - 1) or []
        now = _now_ms()
        for raw in [first[1], *rest]:
            index, due, _ = raw.decode().split(":", 2)
            lateness.append(now - float(due))
            if index in seen:
                duplicates += 1
            seen.add(index)
    return {"received": len(seen), "duplicates": duplicates, "lateness": lateness}


ROLES = {
    "produce-tarry": lambda a: produce_tarry(
        a.url,
        a.messages,
        a.min_delay_ms,
        a.max_delay_ms,
        message_ids=a.ids,
        correlation_ids=a.correlation_ids,
    ),
    "consume-tarry": lambda a: consume_tarry(
        a.url, a.messages, a.deadline_s, ack_on_receive=a.ack_on_receive
    ),
    "produce-redis": lambda a: produce_redis(a.messages, a.min_delay_ms, a.max_delay_ms),
    "poll-redis": lambda a: poll_redis(a.messages, a.deadline_s),
    "consume-redis": lambda a: consume_redis(a.messages, a.deadline_s),
}


# --- the runs -------------------------------------------------------------------------------


def _role(role: str, args: argparse.Namespace, url: str = "") -> subprocess.Popen[str]:
    command = [
        sys.executable,
        __file__,
        "--role",
        role,
        "--messages",
        str(args.messages),
        "--min-delay-ms",
        str(args.min_delay_ms),
        "--max-delay-ms",
        str(args.max_delay_ms),
        "--deadline-s",
        str(args.deadline_s),
        "--url",
        url,
        *(["--ids"] if args.ids else []),
        *(["--correlation-ids"] if args.correlation_ids else []),
        *(["--ack-on-receive"] if args.ack_on_receive else []),
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"a bench role failed with exit code {proc.returncode}")
    result: dict[str, Any] = json.loads(out)
    return result


def _summary(
    produced: dict[str, Any], consumed: dict[str, Any], count: int, cpu_seconds: float
) -> dict[str, Any]:
    lateness: list[float] = consumed["lateness"]
    return {
        "messages": count,
        "schedule_messages_per_s": round(produced["sent"] / produced["seconds"]),
        "lateness_ms_p50": round(percentile(lateness, 50), 1),
        "lateness_ms_p99": round(percentile(lateness, 99), 1),
        "lateness_ms_max": round(max(lateness), 1) if lateness else None,
        "early": sum(1 for late in lateness if late < 0),
        "lost": count - consumed["received"],
        "duplicates": consumed["duplicates"],
        "server_cpu_us_per_message": round(cpu_seconds / count * 1e6, 1),
        "batches_refused_overloaded": produced.get("batches_refused_overloaded", 0),
        "messages_refused_on_their_own": produced.get("messages_refused_on_their_own", 0),
    }


def _metrics(url: str) -> dict[str, float]:
    """Every sample of the server's ``/metrics``, by name with its labels."""
    samples: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def _store_counters(samples: dict[str, float]) -> dict[str, float]:
    wanted = ("tarry_store_group_commits_total", 'tarry_store_fsyncs_total{what="wal"}')
    return {name: samples[name] for name in wanted if name in samples}


def run_tarry(
    args: argparse.Namespace,
    src: Path | None,
    tmp: Path,
    *,
    in_database: bool = False,
) -> dict[str, Any]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    if in_database:
        env["TARRY_STORE__QUEUES_IN_MEMORY"] = "false"
    proc, url = start_server(tmp, args.store, env=env)
    try:
        httpx.put(f"{url}/v1/queues/{QUEUE}", json={}).raise_for_status()
        cpu_before, threads_before = cpu_s(proc.pid), _thread_cpu(_metrics(url))
        consumer = _role("consume-tarry", args, url)
        producer = _role("produce-tarry", args, url)
        produced = _result(producer)
        consumed = _result(consumer)
        cpu_seconds = cpu_s(proc.pid) - cpu_before
        after = _metrics(url)
        threads_after, writes = _thread_cpu(after), _store_counters(after)
    finally:
        proc.terminate()
        proc.wait()
    result = _summary(produced, consumed, args.messages, cpu_seconds)
    # Which threads the CPU went to (servers that export it): the event loop's share is what
    # one core caps; the rest ran beside it only while outside the GIL.
    if threads_after:
        result["server_cpu_us_per_message_by_thread"] = {
            name: round((value - threads_before.get(name, 0.0)) / args.messages * 1e6, 1)
            for name, value in sorted(threads_after.items(), key=lambda item: -item[1])
        }
    # The log store's group commits (each a hand-off to its writer thread) and WAL fsyncs over
    # the run (a fresh server: from its start), when ``/metrics`` has them.
    result["store_write_path"] = writes
    # The server's own release lateness (due time to the queue), from its journal: what the
    # consumer sees beyond it is the hand-over and the HTTP round trip.
    result["server_released"] = journal_lateness(tmp, "released")
    # A closed-loop consumer: few messages a receive say it kept up, hundreds that it fell behind.
    result["messages_per_receive"] = round(consumed["received"] / max(consumed["receives"], 1), 1)
    return result


def _thread_cpu(samples: dict[str, float]) -> dict[str, float]:
    """``tarry_thread_cpu_seconds_total`` by thread (empty for a server that does not export
    it)."""
    prefix = 'tarry_thread_cpu_seconds_total{thread="'
    return {
        name[len(prefix) : -len('"}')]: value
        for name, value in samples.items()
        if name.startswith(prefix)
    }


def _redis_pid() -> int:
    import redis

    info: dict[str, Any] = redis.Redis().info("server")
    return int(info["process_id"])


def run_redis(args: argparse.Namespace) -> dict[str, Any]:
    import redis

    redis.Redis().delete(ZSET, READY)
    pid = _redis_pid()
    cpu_before = cpu_s(pid)
    consumer = _role("consume-redis", args)
    poller = _role("poll-redis", args)
    producer = _role("produce-redis", args)
    produced = _result(producer)
    consumed = _result(consumer)
    polled = _result(poller)
    cpu_seconds = cpu_s(pid) - cpu_before + polled["cpu_s"]
    redis.Redis().delete(ZSET, READY)
    result = _summary(produced, consumed, args.messages, cpu_seconds)
    result["durable"] = False
    return result


def run_floor(args: argparse.Namespace, tmp: Path, *, memory: bool) -> dict[str, Any]:
    """The same producer and consumer against ``ontime_floor.py``: the least a Python server on
    tarry's HTTP stack spends on this workload (``memory``: without its file and fsyncs)."""
    port = free_port()
    command = [sys.executable, str(Path(__file__).with_name("ontime_floor.py"))]
    command += ["--port", str(port), "--data", str(tmp), *(["--memory"] if memory else [])]
    server = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        url = f"http://127.0.0.1:{port}"
        cpu_before = cpu_s(server.pid)
        consumer = _role("consume-tarry", args, url)
        producer = _role("produce-tarry", args, url)
        produced = _result(producer)
        consumed = _result(consumer)
        cpu_seconds = cpu_s(server.pid) - cpu_before
    finally:
        server.terminate()
        server.wait()
    result = _summary(produced, consumed, args.messages, cpu_seconds)
    result["durable"] = not memory
    result["messages_per_receive"] = round(consumed["received"] / max(consumed["receives"], 1), 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--min-delay-ms", type=int, default=1000)
    parser.add_argument("--max-delay-ms", type=int, default=10_000)
    parser.add_argument("--store", default="log")
    parser.add_argument("--baseline-src", type=Path, help="another tarry source tree's src/")
    parser.add_argument(
        "--only",
        default="redis,tarry,baseline",
        help="parts, comma-separated: redis, tarry, baseline (with --baseline-src), "
        "in-database, floor, floor-memory",
    )
    parser.add_argument("--deadline-s", type=float, default=300.0)
    parser.add_argument(
        "--ids",
        action="store_true",
        help="each tarry message sent with a message_id of its own (an idempotent producer's)",
    )
    parser.add_argument(
        "--correlation-ids",
        action="store_true",
        help="each tarry message sent with a correlation_id (a saga's, ten messages a saga)",
    )
    parser.add_argument(
        "--ack-on-receive",
        action="store_true",
        help="the tarry consumer acks each batch with its next receive (receive's ack field; "
        "a tree that has it, baseline included), not with an ack request of its own",
    )
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        print(json.dumps(ROLES[args.role](args)))
        return
    parts = set(args.only.split(","))
    workload = {k: v for k, v in vars(args).items() if k not in ("role", "url", "only")}
    results: dict[str, Any] = {"workload": workload | {"baseline_src": str(args.baseline_src)}}
    with tempfile.TemporaryDirectory() as tmp:
        if "redis" in parts:
            print("redis sorted set ...", file=sys.stderr)
            results["redis"] = run_redis(args)
        if "tarry" in parts:
            print("tarry ...", file=sys.stderr)
            results["tarry"] = run_tarry(args, None, Path(tmp) / "tarry")
        if "baseline" in parts and args.baseline_src:
            print("tarry baseline ...", file=sys.stderr)
            results["baseline"] = run_tarry(args, args.baseline_src, Path(tmp) / "baseline")
        if "in-database" in parts:
            print("tarry, local queues in the queue database ...", file=sys.stderr)
            results["in_database"] = run_tarry(
                args, None, Path(tmp) / "in-database", in_database=True
            )
        if "floor" in parts:
            print("python floor (ontime_floor.py) ...", file=sys.stderr)
            results["floor"] = run_floor(args, Path(tmp) / "floor", memory=False)
        if "floor-memory" in parts:
            print("python floor, nothing on disk ...", file=sys.stderr)
            results["floor_memory"] = run_floor(args, Path(tmp) / "floor-memory", memory=True)
    for other in ("redis", "baseline", "in_database", "floor", "floor_memory"):
        if other in results and "tarry" in results:
            mine, theirs = results["tarry"], results[other]
            results[f"ratio_to_{other}"] = {
                "cpu_per_message": round(
                    mine["server_cpu_us_per_message"] / theirs["server_cpu_us_per_message"], 2
                ),
                "lateness_p99": round(mine["lateness_ms_p99"] / theirs["lateness_ms_p99"], 2),
            }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
