"""A local standalone Spark cluster for the pipeline tests (``scripts/spark-cluster``), whose
executors run a bare Python (numpy, pyarrow and pandas only: no tarry), and the comparisons of
its results with ``local[2]``'s.

One cluster per test module (its JVMs stop at the module's end); the bare Python is a virtualenv
built once per machine under the temporary directory. Where the cluster cannot start, the tests
fail under ``TARRY_REQUIRE_SERVICES=1`` and skip loudly otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REQUIRE_SERVICES

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "spark-cluster"
#: Summary fields that depend on the run, not on the data (time, where it wrote).
RUN_FIELDS = {"seconds", "rows_per_s", "phases", "import_area", "rejects_dir"}


def _unavailable(message: str) -> None:
    if REQUIRE_SERVICES:
        pytest.fail(f"TARRY_REQUIRE_SERVICES=1 and {message}", pytrace=False)
    pytest.skip(f"SKIPPED LOUDLY: {message}")


def bare_python() -> str:
    """A virtualenv's Python with only numpy, pyarrow and pandas (``scripts/spark-cluster
    bare-python``: built once per machine, reused)."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "bare-python"], capture_output=True, text=True
    )
    if done.returncode != 0:
        _unavailable(f"the bare executor Python could not be built:\n{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def cluster(state: Path, *, connect: bool, python: str) -> Iterator[dict[str, str]]:
    """``scripts/spark-cluster start`` (2 workers of 1 core; with ``connect`` the Connect server,
    whose executors run ``python``), its URLs; stopped afterwards."""
    command = [sys.executable, str(SCRIPT)]
    where = ["--state", str(state)]
    start = [*command, "start", "--workers", "2", "--timeout", "90", *where]
    if connect:
        start += ["--connect", "--python", python]
    done = subprocess.run(start, capture_output=True, text=True)
    try:
        if done.returncode != 0:
            logs = "".join(
                f"\n--- {log.name}\n{log.read_text()[-1500:]}" for log in state.glob("*.log")
            )
            _unavailable(f"the local Spark cluster did not start: {done.stderr}{logs}")
        urls = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        yield urls
    finally:
        subprocess.run([*command, "stop", *where], check=False)


def tarry(*args: str, python: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``tarry ARGS`` in its own process (its own Spark driver), executors on ``python``."""
    env = {**os.environ, "PYSPARK_PYTHON": python, "SPARK_LOCAL_IP": "127.0.0.1"}
    return subprocess.run(
        [sys.executable, "-m", "tarry.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def summary_of(output: str) -> dict[str, Any]:
    """The ``--json`` summary, without the fields that depend on the run."""
    data: dict[str, Any] = json.loads(output[output.index("{") :])
    return {k: v for k, v in data.items() if k not in RUN_FIELDS}


def table(path: Path, *order: str) -> pa.Table:
    """A Parquet dataset sorted by ``order`` (the order of rows in files is the tasks')."""
    return pq.read_table(path).sort_by([(c, "ascending") for c in order])


def write_input(path: Path, now_ms: int, *, rows: int = 20_000) -> None:
    """``rows`` rows in 4 row groups over 3 queues and a topic of 2 subscriptions: about 1 % repeat
    an earlier message_id (some in another row group), 1 % name no known destination, 1 % give
    both deliver_at and delay_ms, some without a message_id (the id is derived)."""
    ids = [f"m{i}" for i in range(rows)]
    for i in range(0, rows, 97):
        ids[i] = f"m{(i * 7919) % max(1, i)}" if i else ids[i]
    destinations = [("c.q1", "c.q2", "c.q3", "c.t")[i % 4] for i in range(rows)]
    for i in range(5, rows, 101):
        destinations[i] = "c.nowhere"
    deliver_at = [
        now_ms + (i * 7_919_993) % (48 * 3_600_000) if i % 2 else None for i in range(rows)
    ]
    delay = [None if i % 2 else (i * 104_729) % (6 * 3_600_000) for i in range(rows)]
    for i in range(7, rows, 103):
        deliver_at[i], delay[i] = now_ms + 60_000, 1_000
    message_ids: list[str | None] = list(ids)
    for i in range(11, rows, 211):
        message_ids[i] = None
    data = pa.table(
        {
            "message_id": pa.array(message_ids, pa.string()),
            "destination": destinations,
            "body": [f"body {i}" for i in range(rows)],
            "deliver_at": pa.array(deliver_at, pa.int64()),
            "delay_ms": pa.array(delay, pa.int64()),
        }
    )
    pq.write_table(data, path, row_group_size=rows // 4)
