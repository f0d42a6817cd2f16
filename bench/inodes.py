"""Issue 22: what creating a year case's partitions costs the file system right after a case's
files were deleted, with a directory and a file a partition (the layout before ``parts/``)
against a file a partition in one directory (``store/log/migrate.py``).

On ext4 a new inode skips the inodes freed in the last seconds, so the cost of a fresh server's
~160 new partitions depends on what was deleted just before. Each repetition creates and deletes
``--deleted`` inodes in one layout, then times creating ``--partitions`` partitions in it (each
file written with 100 bytes, as the store's first write-out does); the layouts alternate. Prints
JSON: the medians of wall and system CPU ms per layout.

    .venv/bin/python bench/inodes.py [--dir /path/on/the/store/disk] [--deleted 330] [--reps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def make(root: Path, *, flat: bool, count: int) -> None:
    parts = root / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        if flat:
            path = parts / f"p5-{n:010d}.seg-000000.log"
        else:
            directory = root / f"p5-{n:010d}"
            directory.mkdir()
            path = directory / "seg-000000.log"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, b"x" * 100)
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="where (default: a temp dir)")
    parser.add_argument("--deleted", type=int, default=330, help="inodes deleted before each")
    parser.add_argument("--partitions", type=int, default=160)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="inodes-", dir=args.dir))
    wall: dict[str, list[float]] = {"flat": [], "dirs": []}
    system: dict[str, list[float]] = {"flat": [], "dirs": []}
    try:
        for rep in range(args.reps):
            for flat in (True, False) if rep % 2 else (False, True):
                name = "flat" if flat else "dirs"
                old = base / f"old-{rep}-{name}"
                make(old, flat=flat, count=args.deleted if flat else args.deleted // 2)
                os.sync()
                shutil.rmtree(old)
                new = base / f"new-{rep}-{name}"
                sys_before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
                started = time.perf_counter()
                make(new, flat=flat, count=args.partitions)
                wall[name].append((time.perf_counter() - started) * 1000)
                sys_after = resource.getrusage(resource.RUSAGE_SELF).ru_stime
                system[name].append((sys_after - sys_before) * 1000)
                shutil.rmtree(new)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result = {
        "deleted_inodes_before": args.deleted,
        "partitions": args.partitions,
        "reps": args.reps,
        "load_average": os.getloadavg(),
    }
    for name in ("flat", "dirs"):
        result[f"{name}_wall_ms_median"] = round(statistics.median(wall[name]), 1)
        result[f"{name}_sys_ms_median"] = round(statistics.median(system[name]), 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
