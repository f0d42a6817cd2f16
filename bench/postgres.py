"""PostgreSQL store benchmarks: several real `tarry serve` nodes on one real database; prints JSON.

    .venv/bin/python bench/postgres.py [--quick] [--dsn postgresql://postgres@127.0.0.1:5432]

1. release throughput: N messages (50,000; --quick 5,000) all falling due at one moment, drained
   into a shared local queue by 1, 2 and 3 nodes (exactly_once mode): messages/s and the ratio
   to 1 node; the same workload on one node of the embedded default store for comparison.
2. steady 2,000 messages/s with delays of 1-10 s, produced and consumed through all nodes:
   lateness p50/p99/max (receive time minus due time) and early deliveries (must be 0), on
   3 PostgreSQL nodes and on the embedded store.
3. the issue's runs: 3 nodes, N messages with delays of 1-10 s, in exactly_once mode (lost,
   duplicated, early: all 0) and at_least_once mode (lost, early: 0; duplicates counted), each
   also while one node is killed with kill -9 every ~2 s and restarted; then exactly_once while
   PostgreSQL restarts mid-run (--no-pg-restart skips it; it affects everything on the machine).

Each run gets its own database (created and dropped here). The machine's other load shows in
the figures: compare ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import orjson
import psycopg

sys.path.insert(0, str(Path(__file__).parent))
from foundation import percentile, start_server  # noqa: E402

QUEUE = "bench.pg"


class Cluster:
    """``nodes`` real servers on one fresh database (or on the embedded store if ``dsn`` is
    None); stopped and the database dropped on exit."""

    def __init__(
        self,
        tmp: Path,
        server_dsn: str | None,
        nodes: int,
        name: str,
        consistency: str = "exactly_once",
    ) -> None:
        self.tmp = tmp / name
        self.consistency = consistency
        self.server_dsn = server_dsn
        self.count = nodes
        self.db = f"tarry_bench_{uuid.uuid4().hex[:10]}"
        self.procs: list[subprocess.Popen[str]] = []
        self.urls: list[str] = []

    def __enter__(self) -> Cluster:
        config = self.tmp / "tarry.toml"
        self.tmp.mkdir(parents=True)
        config.write_text(
            "[journal]\nenabled = false\n[dispatch]\nlease_ms = 3000\n"
            "time_to_trigger_store_ms = 500\ntime_to_trigger_fetch_ms = 500\n"
            f'[store]\nconsistency = "{self.consistency}"\nconnect_timeout_ms = 500\n'
        )
        if self.server_dsn is not None:
            self._admin(f"CREATE DATABASE {self.db}")
        for index in range(self.count):
            self.start(index, config)
        return self

    def start(self, index: int, config: Path | None = None) -> None:
        config = config or self.tmp / "tarry.toml"
        if self.server_dsn is None:
            store, extra = "sqlite", ["--config", str(config)]
        else:
            store = "postgres"
            extra = ["--dsn", f"{self.server_dsn}/{self.db}", "--config", str(config)]
        proc, url = start_server(self.tmp / f"node{index}", store, extra)
        if index < len(self.procs):
            self.procs[index], self.urls[index] = proc, url
        else:
            self.procs.append(proc)
            self.urls.append(url)

    def kill(self, index: int) -> None:
        self.procs[index].send_signal(signal.SIGKILL)
        self.procs[index].wait()

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait()
        if self.server_dsn is not None:
            self._admin(f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)")

    def _admin(self, sql: str) -> None:
        assert self.server_dsn is not None
        with psycopg.connect(f"{self.server_dsn}/postgres", autocommit=True) as conn:
            conn.execute(sql.encode())


async def _post_batch(client: httpx.AsyncClient, url: str, batch: list[dict]) -> list[dict]:
    response = await client.post(
        f"{url}/v1/messages/batch",
        content=orjson.dumps({"messages": batch}),
        headers={"content-type": "application/json"},
    )
    response.raise_for_status()
    return list(orjson.loads(response.content)["results"])


async def release_throughput(cluster: Cluster, total: int) -> dict[str, object]:
    """Load ``total`` messages due at one moment, then time how fast the nodes release them."""
    urls = cluster.urls
    async with httpx.AsyncClient(timeout=120) as client:
        for url in urls:
            await client.put(f"{url}/v1/queues/{QUEUE}", json={})
        budget_s = total / 2500 + 5
        due_ms = int(time.time() * 1000 + budget_s * 1000)
        batches = [
            [{"destination": QUEUE, "body": "x", "deliver_at": due_ms} for _ in range(1000)]
            for _ in range(total // 1000)
        ]
        pending = asyncio.Queue[list[dict]]()
        for batch in batches:
            pending.put_nowait(batch)

        async def load(url: str) -> None:
            while not pending.empty():
                await _post_batch(client, url, pending.get_nowait())

        await asyncio.gather(*(load(u) for u in urls for _ in range(2)))
        loaded_ms = time.time() * 1000
        await asyncio.sleep(max(0.0, due_ms / 1000 - time.time()))
        ready = 0
        while ready < total:
            response = await client.get(f"{urls[0]}/v1/queues/{QUEUE}")
            ready = int(response.json()["ready"])
            if ready < total:
                await asyncio.sleep(0.05)
        done_ms = time.time() * 1000
    seconds = (done_ms - due_ms) / 1000
    return {
        "nodes": len(urls),
        "messages": total,
        "load_finished_before_due": loaded_ms <= due_ms,
        "release_seconds": round(seconds, 3),
        "released_per_s": round(total / seconds),
    }


async def steady(cluster: Cluster, rate: int, seconds: int) -> dict[str, object]:
    """Produce ``rate``/s with delays 1-10 s round-robin over the nodes; consume from every node;
    lateness = receive time - due time."""
    urls = cluster.urls
    got: list[tuple[str, float, int]] = []
    accepted: dict[str, int] = {}
    stop_at = time.time() + seconds
    consumers = list(urls)
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=32)) as client:
        for url in urls:
            (await client.put(f"{url}/v1/queues/{QUEUE}", json={})).raise_for_status()

        async def produce(index: int) -> None:
            tick, share = 0.05, rate / (2 * len(urls))  # two producers per node
            per_tick = max(1, int(share * tick))
            next_at = time.monotonic()
            while time.time() < stop_at:
                batch = [
                    {"destination": QUEUE, "body": "x", "delay_ms": random.randint(1000, 10_000)}
                    for _ in range(per_tick)
                ]
                try:
                    for result in await _post_batch(client, cluster.urls[index], batch):
                        accepted[result["id"]] = result["deliver_at"]
                except httpx.HTTPError:
                    pass  # overloaded: what was not acknowledged is not counted
                next_at += tick
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))

        async def consume(url: str) -> None:
            deadline = stop_at + 40
            while time.time() < deadline and (time.time() < stop_at + 11 or _missing()):
                response = await client.post(
                    f"{url}/v1/queues/{QUEUE}/receive", json={"max": 500, "wait_ms": 500}
                )
                now_ms = time.time() * 1000
                messages = orjson.loads(response.content)["messages"]
                got.extend((m["id"], now_ms, m["deliver_at"]) for m in messages)
                if messages:
                    await client.post(
                        f"{url}/v1/queues/{QUEUE}/ack",
                        json={"receipts": [m["receipt"] for m in messages]},
                    )

        def _missing() -> bool:
            return len({i for i, _, _ in got}) < len(accepted)

        tasks = [produce(i) for i in range(len(urls)) for _ in "ab"]
        tasks += [consume(u) for u in consumers for _ in "ab"]
        await asyncio.gather(*tasks)
    lateness = [at - due for _, at, due in got]
    counts = Counter(i for i, _, _ in got)
    return {
        "nodes": len(urls),
        "rate_per_s": rate,
        "seconds": seconds,
        "accepted": len(accepted),
        "accepted_per_s": round(len(accepted) / seconds),
        "received_distinct": len(counts),
        "lost": len(set(accepted) - set(counts)),
        "duplicates": sum(c - 1 for c in counts.values()),
        "early": sum(1 for v in lateness if v < 0),
        "lateness_ms_p50": round(percentile(lateness, 50), 2),
        "lateness_ms_p99": round(percentile(lateness, 99), 2),
        "lateness_ms_max": round(max(lateness), 2) if lateness else None,
    }


async def burst(
    cluster: Cluster, total: int, *, kill_every_s: float | None = None, pg_restart: bool = False
) -> dict[str, object]:
    """The issue's workload: ``total`` messages with delays of 1-10 s sent as fast as the nodes
    take them (round-robin), consumed through the nodes; optionally one node killed with kill -9
    every ~``kill_every_s`` and restarted, or PostgreSQL restarted 3 s in. With a node being
    killed in exactly_once mode, consumers use the other nodes (a consumer whose node dies
    between receive and ack gets a redelivery: that is the consumer's at-least-once, not the
    release's); in at_least_once mode every node's queue is consumed."""
    urls = cluster.urls
    got: list[tuple[str, float, int]] = []
    redelivered: list[str] = []
    accepted: dict[str, int] = {}
    refused = 0
    kills = 0
    victim = len(urls) - 1
    exactly_once = cluster.consistency == "exactly_once"
    consumer_nodes = list(range(len(urls)))
    if kill_every_s and exactly_once:
        consumer_nodes = consumer_nodes[:-1]
    sending = True
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=32)) as client:
        for url in urls:
            (await client.put(f"{url}/v1/queues/{QUEUE}", json={})).raise_for_status()
        pending = asyncio.Queue[list[dict]]()
        for start in range(0, total, 500):
            pending.put_nowait(
                [
                    {"destination": QUEUE, "body": "x", "delay_ms": random.randint(1000, 10_000)}
                    for _ in range(min(500, total - start))
                ]
            )
        started = time.time()

        async def produce(index: int) -> None:
            nonlocal refused
            while not pending.empty():
                batch = pending.get_nowait()
                try:
                    for result in await _post_batch(client, cluster.urls[index], batch):
                        if "id" in result:
                            accepted[result["id"]] = result["deliver_at"]
                        else:
                            refused += 1
                except httpx.HTTPError:
                    refused += len(batch)  # the node died under it: not acknowledged
                    await asyncio.sleep(0.2)

        def missing() -> bool:
            return sending or len({i for i, _, _ in got}) < len(accepted)

        async def consume(index: int) -> None:
            deadline = started + 120
            while time.time() < deadline and missing():
                try:
                    response = await client.post(
                        f"{cluster.urls[index]}/v1/queues/{QUEUE}/receive",
                        json={"max": 500, "wait_ms": 500, "visibility_ms": 3000},
                    )
                    now_ms = time.time() * 1000
                    messages = orjson.loads(response.content)["messages"]
                    got.extend((m["id"], now_ms, m["deliver_at"]) for m in messages)
                    redelivered.extend(m["id"] for m in messages if m["redelivered"])
                    if messages:
                        await ack(index, [m["receipt"] for m in messages])
                except (httpx.HTTPError, KeyError, ValueError):
                    await asyncio.sleep(0.2)

        async def ack(index: int, receipts: list[str]) -> None:
            """Ack until it is taken (the receipts hold for the visibility time): a consumer
            that gives up on an ack gets the messages again, which is not the store's doing."""
            for _ in range(20):
                try:
                    response = await client.post(
                        f"{cluster.urls[index]}/v1/queues/{QUEUE}/ack", json={"receipts": receipts}
                    )
                    if response.status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)

        async def chaos() -> None:
            nonlocal kills
            if pg_restart:
                await asyncio.sleep(3)
                await asyncio.to_thread(restart_postgres)
            while kill_every_s and time.time() < started + 12:
                await asyncio.sleep(random.uniform(0.5, 1.5) * kill_every_s)
                cluster.kill(victim)
                kills += 1
                await asyncio.to_thread(cluster.start, victim)

        async def producers() -> None:
            nonlocal sending
            await asyncio.gather(*(produce(i) for i in range(len(urls)) for _ in "ab"))
            sending = False

        await asyncio.gather(
            producers(), chaos(), *(consume(i) for i in consumer_nodes for _ in "ab")
        )
    lateness = [at - due for i, at, due in got if i in accepted]
    counts = Counter(i for i, _, _ in got)
    return {
        "nodes": len(urls),
        "consistency": cluster.consistency,
        "messages": total,
        "accepted": len(accepted),
        "refused_while_down": refused,
        "received_distinct": len(counts),
        "lost": len(set(accepted) - set(counts)),
        "duplicates": sum(c - 1 for c in counts.values()),
        # of which: handed out again by its queue (a receive whose answer or ack was lost)
        "redelivered_by_queue": len(redelivered),
        "early": sum(1 for v in lateness if v < 0),
        "kills": kills,
        "pg_restarted": pg_restart,
        "lateness_ms_p50": round(percentile(lateness, 50), 2),
        "lateness_ms_p99": round(percentile(lateness, 99), 2),
        "lateness_ms_max": round(max(lateness), 2) if lateness else None,
    }


def restart_postgres() -> None:
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        capture_output=True,
        timeout=120,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432")
    parser.add_argument("--quick", action="store_true", help="smaller runs, for a smoke test")
    parser.add_argument("--only", choices=["throughput", "steady", "burst"], help="run one part")
    parser.add_argument(
        "--no-pg-restart", action="store_true", help="skip the run that restarts PostgreSQL"
    )
    parser.add_argument("--nodes", type=int, default=3, help="nodes for steady and burst runs")
    args = parser.parse_args()
    total = 5_000 if args.quick else 50_000
    seconds = 10 if args.quick else 30
    out: dict[str, object] = {"cpus": os.cpu_count(), "messages": total}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.only in (None, "throughput"):
            throughput(tmp, args.dsn, total, out)
        if args.only in (None, "steady"):
            with Cluster(tmp, args.dsn, args.nodes, "steady-pg") as cluster:
                out[f"steady_2000_per_s_postgres_{args.nodes}_nodes"] = asyncio.run(
                    steady(cluster, 2000, seconds)
                )
            with Cluster(tmp, None, 1, "steady-sqlite") as cluster:
                out["steady_2000_per_s_embedded_1_node"] = asyncio.run(
                    steady(cluster, 2000, seconds)
                )
        if args.only in (None, "burst"):
            runs: list[tuple[str, str, dict[str, object]]] = [
                ("exactly_once", "exactly_once", {}),
                ("exactly_once_kill_9", "exactly_once", {"kill_every_s": 2.0}),
                ("at_least_once", "at_least_once", {}),
                ("at_least_once_kill_9", "at_least_once", {"kill_every_s": 2.0}),
            ]
            if not args.no_pg_restart:
                runs.append(("exactly_once_postgres_restart", "exactly_once", {"pg_restart": True}))
            for key, mode, options in runs:
                with Cluster(tmp, args.dsn, args.nodes, key, consistency=mode) as cluster:
                    result = asyncio.run(burst(cluster, total, **options))  # type: ignore[arg-type]
                out[f"{total}_messages_{args.nodes}_nodes_{key}"] = result
                print(json.dumps({key: result}), file=sys.stderr)
    print(json.dumps(out, indent=2))


def throughput(tmp: Path, dsn: str, total: int, out: dict[str, object]) -> None:
    results: dict[str, dict[str, object]] = {}
    for nodes in (1, 2, 3):
        with Cluster(tmp, dsn, nodes, f"tp{nodes}") as cluster:
            results[f"postgres_{nodes}_nodes"] = asyncio.run(release_throughput(cluster, total))
        print(json.dumps(results), file=sys.stderr)
    with Cluster(tmp, None, 1, "tp-sqlite") as cluster:
        results["embedded_1_node"] = asyncio.run(release_throughput(cluster, total))
    base = float(str(results["postgres_1_nodes"]["released_per_s"]))
    out["release_throughput"] = results
    out["ratio_to_1_node"] = {
        k: round(float(str(v["released_per_s"])) / base, 2) for k, v in results.items()
    }


if __name__ == "__main__":
    main()
