"""The HTTP stack under `tarry serve`: asyncio + h11 (pure Python) against uvloop + httptools
(uvicorn's ``standard`` extra, ``tarry[fast]``), in the same run; prints JSON.

    .venv/bin/python bench/http_stack.py [--messages 50000] [--rounds 3] [--baseline-src DIR]

Each round starts a fresh server per stack (``TARRY_SERVER__EVENT_LOOP`` and
``TARRY_SERVER__HTTP_PARSER``), stacks alternating, and sends ``--messages`` in HTTP batches of
1,000 (due in an hour: the send path only), 2 requests in flight, then ``--single``
one-message requests, 4 in flight; reports the rates and the server's CPU per message and per
request, each stack's median over the rounds, and their ratios. ``--baseline-src``: another
tarry source tree's ``src`` (e.g. a worktree of main before a change) runs each round too, on
uvloop + httptools, and the ratios of this tree to it are reported.
"""

from __future__ import annotations

import argparse
import asyncio
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
from foundation import batch_schedule, cpu_s, start_server  # noqa: E402

STACKS = {"asyncio+h11": ("asyncio", "h11"), "uvloop+httptools": ("uvloop", "httptools")}


async def singles(url: str, count: int, concurrency: int, server_pid: int) -> dict[str, Any]:
    """``count`` one-message sends (``POST /v1/messages``), ``concurrency`` in flight: where
    the per-request cost of the loop and the parser shows."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        body = orjson.dumps({"destination": "bench.batch", "body": "x", "delay_ms": 3_600_000})
        headers = {"content-type": "application/json"}
        left = count

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                response = await client.post("/v1/messages", content=body, headers=headers)
                response.raise_for_status()

        server = cpu_s(server_pid)
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        server = cpu_s(server_pid) - server
    return {
        "requests": count,
        "requests_per_s": round(count / elapsed),
        "server_cpu_us_per_request": round(server / count * 1e6, 1),
    }


#: The ``--baseline-src`` tree's runs, on the fast stack.
BASELINE = "baseline (uvloop+httptools)"


def one(
    stack: str, messages: int, root: Path, single: int, src: Path | None = None
) -> dict[str, Any]:
    loop, parser = STACKS[stack]
    env = {**os.environ, "TARRY_SERVER__EVENT_LOOP": loop, "TARRY_SERVER__HTTP_PARSER": parser}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    data = Path(tempfile.mkdtemp(dir=root))
    proc, url = start_server(data, "log", env=env)
    try:
        figures = asyncio.run(batch_schedule(url, messages, 1000, 2, server_pid=proc.pid))
        figures["single"] = asyncio.run(singles(url, single, 4, proc.pid))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    figures["server_cpu_us_per_message"] = round(figures["server_cpu_s"] / messages * 1e6, 1)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--single", type=int, default=5_000)
    parser.add_argument("--baseline-src", type=Path, help="another tarry source tree's src/")
    args = parser.parse_args()
    names = [*STACKS, *([BASELINE] if args.baseline_src else [])]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="tarry-http-stack-") as tmp:
        for number in range(args.rounds):
            for name in names if number % 2 == 0 else reversed(names):
                print(f"round {number + 1}: {name}", file=sys.stderr)
                if name == BASELINE:
                    run = one(
                        "uvloop+httptools", args.messages, Path(tmp), args.single, args.baseline_src
                    )
                else:
                    run = one(name, args.messages, Path(tmp), args.single)
                runs[name].append(run)
    medians = {
        stack: {
            "messages_per_s": statistics.median(r["messages_per_s"] for r in got),
            "server_cpu_us_per_message": statistics.median(
                r["server_cpu_us_per_message"] for r in got
            ),
            "single_requests_per_s": statistics.median(r["single"]["requests_per_s"] for r in got),
            "single_server_cpu_us_per_request": statistics.median(
                r["single"]["server_cpu_us_per_request"] for r in got
            ),
        }
        for stack, got in runs.items()
    }
    slow, fast = medians["asyncio+h11"], medians["uvloop+httptools"]
    ratios = {"ratio_fast_to_plain": _ratios(fast, slow)}
    if BASELINE in medians:
        ratios["ratio_to_baseline"] = _ratios(fast, medians[BASELINE])
    print(
        json.dumps(
            {
                "bench": "http_stack",
                "messages": args.messages,
                "rounds": args.rounds,
                "load_average": os.getloadavg()[0],
                "runs": runs,
                "medians": medians,
                **ratios,
            },
            indent=2,
        )
    )


def _ratios(mine: dict[str, float], theirs: dict[str, float]) -> dict[str, float]:
    return {name: round(value / theirs[name], 2) for name, value in mine.items()}


if __name__ == "__main__":
    main()
