"""Webhook delivery (issue 25) against a real `tarry serve` and a real local receiver; prints JSON.

    .venv/bin/python bench/webhooks.py [--only delivery] [--count 20000] [--quick]
        [--baseline-src /work/main/src]

``delivery``: messages for 1, 10 and 100 HTTP routes (declared in ``tarry.toml``, each to its own
path on one receiver) are scheduled over HTTP batches, then delivered by tarry's dispatcher.
Two workloads per route count:

- ``burst``: ``--count`` messages all due at the same instant: throughput (messages/s from the
  due time to the last arrival) and lateness p50/p99/max at the receiver (arrival − the
  ``tarry-deliver-at`` header);
- ``steady``: ``--count`` messages due evenly over ``--seconds`` (an offered rate the machine
  should keep up with): delivered messages/s and lateness p50/p99/max.

Every HTTP route delivers through its own lane (``concurrency`` defaults to the connection
pool's 100). The 100-route run is repeated with ``concurrency = 8`` and a ``rate_per_s`` no
route reaches (both limits at work, neither binding). With ``--baseline-src DIR`` (another
source tree, e.g. main's ``src``) the 1/10/100-route runs are repeated with that tree's server
in the same session: ``ratio_to_baseline`` is this tree's msg/s over the baseline's.

``lanes``: the dispatcher alone, in this process (memory store, a transport that accepts at
once): due messages for 1, 10 and 100 routes delivered straight from the dispatcher (a route
with no lane) against the same through each route's lane (``concurrency = 100``, the HTTP
default), in the same run: the lanes' own cost per message, without the receiver's noise.
(The memory store skips held-back messages one by one on each fetch, so a single route's
backlog, held back and fetched again, costs more here than with the log store.)

The receiver is a separate process (uvicorn, a bare ASGI app answering 204), so it does not share
a core's GIL with the load generator. Lost and duplicate deliveries are counted (must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from foundation import loop_sleep_cpu_us, percentile, start_server  # noqa: E402


# --- the receiver (its own process) ---------------------------------------------------------------
def receiver_main(port_file: str) -> None:
    """A bare ASGI webhook receiver: records (tarry-id, deliver_at, arrival ms) per POST and
    answers 204; ``GET /stats`` returns them and clears the record."""
    import socket

    import uvicorn

    records: list[tuple[str, int, float]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                event = await receive()
                if event["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif event["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        at = time.time() * 1000
        more = True
        while more:
            event = await receive()
            more = event.get("more_body", False)
        if scope["method"] == "GET":
            body = json.dumps(records).encode()
            records.clear()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        headers = dict(scope["headers"])
        records.append((headers[b"tarry-id"].decode(), int(headers[b"tarry-deliver-at"]), at))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    Path(port_file).write_text(str(sock.getsockname()[1]))
    config = uvicorn.Config(app, log_level="warning", access_log=False, backlog=4096)
    uvicorn.Server(config).run(sockets=[sock])


def start_receiver(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp / "receiver.port"
    proc = subprocess.Popen(
        [sys.executable, __file__, "--receiver", str(port_file)], stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 20
    while not port_file.exists() or not port_file.read_text():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the receiver did not start")
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port_file.read_text()}"
    while True:  # listening once it answers
        try:
            httpx.get(f"{url}/stats", timeout=1)
            return proc, url
        except httpx.TransportError:
            time.sleep(0.05)


# --- delivery ----------------------------------------------------------------------------------
def routes_toml(receiver: str, routes: int, policy: dict[str, Any]) -> str:
    out = []
    for i in range(routes):
        out += [f"[routes.r{i}]", 'transport = "http"', f'url = "{receiver}/r{i}"']
        out += [f"{key} = {json.dumps(value)}" for key, value in policy.items()]
    return "\n".join(out) + "\n"


async def schedule(url: str, routes: int, due: list[int]) -> float:
    """Send ``due`` (one message each, round-robin over the routes) in batches of 1,000;
    returns the seconds it took."""
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=60) as client:
        for first in range(0, len(due), 1_000):
            batch = [
                {"destination": f"r{i % routes}", "body": "x", "deliver_at": at}
                for i, at in enumerate(due[first : first + 1_000], start=first)
            ]
            response = await client.post(f"{url}/v1/messages/batch", json={"messages": batch})
            response.raise_for_status()
    return time.perf_counter() - started


def collect(receiver: str, expected: int, *, stall_s: float = 15.0) -> list[tuple[str, int, float]]:
    """What the receiver got, until ``expected`` arrived or nothing came for ``stall_s``."""
    got: list[tuple[str, int, float]] = []
    last_progress = time.monotonic()
    while time.monotonic() - last_progress < stall_s:
        more = httpx.get(f"{receiver}/stats", timeout=30).json()
        if more:
            got += more
            last_progress = time.monotonic()
        if len(got) >= expected:
            time.sleep(0.3)  # late duplicates
            got += httpx.get(f"{receiver}/stats", timeout=30).json()
            break
        time.sleep(0.2)
    return got


def figures(got: list[tuple[str, int, float]], expected: int, first_due: int) -> dict[str, Any]:
    ids = [g[0] for g in got]
    lateness = [at - due for _, due, at in got]
    last = max((at for _, _, at in got), default=float("nan"))
    span_s = max(1e-3, (last - first_due) / 1000)
    return {
        "delivered": len(set(ids)),
        "lost": expected - len(set(ids)),
        "duplicates": len(ids) - len(set(ids)),
        "messages_per_s": round(len(set(ids)) / span_s, 1),
        "lateness_ms": {
            "p50": round(percentile(lateness, 50), 1),
            "p99": round(percentile(lateness, 99), 1),
            "max": round(max(lateness), 1) if lateness else None,
        },
        "early": sum(1 for v in lateness if v < 0),
    }


def one_run(
    tmp: Path,
    receiver: str,
    *,
    routes: int,
    count: int,
    seconds: float,
    policy: dict[str, Any],
    src: str | None = None,
) -> dict[str, Any]:
    name = f"r{routes}-{time.monotonic_ns()}"
    config = tmp / f"{name}.toml"
    config.write_text(routes_toml(receiver, routes, policy))
    env = {**os.environ, "PYTHONPATH": src} if src else None
    proc, url = start_server(tmp / name, "log", ["--config", str(config)], env=env)
    try:
        out: dict[str, Any] = {"routes": routes, "policy": policy}
        # burst: everything due at one instant, 2 s ahead (scheduling finishes first)
        due_at = int(time.time() * 1000) + 2_000 + count // 20
        took = asyncio.run(schedule(url, routes, [due_at] * count))
        out["burst"] = {
            "schedule_s": round(took, 2),
            **figures(collect(receiver, count), count, due_at),
        }
        # steady: due evenly over ``seconds``, starting 2 s ahead
        start = int(time.time() * 1000) + 2_000 + count // 20
        due = [start + int(i * seconds * 1000 / count) for i in range(count)]
        asyncio.run(schedule(url, routes, due))
        out["steady"] = {
            "offered_per_s": round(count / seconds, 1),
            **figures(collect(receiver, count), count, start),
        }
        return out
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def delivery(tmp: Path, *, count: int, seconds: float, baseline_src: str | None) -> dict[str, Any]:
    """Throughput and lateness with 1, 10 and 100 routes (and the baseline tree's), and 100
    routes with a concurrency cap and a rate limit."""
    receiver_proc, receiver = start_receiver(tmp)
    try:
        runs: dict[str, Any] = {}
        for n in (1, 10, 100):
            runs[f"routes_{n}"] = mine = one_run(
                tmp, receiver, routes=n, count=count, seconds=seconds, policy={}
            )
            if baseline_src:
                runs[f"baseline_routes_{n}"] = base = one_run(
                    tmp,
                    receiver,
                    routes=n,
                    count=count,
                    seconds=seconds,
                    policy={},
                    src=baseline_src,
                )
                runs[f"ratio_to_baseline_routes_{n}"] = {
                    part: round(
                        mine[part]["messages_per_s"] / max(base[part]["messages_per_s"], 0.1), 2
                    )
                    for part in ("burst", "steady")
                }
        runs["routes_100_capped"] = one_run(
            tmp,
            receiver,
            routes=100,
            count=count,
            seconds=seconds,
            policy={"concurrency": 8, "rate_per_s": 100_000},
        )
        return runs
    finally:
        stop(receiver_proc)


class _Accepting:
    """A transport that accepts every message after yielding once (a send on a socket)."""

    def __init__(self) -> None:
        self.delivered = 0

    async def deliver(self, message: Any) -> None:
        await asyncio.sleep(0)
        self.delivered += 1

    async def close(self) -> None:
        return None


async def _through_dispatcher(count: int, routes: int, lanes: bool) -> float:
    from tarry.config import DispatchConfig
    from tarry.dispatch.breaker import Breakers
    from tarry.dispatch.dispatcher import Dispatcher
    from tarry.model.ids import IdGenerator
    from tarry.model.message import Message
    from tarry.model.route_policy import RoutePolicy
    from tarry.model.time import SystemClock
    from tarry.store.memory import MemoryStore

    clock, store, config = SystemClock(), MemoryStore(), DispatchConfig()
    transport, ids = _Accepting(), IdGenerator()
    policy = RoutePolicy(concurrency=100) if lanes else None

    async def no_local(batch: Any) -> list[Any]:
        return []

    async def give_up(message: Any, error: Any) -> None:
        raise AssertionError(f"{message.id} failed: {error}")

    dispatcher = Dispatcher(
        store=store,
        config=config,
        clock=clock,
        breakers=Breakers.from_config(config, clock),
        is_local=lambda name: False,
        transport_for=lambda name: transport,
        release_local=no_local,
        give_up=give_up,
        notify=lambda events: None,
        policy_for=lambda name: policy,
    )
    now = clock.now_ms()
    await store.store(
        [
            Message(
                id=ids.new(now),
                destination=f"r{i % routes}",
                body=b"x",
                headers={},
                sent_at_ms=now,
                deliver_at_ms=now,
                expires_at_ms=None,
                updated_at_ms=now,
            )
            for i in range(count)
        ]
    )
    started = time.perf_counter()
    while transport.delivered < count:
        if not await dispatcher.run_once():
            await asyncio.sleep(0.001)
    await dispatcher.drain()
    return count / (time.perf_counter() - started)


def lanes_part(*, count: int) -> dict[str, Any]:
    """Messages/s through the dispatcher with and without lanes, alternating, best of 3."""
    out: dict[str, Any] = {}
    for routes in (1, 10, 100):
        direct = max(asyncio.run(_through_dispatcher(count, routes, False)) for _ in range(3))
        laned = max(asyncio.run(_through_dispatcher(count, routes, True)) for _ in range(3))
        out[f"routes_{routes}"] = {
            "direct_messages_per_s": round(direct),
            "lanes_messages_per_s": round(laned),
            "ratio_lanes_to_direct": round(laned / direct, 2),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["delivery", "lanes"], default=None)
    parser.add_argument("--count", type=int, default=20_000, help="messages per workload")
    parser.add_argument("--seconds", type=float, default=10.0, help="steady workload's span")
    parser.add_argument("--quick", action="store_true", help="1,000 messages over 2 s")
    parser.add_argument("--baseline-src", help="another tree's src, run in the same session")
    parser.add_argument("--receiver", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receiver:
        receiver_main(args.receiver)
        return
    count, seconds = (1_000, 2.0) if args.quick else (args.count, args.seconds)
    result: dict[str, Any] = {
        "loop_sleep_cpu_us": loop_sleep_cpu_us(),
        "load_average": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        if args.only in (None, "delivery"):
            result["delivery"] = delivery(
                tmp, count=count, seconds=seconds, baseline_src=args.baseline_src
            )
        if args.only in (None, "lanes"):
            result["lanes"] = lanes_part(count=count * 2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
