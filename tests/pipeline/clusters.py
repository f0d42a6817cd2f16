"""A local standalone Spark cluster for the pipeline tests (``scripts/spark-cluster``), whose
executors run a bare Python (numpy, pyarrow and pandas only: no tarry); the long-lived drivers
the tests send their commands to; and ``local[2]``'s results, which the cluster's must equal.

One cluster per test session, with the Spark Connect server attached: it starts in the
background while ``local[2]`` computes the reference results, and its workers see a directory
of the session (``unseen``) as an empty file system, as executors on another host would. The
bare Python is a virtualenv built once per machine under the temporary directory. Where the
cluster cannot start, the tests fail under ``TARRY_REQUIRE_SERVICES=1`` and skip loudly
otherwise.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REQUIRE_SERVICES

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "spark-cluster"
DRIVER = Path(__file__).with_name("driver.py")
#: Summary fields that depend on the run, not on the data (time, where it wrote).
RUN_FIELDS = {"seconds", "rows_per_s", "phases", "import_area", "rejects_dir"}
#: The destinations the input names (c.t is a topic of c.s1 and c.s2).
QUEUES = ("c.q1", "c.q2", "c.q3", "c.s1", "c.s2")
#: Cores a long-lived driver (and the Connect server) takes of the workers' six: the test of
#: executors without pyarrow needs the rest for an application of its own.
APP_CORES = 2
#: Less JIT and a serial GC in the executors, as in the tests' local[2] session (short jobs).
LIGHT_EXECUTORS = "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: Partitions after a shuffle, on local[2] and on the cluster alike (fewer, shorter tasks).
SHUFFLE = ["--shuffle-partitions", "2"]


def unavailable(message: str) -> None:
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
        unavailable(f"the bare executor Python could not be built:\n{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def can_hide(directory: Path) -> bool:
    """Whether ``scripts/spark-cluster --hide`` works here: a mount namespace of its own (root,
    or unprivileged user namespaces) in which a tmpfs can cover ``directory``."""
    as_root = [] if os.geteuid() == 0 else ["--map-root-user"]
    mount = f"mount -t tmpfs -o size=1m tarry-hidden {shlex.quote(str(directory))}"
    try:
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", *as_root, "sh", "-c", mount],
            capture_output=True,
        )
    except FileNotFoundError:
        return False
    return done.returncode == 0


@dataclass
class Reply:
    exit_code: int
    stdout: str
    stderr: str


class Driver:
    """A long-lived ``tarry`` process (``driver.py``) with one Spark session on ``where``
    (``--master URL`` or ``--remote URL``), executors on ``python``: it makes its session as
    soon as it starts, and runs the commands sent with ``run`` one at a time."""

    def __init__(self, where: list[str], *, python: str, log: Path) -> None:
        self.log = log
        env = {**os.environ, "PYSPARK_PYTHON": python, "SPARK_LOCAL_IP": "127.0.0.1"}
        env["PYSPARK_SUBMIT_ARGS"] = (
            f"--conf spark.cores.max={APP_CORES} --conf '{LIGHT_EXECUTORS}' pyspark-shell"
        )
        read, write = os.pipe()
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(DRIVER), str(write), *where],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(write,),
                env=env,
                cwd=ROOT,
                text=True,
            )
        os.close(write)
        self.replies = os.fdopen(read)
        self.lock = threading.Lock()
        self.ready = False

    def _reply(self) -> dict[str, Any]:
        line = self.replies.readline()
        if not line:
            self.process.wait(10)
            unavailable(
                f"the test's Spark driver exited ({self.process.returncode}):\n"
                f"{self.log.read_text()[-3000:]}"
            )
        reply: dict[str, Any] = json.loads(line)
        return reply

    def run(self, *args: str | Path) -> Reply:
        """``tarry ARGS --master/--remote URL`` in the driver's process."""
        assert self.process.stdin is not None
        with self.lock:
            if not self.ready:
                self._reply()
                self.ready = True
            self.process.stdin.write(json.dumps([str(a) for a in args]) + "\n")
            self.process.stdin.flush()
            return Reply(**self._reply())

    def ok(self, *args: str | Path) -> str:
        """``run`` with ``--json``, which must succeed: its standard output."""
        reply = self.run(*args, "--json")
        assert reply.exit_code == 0, reply.stderr[-4000:]
        return reply.stdout

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.replies.close()


class Cluster:
    """``scripts/spark-cluster start`` of 2 workers (3 cores each) with the Connect server
    (``APP_CORES`` of them, executors on ``python``), begun in the background; the workers see
    each directory of ``hide`` empty. ``drivers`` starts the tests' long-lived drivers as soon
    as the cluster is up (also in the background)."""

    def __init__(self, state: Path, *, python: str, hide: list[Path]) -> None:
        self.state = state
        self.python = python
        self.hidden = hide
        command = [sys.executable, str(SCRIPT), "start", "--workers", "2", "--cores", "3"]
        command += ["--worker-memory", "3g", "--timeout", "90", "--state", str(state)]
        command += ["--connect", "--connect-cores", str(APP_CORES), "--python", python]
        command += ["--conf", LIGHT_EXECUTORS]
        for directory in hide:
            command += ["--hide", str(directory)]
        self.starting = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self._urls: dict[str, str] | None = None
        self._failure = ""
        self._drivers: dict[str, Driver] = {}
        self._up = threading.Thread(target=self._start_drivers, daemon=True)
        self._up.start()

    def _start_drivers(self) -> None:
        out, err = self.starting.communicate()
        if self.starting.returncode != 0:
            logs = "".join(
                f"\n--- {log.name}\n{log.read_text()[-1500:]}" for log in self.state.glob("*.log")
            )
            self._failure = f"the local Spark cluster did not start: {err}{logs}"
            return
        self._urls = dict(line.split() for line in out.splitlines() if line.strip())
        for name, option in (("master", "--master"), ("connect", "--remote")):
            log = self.state / f"driver-{name}.log"
            self._drivers[name] = Driver([option, self._urls[name]], python=self.python, log=log)

    def driver(self, name: str) -> Driver:
        """The long-lived driver on the ``master`` or over ``connect``."""
        self._up.join()
        if self._failure:
            unavailable(self._failure)
        return self._drivers[name]

    def url(self, name: str) -> str:
        self._up.join()
        if self._urls is None:
            unavailable(self._failure)
        assert self._urls is not None
        return self._urls[name]

    def stop(self) -> None:
        self._up.join()
        for driver in self._drivers.values():
            driver.close()
        subprocess.run([sys.executable, str(SCRIPT), "stop", "--state", str(self.state)])


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


def local(*args: str | Path) -> str:
    """``tarry ARGS --json`` on ``local[2]`` in this process (the tests' session), which must
    succeed: its output."""
    from click.testing import CliRunner

    from tarry.cli.main import cli

    result = CliRunner().invoke(cli, [*map(str, args), "--master", "local[2]", "--json"])
    assert result.exit_code == 0, result.output
    return result.stdout


def summary_of(output: str) -> dict[str, Any]:
    """The ``--json`` summary, without the fields that depend on the run."""
    data: dict[str, Any] = json.loads(output[output.index("{") :])
    return {k: v for k, v in data.items() if k not in RUN_FIELDS}


def table(path: Path, *order: str) -> pa.Table:
    """A Parquet dataset sorted by ``order`` (the order of rows in files is the tasks')."""
    return pq.read_table(path).sort_by([(c, "ascending") for c in order])


def declare(url: str) -> None:
    """The queues and the topic (with its two subscriptions) the input names."""
    for queue in QUEUES:
        httpx.put(f"{url}/v1/queues/{queue}").raise_for_status()
    httpx.put(f"{url}/v1/topics/c.t").raise_for_status()
    for queue in ("c.s1", "c.s2"):
        httpx.put(f"{url}/v1/topics/c.t/subscriptions/{queue}").raise_for_status()


def stored(url: str) -> int:
    """Messages the server holds, in any state (some fall due while a test runs)."""
    return sum(httpx.get(f"{url}/v1/stats").json()["messages"].values())


def segments(data: Path) -> list[tuple[Any, ...]]:
    """Every message in the data directory's import areas (ids aside: each run draws its own)."""
    from tarry.store.log.record import Record, decode_message, scan

    found = []
    for path in (data / "log" / "imports").rglob("*.log"):
        for record in scan(path.read_bytes()):
            if isinstance(record, Record):
                m = decode_message(record.payload)[0]
                found.append(
                    (m.destination, m.topic, m.message_id, m.deliver_at_ms, m.expires_at_ms, m.body)
                )
    return sorted(found, key=repr)


def write_input(path: Path, now_ms: int, *, rows: int = 4_000) -> None:
    """``rows`` rows in 4 row groups over 3 queues and a topic of 2 subscriptions: about 1 % repeat
    an earlier message_id (some in another row group), 1 % name no known destination, 1 % give
    both deliver_at and delay_ms, some without a message_id (the id is derived). Every message
    falls due an hour or more after ``now_ms``: none is released while the tests count what a
    server holds (a release in flight is counted in two states for a moment)."""
    ids = [f"m{i}" for i in range(rows)]
    for i in range(0, rows, 97):
        ids[i] = f"m{(i * 7919) % max(1, i)}" if i else ids[i]
    destinations = [("c.q1", "c.q2", "c.q3", "c.t")[i % 4] for i in range(rows)]
    for i in range(5, rows, 101):
        destinations[i] = "c.nowhere"
    hour = 3_600_000
    deliver_at = [
        now_ms + hour + (i * 7_919_993) % (48 * hour) if i % 2 else None for i in range(rows)
    ]
    delay = [None if i % 2 else hour + (i * 104_729) % (6 * hour) for i in range(rows)]
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


@dataclass
class Reference:
    """``local[2]``'s runs on the session's input, which every cluster run must equal.

    ``catalog``: a data directory with the destinations declared and nothing else (each
    offline import copies it); ``imports``: the import's arguments without a sink; ``report``:
    the report's arguments without ``--out``; and what local[2] made of each."""

    root: Path
    catalog: Path
    imports: list[str]
    report: list[str]
    offline: dict[str, Any] = field(default_factory=dict)
    offline_rejects: pa.Table | None = None
    offline_segments: list[tuple[Any, ...]] = field(default_factory=list)
    online: dict[str, Any] = field(default_factory=dict)
    online_rejects: pa.Table | None = None
    online_stored: int = 0
    report_summary: dict[str, Any] = field(default_factory=dict)

    def data_dir(self, where: Path) -> Path:
        """A fresh copy of ``catalog`` at ``where``."""
        shutil.copytree(self.catalog, where)
        return where
