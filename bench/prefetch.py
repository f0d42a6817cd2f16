"""The event loop while the next partition is indexed, as it comes within ``prefetch_ms`` of its
start (issue 23's steady max); prints JSON.

    .venv/bin/python bench/prefetch.py [--messages 80000] [--overdue] [--runs 2]
        [--baseline-src DIR/src]

A log store (in-process, the default 5-minute partitions and 30 s ``prefetch_ms``) holds
``--messages`` messages of 100 bytes due in the first half minute of a partition that has not
come near yet, on disk and not indexed: what steady traffic of 10,000 msg/s due 1–60 s has put
there by the time the partition comes within 30 s (about 80,000). Then rounds look for due
messages every 2 ms, as the dispatcher's do, from the moment the partition is 29 s ahead,
until it is indexed, with the interpreter settings ``tarry serve`` has. Reported: the longest
the event loop was held meanwhile (a task sleeping 1 ms at a time measures it), the longest
round, and how long until the index was ready; then every message is fetched at its
partition's end, to check none was left out or given twice.
``--overdue``: the rounds begin once the partition's window is over, as after downtime (it was
never indexed), so that they look for its messages while it is indexed.
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
PREFETCH_MS = 30_000


async def _measure(root: Path, count: int, overdue: bool) -> dict[str, Any]:
    from logstore import messages

    from tarry.model.state import MessageState
    from tarry.server.app import tune_runtime
    from tarry.store.log import LogStore

    now_ms = int(time.time() * 1000)
    start_ms = (now_ms // GRANULARITY_MS + 2) * GRANULARITY_MS
    store = LogStore(root, granularity_ms=GRANULARITY_MS, prefetch_ms=PREFETCH_MS)
    await store.open()
    for first in range(0, count, 1000):
        batch = messages(
            min(1000, count - first), lambda i, _, first=first: start_ms + (first + i) % 30_000
        )
        await store.store(batch)
    await store.writer.drain()
    [partition] = [p for p in store.partitions.values() if p.start_ms == start_ms]
    assert partition.index is None, "indexed before it came near"
    tune_runtime()  # the collector's and the GIL's settings of `tarry serve`
    end_ms = start_ms + GRANULARITY_MS
    at_ms = end_ms + 1000 if overdue else start_ms - PREFETCH_MS + 1000
    longest_round = 0.0
    rounds = 0
    fetched: list[str] = []
    async with LoopHold() as hold:
        began = time.perf_counter()
        while partition.index is None:
            started = time.perf_counter()
            due = await store.fetch_due(at_ms, limit=1000, lease_ms=60_000)
            longest_round = max(longest_round, time.perf_counter() - started)
            rounds += 1
            assert overdue or not due
            fetched += [m.id for m in due]
            await asyncio.sleep(0.002)
        ready = time.perf_counter() - began
    while due := await store.fetch_due(end_ms, limit=10_000, lease_ms=60_000):
        fetched += [m.id for m in due]
        await store.remove([m.id for m in due], state=MessageState.READY, now_ms=end_ms)
    await store.close()
    assert len(fetched) == len(set(fetched)) == count, (len(fetched), len(set(fetched)))
    return {
        "overdue": overdue,
        "event_loop_held_max_ms": hold.max_ms,
        "longest_round_ms": round(longest_round * 1000, 1),
        "index_ready_ms": round(ready * 1000, 1),
        "rounds_until_ready": rounds,
        "fetched_once": len(fetched),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=80_000)
    parser.add_argument("--overdue", action="store_true")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--baseline-src", type=Path, help="another tarry source tree's src/")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parent.parent) as name:
            print(json.dumps(asyncio.run(_measure(Path(name), args.messages, args.overdue))))
        return
    child = ["--child", "--messages", str(args.messages), *(["--overdue"] if args.overdue else [])]
    results = {"messages": args.messages, "overdue": args.overdue}
    results.update(alternating(args.runs, child, __file__, args.baseline_src))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
