"""The event loop while cleanup deletes a drained partition (issue 23's steady tail); prints JSON.

    .venv/bin/python bench/cleanup.py [--messages 1000000] [--own-keys] [--keyed 0] [--runs 2]
        [--baseline-src DIR/src]

A log store (in-process, the default 5-minute partitions) is given ``--messages`` messages of
100 bytes due in one partition whose window is over; all are fetched and released, then
``delete_released`` deletes the partition and its files, as the store's upkeep does once a
partition's five minutes are over and drained (at 10,000 msg/s, every five minutes, up to
3,000,000 messages), its markers written and a checkpoint taken first, as a server's upkeep
has. ``--own-keys``: the partition's messages are sent with a ``message_id`` (an idempotent
producer's), each with a de-duplication key the deletion drops. ``--keyed`` more messages
sent with a ``message_id`` wait in the partitions after it, each with a de-duplication key
the store keeps until its own partition goes. Reported: the
partition's size, how long the deletion took, and the longest the event loop was held
meanwhile (a task sleeping 1 ms at a time measures it).
``--baseline-src`` runs another source tree too (e.g. a worktree of main before a change), the
runs alternating, each in a process of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from foundation import LoopHold, alternating  # noqa: E402

GRANULARITY_MS = 300_000


async def _measure(root: Path, count: int, keyed: int, own_keys: bool) -> dict[str, Any]:
    from logstore import messages

    from tarry.model.state import MessageState
    from tarry.server.app import tune_runtime
    from tarry.store.log import LogStore

    # Two windows back: over, so the partition is deleted once drained. No automatic upkeep:
    # the deletion is the one measured.
    start_ms = (int(time.time() * 1000) // GRANULARITY_MS - 2) * GRANULARITY_MS
    store = LogStore(root, granularity_ms=GRANULARITY_MS, snapshot_interval_ms=1 << 62)
    await store.open()
    for first in range(0, count, 10_000):
        batch = messages(
            min(10_000, count - first),
            lambda i, _, first=first: start_ms + 10 + (first + i) * (GRANULARITY_MS // 2) // count,
        )
        if own_keys:
            for i, m in enumerate(batch):
                m.message_id = f"own{first + i}"
        await store.store(batch)
    later = start_ms + 10 * GRANULARITY_MS
    for first in range(0, keyed, 10_000):
        batch = messages(
            min(10_000, keyed - first), lambda i, _, first=first: later + (first + i) * 10
        )
        for i, m in enumerate(batch):
            m.message_id = f"k{first + i}"
        await store.store(batch)
    while due_now := await store.fetch_due(start_ms + GRANULARITY_MS, limit=5000, lease_ms=60_000):
        ids_due = [m.id for m in due_now]
        await store.remove(ids_due, state=MessageState.READY, now_ms=start_ms + GRANULARITY_MS)
    # As in a server releasing 10,000 msg/s: the markers written as they come, and a
    # checkpoint within the last minute (the store's upkeep takes one every minute).
    await store.writer.drain()
    await store.snapshot()
    size = sum(p.stat().st_size for p in (root / "parts").glob("p-*"))
    # The collector's and the GIL's settings of `tarry serve`: with the interpreter's own, the
    # set-up's millions of short-lived objects made full collections of 75-95 ms, one of which
    # could fall inside the deletion and be read as its hold.
    tune_runtime()
    async with LoopHold() as hold:
        started = time.perf_counter()
        deleted = await store.delete_released(start_ms + GRANULARITY_MS + 1)
        took = time.perf_counter() - started
    await store.close()
    return {
        "keys_kept": len(store.state.dedupe),
        "partition_mb": round(size / 2**20, 1),
        "partitions_deleted": deleted,
        "delete_ms": round(took * 1000, 1),
        "event_loop_held_max_ms": hold.max_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--own-keys", action="store_true")
    parser.add_argument("--keyed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--baseline-src", type=Path, help="another tarry source tree's src/")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parent.parent) as name:
            print(
                json.dumps(
                    asyncio.run(_measure(Path(name), args.messages, args.keyed, args.own_keys))
                )
            )
        return
    child = ["--child", "--messages", str(args.messages), "--keyed", str(args.keyed)]
    child += ["--own-keys"] if args.own_keys else []
    results = {"messages": args.messages, "own_keys": args.own_keys, "keyed": args.keyed}
    results.update(alternating(args.runs, child, __file__, args.baseline_src))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
