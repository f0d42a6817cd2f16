"""Crash test: kill -9 a real `tarry serve` at random moments while a load generator schedules and
consumes; afterwards every message that got a 201 must have been delivered exactly once, none
before its due time, none lost. Prints JSON.

    .venv/bin/python bench/crash.py [--kills 50] [--store log] [--fsync batch] [--clean-every 0]
        [--plain] [--far-share 0.3]

The producer sends batches with a ``message_id`` per message and, like a real producer, resends
a batch whose answer it never got (de-duplication keeps it single). The consumer long-polls,
acks, and records what it got. A message received again after an ack that the server confirmed
is a duplicate; one received again because the kill came before its ack is a redelivery
(at-least-once consumption, counted apart).

``--far-share F`` sends that share of the messages due far ahead (a minute to a year) instead of
within ``max_delay_ms``: those must still be held after the last restart (found by id,
scheduled, at their due time), and none of them received.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from foundation import free_port  # noqa: E402

QUEUE = "crash"


@dataclass
class Server:
    data_dir: Path
    port: int
    store: str
    fsync: str
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, "TARRY_STORE__FSYNC": self.fsync, "TARRY_JOURNAL__ENABLED": "false"}
        command = [sys.executable, "-m", "tarry.cli.main", "serve", "--port", str(self.port)]
        command += ["--data", str(self.data_dir), "--store", self.store]
        log = self.data_dir.parent / "serve.log"  # the last start's, for when it fails
        with open(log, "w") as stderr:
            self.process = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=stderr, env=env
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(self.url + "/healthz", timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                time.sleep(0.05)
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"tarry serve did not start within 30 s; its stderr ends:\n{tail}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)


@dataclass
class Ledger:
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: body (the message_id, when sent with one) → (tarry id, deliver_at) for every send
    #: answered with 201.
    accepted: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: tarry id → receptions (received_at_ms, redelivered flag).
    received: dict[str, list[tuple[float, bool]]] = field(default_factory=dict)
    #: tarry ids whose ack the server confirmed.
    acked: set[str] = field(default_factory=set)
    duplicates: int = 0
    #: items a batch's answer refused (``overloaded`` while releases are behind): never
    #: stored, so neither accepted nor expected.
    refused: int = 0
    stop_producing: threading.Event = field(default_factory=threading.Event)
    stop_consuming: threading.Event = field(default_factory=threading.Event)


FAR_MS = (60_000, 365 * 86_400_000)


def produce(
    server: Server,
    ledger: Ledger,
    batch_size: int,
    max_delay_ms: int,
    plain: bool = False,
    far_share: float = 0.0,
) -> None:
    """With ``plain`` the sends carry no ``message_id`` (the release path of plain messages),
    so an unanswered batch is not sent again (that would schedule copies): it is dropped, and
    what of it the server kept shows up as unknown ids, checked for repeats only."""
    sequence = 0
    with httpx.Client(timeout=10) as client:
        while not ledger.stop_producing.is_set():
            batch = [
                {
                    "destination": QUEUE,
                    "body": f"m{sequence + i}",
                    "delay_ms": random.randint(*FAR_MS)
                    if random.random() < far_share
                    else random.randint(0, max_delay_ms),
                }
                for i in range(batch_size)
            ]
            if not plain:
                for item in batch:
                    item["message_id"] = item["body"]
            response = None
            while response is None:  # resend until answered: the server may be restarting
                try:
                    response = client.post(
                        server.url + "/v1/messages/batch", json={"messages": batch}
                    )
                    response.raise_for_status()
                except httpx.HTTPError:
                    response = None
                    if ledger.stop_producing.is_set():
                        return
                    time.sleep(0.05)
                    if plain:
                        break
            sequence += batch_size
            if response is None:
                continue
            with ledger.lock:
                for item, result in zip(batch, response.json()["results"], strict=True):
                    if "error" in result:
                        ledger.refused += 1
                        continue
                    ledger.accepted[item["body"]] = (result["id"], result["deliver_at"])
            time.sleep(0.01)


def consume(server: Server, ledger: Ledger) -> None:
    with httpx.Client(timeout=10) as client:
        while not ledger.stop_consuming.is_set():
            try:
                response = client.post(
                    f"{server.url}/v1/queues/{QUEUE}/receive",
                    json={"max": 200, "wait_ms": 500, "visibility_ms": 1500},
                )
                response.raise_for_status()
                now_ms = time.time() * 1000
                messages = response.json()["messages"]
                if not messages:
                    continue
                with ledger.lock:
                    for m in messages:
                        if m["id"] in ledger.acked:
                            ledger.duplicates += 1
                        ledger.received.setdefault(m["id"], []).append(
                            (now_ms, bool(m.get("redelivered")))
                        )
                receipts = [m["receipt"] for m in messages]
                ack = client.post(
                    f"{server.url}/v1/queues/{QUEUE}/ack", json={"receipts": receipts}
                )
                ack.raise_for_status()
                unknown = set(ack.json()["unknown"])
                with ledger.lock:
                    for m in messages:
                        if m["receipt"] not in unknown:
                            ledger.acked.add(m["id"])
            except httpx.HTTPError:
                time.sleep(0.05)


def run(
    *,
    kills: int,
    clean_every: int = 0,
    store: str = "log",
    fsync: str = "batch",
    data_dir: Path | None = None,
    batch_size: int = 50,
    max_delay_ms: int = 2000,
    gap_s: tuple[float, float] = (0.3, 1.5),
    drain_timeout_s: float = 60.0,
    plain: bool = False,
    far_share: float = 0.0,
) -> dict[str, Any]:
    owned = tempfile.TemporaryDirectory() if data_dir is None else None
    directory = data_dir or Path(owned.name if owned else ".")
    server = Server(directory / "data", free_port(), store, fsync)
    server.start()
    httpx.put(f"{server.url}/v1/queues/{QUEUE}", json={}, timeout=10).raise_for_status()
    ledger = Ledger()
    threads = [
        threading.Thread(
            target=produce,
            args=(server, ledger, batch_size, max_delay_ms, plain, far_share),
        ),
        threading.Thread(target=consume, args=(server, ledger)),
    ]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    try:
        for restart in range(1, kills + 1):
            time.sleep(random.uniform(*gap_s))
            if clean_every and restart % clean_every == 0:
                server.stop()  # a clean stop under load: the log store records it (CLEAN)
            else:
                server.kill()
            server.start()
        time.sleep(0.5)
        ledger.stop_producing.set()
        threads[0].join()
        deadline = time.monotonic() + drain_timeout_s
        while time.monotonic() < deadline:
            with ledger.lock:
                horizon = time.time() * 1000
                wanted = {i for i, d in ledger.accepted.values() if d <= horizon}
                if wanted <= set(ledger.received):
                    break
            time.sleep(0.2)
        # An ack whose answer a kill swallowed leaves the consumer unsure: linger past the
        # visibility timeout so that any message coming back again is seen and counted.
        time.sleep(2.5)
    finally:
        ledger.stop_producing.set()
        ledger.stop_consuming.set()
        for thread in threads:
            thread.join()
    try:
        with ledger.lock:
            end_ms = time.time() * 1000 + 5_000
            far = {i: d for i, d in ledger.accepted.values() if d > end_ms}
        far_missing = held_far(server, far)
    finally:
        server.stop()
    with ledger.lock:
        due = {i: d for i, d in ledger.accepted.values() if i not in far}
        lost = sorted(set(due) - set(ledger.received))
        early = sum(
            1 for i, got in ledger.received.items() if i in due and min(t for t, _ in got) < due[i]
        )
        result = {
            "kills": kills,
            "far_accepted": len(far),
            "far_lost": len(far_missing),
            "far_lost_ids": far_missing[:10],
            "far_received": len(set(far) & set(ledger.received)),
            "clean_stops": kills // clean_every if clean_every else 0,
            "store": store,
            "fsync": fsync,
            "plain": plain,
            "batch_size": batch_size,
            "seconds": round(time.monotonic() - started, 1),
            "accepted": len(due),
            "refused": ledger.refused,
            "received_distinct": len(set(ledger.received) & set(due)),
            "lost": len(lost),
            "lost_ids": lost[:10],
            "duplicates_after_confirmed_ack": ledger.duplicates,
            "redelivered_after_unconfirmed_ack": sum(
                len(v) - 1 for v in ledger.received.values() if len(v) > 1
            )
            - ledger.duplicates,
            "early": early,
            "unknown_ids_received": len(set(ledger.received) - set(due)),
        }
    result["ok"] = (
        result["lost"] == 0
        and result["far_lost"] == 0
        and result["far_received"] == 0
        and result["duplicates_after_confirmed_ack"] == 0
        and result["early"] == 0
    )
    if owned is not None:
        owned.cleanup()
    return result


def held_far(server: Server, far: dict[str, int]) -> list[str]:
    """The far-ahead messages the server does not hold as sent: missing, not scheduled, or due
    at another time."""
    missing = []
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for message_id, due in far.items():
            got = client.get(f"/v1/messages/{message_id}")
            if got.status_code != 200:
                missing.append(message_id)
                continue
            body = got.json()
            if body["state"] != "scheduled" or body["deliver_at"] != due:
                missing.append(message_id)
    return sorted(missing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument(
        "--clean-every",
        type=int,
        default=0,
        help="make every Nth restart a clean stop (SIGTERM) instead of kill -9 (default: none)",
    )
    parser.add_argument("--store", default="log", choices=["log", "sqlite"])
    parser.add_argument("--fsync", default="batch", choices=["batch", "always", "never"])
    parser.add_argument(
        "--plain",
        action="store_true",
        help="send without message_id (plain messages: their own release path); unanswered "
        "batches are dropped, not resent",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=50,
        help="sends a batch (from 256 on, a batch is checked and kept as columns)",
    )
    parser.add_argument(
        "--far-share",
        type=float,
        default=0.0,
        help="share of messages due a minute to a year ahead (held, not received, at the end)",
    )
    args = parser.parse_args()
    result = run(
        far_share=args.far_share,
        kills=args.kills,
        clean_every=args.clean_every,
        store=args.store,
        fsync=args.fsync,
        plain=args.plain,
        batch_size=args.batch_size,
    )
    print(json.dumps(result, indent=2))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
