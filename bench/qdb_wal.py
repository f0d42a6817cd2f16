"""The queue database's writes under steady traffic (issue 23, lateness): how long each write
waits for its commit, and how large the WAL grows; prints JSON.

    .venv/bin/python bench/qdb_wal.py [--seconds 20] [--rows 40] [--row-bytes 1000]

A write of ``--rows`` rows every 2 ms through ``tarry.store.sqlite.database.Database`` (the
queue database's writer thread and its checkpointer), as releases, receives and acks come: the
checkpointer alone never copies the whole WAL back between two writes. A write whose COMMIT
runs a checkpoint of the whole WAL waits for it, and so does everything behind it on that
thread, as do writes arriving while the writer finishes a checkpoint itself. Run it with each
tree's ``src`` on ``PYTHONPATH`` to compare two commits; under
``strace -f -c -e trace=fsync,fdatasync,ftruncate`` for the syncs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from tarry.store.sqlite.database import Database


async def steady_writes(seconds: float, rows: int, row_bytes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as data:
        db = Database(Path(data) / "q.db", queues_only=True)
        await db.open()
        wal = Path(data) / "q.db-wal"
        await db.write(lambda conn: conn.execute("CREATE TABLE bodies (b BLOB)"))
        batch = [(bytes(row_bytes),)] * rows

        def insert(conn: sqlite3.Connection) -> None:
            conn.executemany("INSERT INTO bodies VALUES (?)", batch)

        waits: list[float] = []
        largest = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            await db.write(insert)
            waits.append((time.perf_counter() - started) * 1000)
            largest = max(largest, wal.stat().st_size)
            await asyncio.sleep(0.002)
        await db.close()
    waits.sort()
    return {
        "writes": len(waits),
        "megabytes_written": round(len(waits) * rows * row_bytes / 1e6),
        "write_ms_p50": round(waits[len(waits) // 2], 2),
        "write_ms_p99": round(waits[int(len(waits) * 0.99)], 2),
        "write_ms_max": round(waits[-1], 2),
        "writes_over_50_ms": sum(1 for w in waits if w > 50),
        "wal_largest_mb": round(largest / 1e6, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--row-bytes", type=int, default=1000)
    args = parser.parse_args()
    result = asyncio.run(steady_writes(args.seconds, args.rows, args.row_bytes))
    print(json.dumps({"qdb_wal": result}, indent=2))


if __name__ == "__main__":
    main()
