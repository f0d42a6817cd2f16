"""``tarry pipeline import`` and ``report`` on a standalone Spark cluster (``--master spark://``)
whose executors run a bare Python without tarry: the code they need is shipped with the job, and
the results equal ``local[2]``'s row for row."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from tarry.cli.main import cli
from tests.pipeline import clusters
from tests.pipeline.test_report import NOW, journals

#: Each test starts several Spark drivers of its own (a JVM each) on a 2-core machine.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def bare() -> str:
    return clusters.bare_python()


@pytest.fixture(scope="module")
def master(bare: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    state = tmp_path_factory.mktemp("spark-cluster")
    for urls in clusters.cluster(state, connect=False, python=bare):
        yield urls["master"]


def _declare(url: str) -> None:
    for queue in ("c.q1", "c.q2", "c.q3", "c.s1", "c.s2"):
        httpx.put(f"{url}/v1/queues/{queue}").raise_for_status()
    httpx.put(f"{url}/v1/topics/c.t").raise_for_status()
    for queue in ("c.s1", "c.s2"):
        httpx.put(f"{url}/v1/topics/c.t/subscriptions/{queue}").raise_for_status()


def _stored(url: str) -> int:
    """Messages the server holds, in any state (some fall due while a test runs)."""
    return sum(httpx.get(f"{url}/v1/stats").json()["messages"].values())


def _local(*args: str) -> str:
    """The same command on ``local[2]``, in this process (the tests' session)."""
    result = CliRunner().invoke(cli, [*args, "--master", "local[2]", "--json"])
    assert result.exit_code == 0, result.output
    return result.output


def _on_cluster(*args: str, where: list[str], python: str) -> str:
    done = clusters.tarry(*args, *where, "--json", python=python)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout


def _segments(data: Path) -> list[tuple[Any, ...]]:
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


def offline_import_matches_local(
    make_server: Any, tmp_path: Path, where: list[str], python: str, *, rerun: bool
) -> None:
    """Shared with the Spark Connect tests: an offline import on the cluster (``where``: the
    --master or --remote option) equals local[2]'s; with ``rerun``, run again, the server adopts
    both areas and stores every message once. (Each cluster run starts a Spark driver, so the
    reruns are split between these tests and Connect's.)"""
    now_ms = int(time.time()) // 60 * 60_000
    data = tmp_path / "data"
    server = make_server(data_dir=data)
    _declare(server.url)
    server.stop()
    shutil.copytree(data, tmp_path / "local-data")
    clusters.write_input(tmp_path / "in.parquet", now_ms, rows=8_000)
    common = ["pipeline", "import", str(tmp_path / "in.parquet"), "--now", str(now_ms)]

    local = _local(
        *common, "--into", str(tmp_path / "local-data"), "--rejects", str(tmp_path / "rej-local")
    )
    on_cluster = _on_cluster(
        *common, "--into", str(data), "--rejects", str(tmp_path / "rej"), where=where, python=python
    )
    summary = clusters.summary_of(on_cluster)
    assert summary == clusters.summary_of(local)
    assert summary["rows_read"] == 8_000 and summary["duplicates"] > 0 and summary["rejected"]
    rejects = clusters.table(tmp_path / "rej", "row")
    assert rejects.num_rows == sum(summary["rejected"].values()) + summary["duplicates"]
    assert rejects.equals(clusters.table(tmp_path / "rej-local", "row"))
    assert _segments(data) == _segments(tmp_path / "local-data")
    if not rerun:
        server.start()
        assert _stored(server.url) == summary["copies"]
        return

    again = _on_cluster(
        *common,
        "--into",
        str(data),
        "--rejects",
        str(tmp_path / "rej2"),
        where=where,
        python=python,
    )
    assert clusters.summary_of(again) == summary
    server.start()  # adopts both import areas: the second holds only repeats of the first
    assert _stored(server.url) == summary["copies"]


def online_import_matches_local(
    make_server: Any, tmp_path: Path, where: list[str], python: str, *, rerun: bool
) -> None:
    """The online sink from the cluster's executors into a real server (with ``rerun``, twice:
    nothing is stored twice); and local[2]'s run into another server, the same rows refused."""
    now_ms = int(time.time()) // 60 * 60_000
    servers = [make_server(), make_server()]
    for server in servers:
        _declare(server.url)
    clusters.write_input(tmp_path / "in.parquet", now_ms, rows=4_000)
    common = ["pipeline", "import", str(tmp_path / "in.parquet"), "--now", str(now_ms)]

    local = _local(*common, "--to", servers[0].url, "--rejects", str(tmp_path / "rej-local"))
    sink = ["--to", servers[1].url]
    first = _on_cluster(
        *common, *sink, "--rejects", str(tmp_path / "rej"), where=where, python=python
    )
    summary = clusters.summary_of(first)
    assert summary == clusters.summary_of(local)
    assert summary["created"] == summary["accepted"] > 0 and summary["already_there"] == 0
    rejects = clusters.table(tmp_path / "rej", "row")
    assert rejects.equals(clusters.table(tmp_path / "rej-local", "row"))
    assert _stored(servers[1].url) == summary["copies"]
    if not rerun:
        return

    again = _on_cluster(
        *common, *sink, "--rejects", str(tmp_path / "rej2"), where=where, python=python
    )
    rerun = clusters.summary_of(again)
    assert (rerun["created"], rerun["already_there"]) == (0, summary["accepted"])
    assert _stored(servers[1].url) == summary["copies"]


def report_matches_local(tmp_path: Path, where: list[str], python: str) -> None:
    """The report's tables from the cluster equal local[2]'s, row for row."""
    journals(tmp_path)  # node-a as a data directory, node-b's journal file (torn last line)
    common = ["pipeline", "report", "--data", str(tmp_path / "node-a"), "--now", str(NOW)]
    common += ["--journal", str(tmp_path / "node-b" / "journal-2-b.jsonl.open")]
    local = _local(*common, "--out", str(tmp_path / "local"))
    on_cluster = _on_cluster(*common, "--out", str(tmp_path / "out"), where=where, python=python)
    assert clusters.summary_of(on_cluster) == clusters.summary_of(local)
    orders = {
        "hourly": ("hour_ms", "destination"),
        "lateness": ("hour_ms",),
        "outcomes": ("event",),
        "forecast_minute": ("minute_ms",),
        "forecast_hour": ("hour_ms",),
    }
    for name, order in orders.items():
        got = clusters.table(tmp_path / "out" / name, *order)
        assert got.num_rows > 0 or name.startswith("forecast")
        assert got.equals(clusters.table(tmp_path / "local" / name, *order)), name
    assert (tmp_path / "out" / "report.html").stat().st_size > 0


def test_offline_import_on_a_cluster_without_tarry_equals_local_and_reruns_once(
    spark: Any, make_server: Any, tmp_path: Path, master: str, bare: str
) -> None:
    offline_import_matches_local(make_server, tmp_path, ["--master", master], bare, rerun=True)


def test_online_import_on_a_cluster_without_tarry_equals_local(
    spark: Any, make_server: Any, tmp_path: Path, master: str, bare: str
) -> None:
    online_import_matches_local(make_server, tmp_path, ["--master", master], bare, rerun=False)


def test_report_on_a_cluster_equals_local(
    spark: Any, tmp_path: Path, master: str, bare: str
) -> None:
    report_matches_local(tmp_path, ["--master", master], bare)


def test_executors_without_pyarrow_fail_at_once_naming_it(
    spark: Any, make_server: Any, tmp_path: Path, master: str
) -> None:
    # Given executors on a Python with nothing installed
    empty = tmp_path / "empty-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(empty)], check=True)
    clusters.write_input(tmp_path / "in.parquet", 1_800_000_000_000, rows=100)
    server = make_server()
    _declare(server.url)
    # When an import starts
    started = time.monotonic()
    done = clusters.tarry(
        "pipeline",
        "import",
        str(tmp_path / "in.parquet"),
        "--to",
        server.url,
        "--master",
        master,
        "--rejects",
        str(tmp_path / "rej"),
        python=str(empty / "bin" / "python"),
    )
    # Then it stops before any work, naming what the executors lack, without a traceback
    assert done.returncode != 0
    assert "executors cannot run tarry's tasks" in done.stderr
    assert "No module named 'pyarrow'" in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - started < 120
    assert _stored(server.url) == 0
