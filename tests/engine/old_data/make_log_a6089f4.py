"""Writes ``log-a6089f4`` (see ``tests/engine/test_old_data_dir.py``): run it with the tarry of
commit a6089f4 on the path, ``python make_log_a6089f4.py OUT``; ``tarry.lock`` is left out of
the copy kept here."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

from tarry.config import load_config
from tarry.engine.core import Engine
from tarry.model.time import ManualClock


async def main(out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    clock = ManualClock(1_700_000_000_000)
    config = load_config(None, {"server": {"data_dir": str(out)}, "journal": {"enabled": False}})
    engine = Engine.from_config(config, clock=clock)
    await engine.start(background=False)
    await engine.declare_queue("orders", {"dead_letter_to": "orders.dead"})
    await engine.declare_queue("orders.dead", {})
    sent: dict[str, str] = {}
    for name, extra in [
        ("acked", {}),
        ("inflight", {}),
        ("ready", {"message_id": "order-42"}),
        ("rejected", {}),
        ("due", {"delay_ms": 1000}),
        ("future", {"delay_ms": 3_600_000}),
    ]:
        sent[name] = (await engine.send({"destination": "orders", "body": name, **extra})).id
    clock.advance(1000)
    while await engine.dispatcher.run_once():
        pass
    first = await engine.receive("orders", max_messages=2, visibility_ms=3_600_000)
    receipts = {d.message.body.decode(): d.receipt for d in first}
    await engine.ack("orders", [receipts["acked"]])
    sent["inflight_receipt"] = receipts["inflight"]
    second = await engine.receive("orders", max_messages=2, visibility_ms=3_600_000)
    [ready] = [d for d in second if d.message.body == b"ready"]  # "rejected" stays in flight
    await engine.nack("orders", [ready.receipt], requeue=True)
    await engine.stop()
    (out / "sent.json").write_text(json.dumps(sent, indent=1))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1])))
