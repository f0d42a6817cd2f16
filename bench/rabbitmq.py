"""RabbitMQ side by side, on the real broker at 127.0.0.1:5672; prints JSON.

    .venv/bin/python bench/rabbitmq.py [--count 20000] [--quick]

The same workload (``--count`` messages, delays uniform 1-10 s, one consumer on a RabbitMQ
queue) through

- ``native``: the 28-level delay topology (quorum levels): published with confirms into the
  broker, which does the waiting (delays rounded up to whole seconds, as NServiceBus does);
- ``tarry_store``: a real ``tarry serve`` holding the messages in its store, scheduled over
  HTTP batches, published with confirms to a RabbitMQ route when due.

Each reports: schedule rate (messages/s accepted, confirmed or stored durably), lateness
p50/p99/max (ms after the requested due time, at the consumer), early deliveries (must be 0)
and lost (must be 0). ``ratio`` gives tarry_store / native for each figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aio_pika
import httpx

from tarry.model.topology import QueueType, Topology
from tarry.transports.rabbitmq import AmqpLink
from tarry.transports.rabbitmq_topology import NativeDelaySender, delete_topology

sys.path.insert(0, str(Path(__file__).resolve().parent))
from foundation import percentile, start_server  # noqa: E402 - the sibling benchmark's helpers

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"


def now_ms() -> float:
    return time.time() * 1000


class Collector:
    """Consumes the landing queue and records when each message arrived."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.arrived: dict[int, float] = {}
        self.duplicates = 0
        self.done = asyncio.Event()

    async def on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        at = now_ms()
        index = int(message.body.split(b":", 1)[0])
        if index in self.arrived:
            self.duplicates += 1
        else:
            self.arrived[index] = at
        if len(self.arrived) >= self.expected:
            self.done.set()


def summarize(
    name: str, due: dict[int, float], collector: Collector, schedule_s: float
) -> dict[str, Any]:
    lateness = [collector.arrived[i] - due[i] for i in collector.arrived]
    return {
        "path": name,
        "messages": len(due),
        "schedule_rate_per_s": round(len(due) / schedule_s, 1),
        "lateness_ms": {
            "p50": round(percentile(lateness, 50), 1),
            "p99": round(percentile(lateness, 99), 1),
            "max": round(max(lateness), 1) if lateness else None,
        },
        "early": sum(1 for x in lateness if x < 0),
        "lost": len(due) - len(collector.arrived),
        "duplicates": collector.duplicates,
    }


async def consume(connection: aio_pika.abc.AbstractConnection, queue: str, collector: Collector):
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=2000)
    declared = await channel.declare_queue(queue, durable=True)
    tag = await declared.consume(collector.on_message, no_ack=True)
    return channel, declared, tag


async def run_native(count: int, delays: list[int]) -> dict[str, Any]:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    topology = Topology(prefix=prefix)
    queue = f"{prefix}.native"
    connection = await aio_pika.connect(AMQP_URL)
    collector = Collector(count)
    channel, declared, tag = await consume(connection, queue, collector)
    link = AmqpLink(AMQP_URL, timeout_ms=60_000, name="bench native")
    sender = NativeDelaySender(link, topology, queue_type=QueueType.QUORUM)
    await sender.send(queue, aio_pika.Message(b"-1:0"), delay_ms=0)  # declare + bind once
    await asyncio.sleep(0.5)
    collector.arrived.clear()
    due: dict[int, float] = {}

    async def one(index: int) -> None:
        due[index] = now_ms() + delays[index]
        await sender.send(
            queue,
            aio_pika.Message(f"{index}:".encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            delay_ms=delays[index],
        )

    started = time.monotonic()
    for start in range(0, count, 500):
        await asyncio.gather(*(one(i) for i in range(start, min(count, start + 500))))
    schedule_s = time.monotonic() - started
    try:
        await asyncio.wait_for(collector.done.wait(), max(delays) / 1000 + 60)
    except TimeoutError:
        pass
    result = summarize("native", due, collector, schedule_s)
    await declared.cancel(tag)
    await declared.delete(if_unused=False, if_empty=False)
    await delete_topology(channel, topology)
    await link.close()
    await connection.close()
    return result


async def run_store(count: int, delays: list[int]) -> dict[str, Any]:
    queue = f"bench-{uuid.uuid4().hex[:8]}.store"
    connection = await aio_pika.connect(AMQP_URL)
    collector = Collector(count)
    _, declared, tag = await consume(connection, queue, collector)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "tarry.toml"
        config.write_text(
            "[routes.bench]\n"
            'transport = "rabbitmq"\n'
            f'url = "{AMQP_URL}"\n'
            f'routing_key = "{queue}"\n'
            "[journal]\nenabled = false\n"
        )
        proc, url = start_server(Path(tmp) / "data", "sqlite", ["--config", str(config)])
        try:
            due: dict[int, float] = {}
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                batches = [list(range(s, min(count, s + 500))) for s in range(0, count, 500)]
                started = time.monotonic()

                async def post(batch: list[int]) -> None:
                    body = {
                        "messages": [
                            {"destination": "bench", "body": f"{i}:", "delay_ms": delays[i]}
                            for i in batch
                        ]
                    }
                    response = await client.post("/v1/messages/batch", json=body)
                    response.raise_for_status()
                    for i, result in zip(batch, response.json()["results"], strict=True):
                        due[i] = float(result["deliver_at"])

                for start in range(0, len(batches), 4):
                    await asyncio.gather(*(post(b) for b in batches[start : start + 4]))
                schedule_s = time.monotonic() - started
            try:
                await asyncio.wait_for(collector.done.wait(), max(delays) / 1000 + 60)
            except TimeoutError:
                pass
        finally:
            proc.terminate()
            proc.wait(30)
    result = summarize("tarry_store", due, collector, schedule_s)
    await declared.cancel(tag)
    await declared.delete(if_unused=False, if_empty=False)
    await connection.close()
    return result


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true", help="2,000 messages")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    count = 2_000 if args.quick else args.count
    rng = random.Random(args.seed)
    delays = [rng.randint(1_000, 10_000) for _ in range(count)]
    native = await run_native(count, delays)
    store = await run_store(count, delays)
    print(
        json.dumps(
            {
                "workload": {"messages": count, "delays_ms": [1_000, 10_000], "seed": args.seed},
                "native": native,
                "tarry_store": store,
                "ratio_tarry_store_over_native": {
                    "schedule_rate": ratio(
                        store["schedule_rate_per_s"], native["schedule_rate_per_s"]
                    ),
                    "lateness_p50": ratio(
                        store["lateness_ms"]["p50"], native["lateness_ms"]["p50"]
                    ),
                    "lateness_p99": ratio(
                        store["lateness_ms"]["p99"], native["lateness_ms"]["p99"]
                    ),
                    "lateness_max": ratio(
                        store["lateness_ms"]["max"], native["lateness_ms"]["max"]
                    ),
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
