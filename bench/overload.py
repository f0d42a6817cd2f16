"""Overload: a producer twice as fast as the server delivers; prints JSON.

    .venv/bin/python bench/overload.py [--seconds 20] [--threshold-ms 1000] [--producers 3]
                                       [--baseline-src DIR] [--rate MSG_PER_S]

Two phases, each on a fresh `tarry serve` (its own data directory), over HTTP: producers
send batches to ``POST /v1/messages/batch`` due 0 to ``--delay-max-ms`` later; one consumer
process long-polls ``receive`` for up to 1,000 and acks each batch:

1. ``capacity``: one producer sends as fast as it is answered with the refusal off
   (``overload_lag_ms = 0``); what the consumer receives per second is what the server
   delivers while it also takes sends.
2. ``overload``: ``--producers`` (3) processes offer ``--factor`` (2) times that rate between
   them with the refusal on (``overload_lag_ms = --threshold-ms``). They do not slow down when
   refused (no honouring of ``Retry-After``): the pressure stays on.

``--rate`` offers that many messages a second in the overload phase instead, and skips the
capacity phase (on a busy machine the capacity phase's figure swings from run to run).

``--operator-s N`` has an operator watch each overload phase: every N seconds, what a
Prometheus scrape and the console read (``/metrics``, ``GET /v1/queues``, ``/v1/dead-letters``).

With ``--baseline-src`` (another source tree's ``src/``, e.g. main's) the overload phase runs
for that tree's server too, first, at the same offered rate (``baseline_overload``).

Reports per phase: offered, accepted and refused messages (a refused request must be ``429
overloaded`` with a ``Retry-After``; in a batch answered ``200``, a result whose error is
``overloaded`` with ``retry_after_s`` counts as refused too: the send's queue was behind with
its consumers), delivered, lateness at the consumer (receive − ``deliver_at``,
ms) p50 / p99 / max of the accepted, early, lost (accepted, never delivered within ``--drain-s``
after the producer stopped) and duplicates. Goals (issue 23), overload phase: accepted p99 below
the threshold, early = lost = 0, and some sends refused.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from foundation import cpu_s, percentile, start_server  # noqa: E402

QUEUE = "bench.overload"


def produce(url: str, rate: float, seconds: float, batch: int, delay_max_ms: int, out: Any) -> None:
    """Offer ``rate`` msg/s (0: as fast as the server answers) for ``seconds``; puts
    ``{"accepted": [...ids], "refused": n, "retry_after": [...], "bad": [...]}`` on ``out``."""
    accepted: list[str] = []
    refused = 0
    retry_after: list[int] = []
    bad: list[str] = []
    offered = 0
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=url, timeout=60) as client:
        started = time.monotonic()
        next_at = started
        while time.monotonic() - started < seconds:
            body = orjson.dumps(
                {
                    "messages": [
                        {
                            "destination": QUEUE,
                            "body": "x" * 100,
                            "delay_ms": random.randint(0, delay_max_ms),
                        }
                        for _ in range(batch)
                    ]
                }
            )
            response = client.post("/v1/messages/batch", content=body, headers=headers)
            offered += batch
            if response.status_code == 429:
                error = response.json()["error"]
                if error["code"] != "overloaded" or "retry-after" not in response.headers:
                    bad.append(response.text[:200])
                refused += batch
                retry_after.append(int(response.headers.get("retry-after", "0")))
            elif response.status_code == 200:
                for result in response.json()["results"]:
                    error = result.get("error")
                    if "id" in result:
                        accepted.append(result["id"])
                    elif error and error["code"] == "overloaded" and "retry_after_s" in error:
                        refused += 1
                        retry_after.append(int(error["retry_after_s"]))
                    else:
                        bad.append(json.dumps(result)[:200])
            else:
                bad.append(f"{response.status_code} {response.text[:200]}")
            if rate:
                next_at += batch / rate
                pause = next_at - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
        elapsed = time.monotonic() - started
    out.put(
        {
            "offered": offered,
            "seconds": elapsed,
            "accepted": accepted,
            "refused": refused,
            "retry_after": retry_after,
            "bad": bad,
        }
    )


def consume(url: str, until: Any, out: Any) -> None:
    """Receive (long-poll, up to 1,000) and ack until ``until`` is set and a receive comes back
    empty; puts ``[(id, deliver_at, received_ms), ...]`` on ``out``."""
    got: list[tuple[str, int, int]] = []
    with httpx.Client(base_url=url, timeout=120) as client:
        while True:
            response = client.post(
                f"/v1/queues/{QUEUE}/receive", json={"max": 1000, "wait_ms": 500}
            )
            now = int(time.time() * 1000)
            response.raise_for_status()
            messages = response.json()["messages"]
            if not messages and until.is_set():
                break
            got += [(m["id"], m["deliver_at"], now) for m in messages]
            if messages:
                receipts = [m["receipt"] for m in messages]
                client.post(
                    f"/v1/queues/{QUEUE}/ack", json={"receipts": receipts}
                ).raise_for_status()
    out.put(got)


def watch(url: str, every_s: float, stop: threading.Event) -> int:
    """An operator's reads every ``every_s`` until ``stop``; returns how many rounds."""
    rounds = 0
    with httpx.Client(base_url=url, timeout=60) as client:
        while not stop.wait(every_s):
            for path in ("/metrics", "/v1/queues", "/v1/dead-letters"):
                client.get(path).raise_for_status()
            rounds += 1
    return rounds


def phase(
    store: str,
    threshold_ms: int,
    rate: float,
    args: argparse.Namespace,
    root: Path,
    *,
    producers: int,
    seconds: float,
    src: Path | None = None,
) -> dict[str, Any]:
    name = f"{threshold_ms}-{int(rate)}-{'baseline' if src else 'this'}"
    ctx = mp.get_context("spawn")
    received: Any = ctx.Queue()
    results: Any = ctx.Queue()
    done = ctx.Event()
    config = root / f"tarry-{name}.toml"
    config.write_text(f"[dispatch]\noverload_lag_ms = {threshold_ms}\n")
    env = {**os.environ, "PYTHONPATH": str(src)} if src else None
    proc, url = start_server(root / f"data-{name}", store, ["--config", str(config)], env=env)
    try:
        httpx.put(f"{url}/v1/queues/{QUEUE}", json={}).raise_for_status()
        consumer = ctx.Process(target=consume, args=(url, done, received))
        consumer.start()
        server_cpu = cpu_s(proc.pid)
        producers = [
            ctx.Process(
                target=produce,
                args=(url, rate / producers, seconds, args.batch, args.delay_max_ms, results),
            )
            for _ in range(producers)
        ]
        for producer in producers:
            producer.start()
        stop_watching = threading.Event()
        watched: list[int] = []
        watcher = threading.Thread(
            target=lambda: watched.append(watch(url, args.operator_s, stop_watching))
        )
        if args.operator_s and threshold_ms:
            watcher.start()
        parts = [results.get() for _ in producers]
        if watcher.is_alive():
            stop_watching.set()
            watcher.join()
        for producer in producers:
            producer.join()
        server_cpu = cpu_s(proc.pid) - server_cpu
        sent = {
            "offered": sum(p["offered"] for p in parts),
            "seconds": max(p["seconds"] for p in parts),
            "accepted": [i for p in parts for i in p["accepted"]],
            "refused": sum(p["refused"] for p in parts),
            "retry_after": [r for p in parts for r in p["retry_after"]],
            "bad": [b for p in parts for b in p["bad"]],
        }
        # Let what was accepted fall due and be received, then stop the consumer.
        accepted = set(sent["accepted"])
        deadline = time.monotonic() + args.drain_s + args.delay_max_ms / 1000
        while time.monotonic() < deadline:
            stats = httpx.get(f"{url}/v1/queues/{QUEUE}", timeout=60).json()
            if stats["scheduled"] == 0 and stats["ready"] == 0 and stats["in_flight"] == 0:
                break
            time.sleep(0.2)
        metrics = httpx.get(f"{url}/metrics", timeout=60).text
        done.set()
        got = received.get()
        consumer.join()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    ids = [g[0] for g in got]
    late = [r - d for i, d, r in got if i in accepted]
    first_due = min((d for _, d, _ in got), default=0)
    last_received = max((r for _, _, r in got), default=0)
    span_s = max((last_received - first_due) / 1000, 1e-9)
    return {
        "threshold_ms": threshold_ms,
        "offered_rate_per_s": round(rate) if rate else "as fast as answered",
        "seconds": round(sent["seconds"], 2),
        "offered": sent["offered"],
        "accepted": len(accepted),
        "refused": sent["refused"],
        "refused_share": round(sent["refused"] / max(sent["offered"], 1), 3),
        "retry_after_s": sorted(set(sent["retry_after"])),
        "bad_answers": sent["bad"][:5],
        "delivered": len(ids),
        "delivered_per_s": round(len(ids) / span_s),
        "accepted_per_s": round(len(accepted) / sent["seconds"]),
        "lateness_ms_p50": percentile(late, 50),
        "lateness_ms_p99": percentile(late, 99),
        "lateness_ms_max": max(late, default=None),
        "early": sum(1 for x in late if x < 0),
        "lost": len(accepted - set(ids)),
        "duplicates": len(ids) - len(set(ids)),
        "server_cpu_s": round(server_cpu, 2),
        "operator_reads": watched[0] if watched else 0,
        "server_release_lag_gauge_at_end_s": _gauge(metrics, "tarry_release_lag_seconds"),
        "server_delivery_lag_gauge_at_end_s": _gauge(metrics, "tarry_delivery_lag_seconds"),
    }


def _gauge(metrics: str, name: str) -> float | None:
    """An unlabelled gauge's value in a Prometheus text body (None: not exported)."""
    return next(
        (float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(f"{name} ")),
        None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="log")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threshold-ms", type=int, default=1000)
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--delay-max-ms", type=int, default=1000)
    parser.add_argument("--drain-s", type=float, default=60.0)
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument("--baseline-src", type=Path, help="another tarry source tree's src/")
    parser.add_argument("--rate", type=float, help="msg/s offered in overload (no capacity phase)")
    parser.add_argument(
        "--operator-s", type=float, default=0.0, help="an operator's reads every N s (0: none)"
    )
    args = parser.parse_args()
    baseline: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="tarry-overload-") as tmp:
        root = Path(tmp)
        capacity: dict[str, Any] | None = None
        if args.rate:
            rate = args.rate
        else:
            print("capacity phase ...", file=sys.stderr)
            capacity = phase(args.store, 0, 0, args, root, producers=1, seconds=args.seconds)
            rate = capacity["delivered_per_s"] * args.factor
        overload_phase = {"producers": args.producers, "seconds": args.seconds}
        if args.baseline_src:
            print(f"baseline overload phase at {rate:.0f} msg/s ...", file=sys.stderr)
            baseline = phase(
                args.store,
                args.threshold_ms,
                rate,
                args,
                root,
                src=args.baseline_src.resolve(),
                **overload_phase,
            )
        print(f"overload phase at {rate:.0f} msg/s ...", file=sys.stderr)
        overload = phase(
            args.store,
            args.threshold_ms,
            rate,
            args,
            root,
            **overload_phase,
        )
    p99 = overload["lateness_ms_p99"]
    print(
        json.dumps(
            {
                "bench": "overload",
                "store": args.store,
                "producers_in_overload": args.producers,
                "load_average": os.getloadavg()[0],
                "capacity": capacity,
                "overload": overload,
                "baseline_overload": baseline,
                "goals": {
                    "accepted_p99_below_threshold": p99 == p99 and p99 < args.threshold_ms,
                    "some_refused": overload["refused"] > 0,
                    "nothing_accepted_lost": overload["lost"] == 0,
                    "none_early": overload["early"] == 0,
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
