"""The event loop's CPU a message for the release and for a consumer's receive + ack over HTTP,
at a fixed request pattern (issue 23); prints JSON.

    .venv/bin/python bench/consumer_loop.py [--messages 20000] [--receive 40] [--rounds 2]
        [--baseline-src DIR]

``ontime.py`` measures the whole life, but how many messages a receive takes there follows how
busy the machine is (a consumer that falls behind takes hundreds a call, one that keeps up a
few dozen), and with it what HTTP costs a message. Here the pattern is fixed: ``--messages``
messages of 100 bytes are sent in batches of 1,000, due 1.5 s later, released by the
dispatcher (``release``: the server's event loop thread's CPU over those seconds), then one
consumer receives ``--receive`` at a time and acks each batch (``consume``). Figures are the
``MainThread``'s CPU µs a message (``/proc``, 10 ms ticks). With ``--baseline-src`` the same
runs for another source tree, the two trees alternating; medians over ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from foundation import start_server, thread_cpu_s  # noqa: E402

QUEUE = "bench.consumer"


def _loop_cpu_s(pid: int) -> float:
    return thread_cpu_s(pid)[pid]  # the main thread's id is the process's


def _one(src: Path | None, messages: int, receive: int) -> dict[str, Any]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    with tempfile.TemporaryDirectory(prefix="tarry-consumer-loop-") as tmp:
        proc, url = start_server(Path(tmp), "log", env=env)
        try:
            client = httpx.Client(base_url=url, timeout=60)
            client.put(f"/v1/queues/{QUEUE}", json={}).raise_for_status()
            batch = [{"destination": QUEUE, "body": "x" * 100, "delay_ms": 1500}] * 1000
            body = orjson.dumps({"messages": batch})
            for _ in range(messages // 1000):
                client.post(
                    "/v1/messages/batch",
                    content=body,
                    headers={"content-type": "application/json"},
                ).raise_for_status()
            time.sleep(1.0)
            before = _loop_cpu_s(proc.pid)
            time.sleep(3.0)  # every message falls due and is released meanwhile
            release = _loop_cpu_s(proc.pid) - before
            before, taken, calls = _loop_cpu_s(proc.pid), 0, 0
            while taken < messages:
                response = client.post(f"/v1/queues/{QUEUE}/receive", json={"max": receive})
                got = orjson.loads(response.content)["messages"]
                calls += 1
                if not got:
                    break
                client.post(
                    f"/v1/queues/{QUEUE}/ack", json={"receipts": [m["receipt"] for m in got]}
                ).raise_for_status()
                taken += len(got)
            consume = _loop_cpu_s(proc.pid) - before
        finally:
            proc.terminate()
            proc.wait()
    return {
        "release_loop_us_per_message": round(release / messages * 1e6, 2),
        "consume_loop_us_per_message": round(consume / max(taken, 1) * 1e6, 2),
        "received": taken,
        "receive_calls": calls,
    }


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("release_loop_us_per_message", "consume_loop_us_per_message")
    return {key: statistics.median(run[key] for run in runs) for key in keys} | {"runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--receive", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline-src", type=Path, help="another tarry source tree's src/")
    args = parser.parse_args()
    trees: list[tuple[str, Path | None]] = [("tarry", None)]
    if args.baseline_src:
        trees.append(("baseline", args.baseline_src))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
    for round_ in range(args.rounds):
        for name, src in trees if round_ % 2 == 0 else trees[::-1]:
            runs[name].append(_one(src, args.messages, args.receive))
    result: dict[str, Any] = {"messages": args.messages, "receive_max": args.receive}
    result |= {name: _medians(found) for name, found in runs.items()}
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
