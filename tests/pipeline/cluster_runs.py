"""What the pipeline must show on a cluster whose executors run a bare Python, whichever way the
cluster is reached: one suite (``ClusterSuite``), run by ``test_cluster`` (``--master
spark://``) and ``test_connect`` (``--remote sc://``). Each test sends its commands to the
long-lived driver of its mode and checks the results against the session's ``local[2]``
reference, row for row."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline import clusters
from tests.pipeline.clusters import Cluster, Driver, Reference

#: The report's tables, and the columns that order their rows.
REPORT_TABLES = {
    "hourly": ("hour_ms", "destination"),
    "lateness": ("hour_ms",),
    "outcomes": ("event",),
    "forecast_minute": ("minute_ms",),
    "forecast_hour": ("hour_ms",),
}


class ClusterSuite:
    """The tests every mode runs; a subclass names its driver (``mode``: ``master`` or
    ``connect``)."""

    mode: str

    @pytest.fixture
    def driver(self, spark_cluster: Cluster, reference: Reference) -> Driver:
        # the reference is asked for first: local[2] computes it while the cluster starts
        return spark_cluster.driver(self.mode)

    def test_offline_import_equals_local_and_reruns_once(
        self, driver: Driver, reference: Reference, tmp_path: Path, make_server: Any
    ) -> None:
        # Given a data directory with the destinations declared
        data = reference.data_dir(tmp_path / "data")
        into = [*reference.imports, "--into", data]
        # When the import runs on the cluster
        summary = clusters.summary_of(driver.ok(*into, "--rejects", tmp_path / "rej"))
        # Then its summary, rejects and segment files are local[2]'s
        assert summary == reference.offline
        assert clusters.table(tmp_path / "rej", "row").equals(reference.offline_rejects)
        assert clusters.segments(data) == reference.offline_segments
        # When it runs again into the same directory
        again = clusters.summary_of(driver.ok(*into, "--rejects", tmp_path / "rej2"))
        assert again == summary
        assert clusters.table(tmp_path / "rej2", "row").equals(reference.offline_rejects)
        # Then the server adopts both import areas and stores every message once
        server = make_server(data_dir=data)
        assert clusters.stored(server.url) == summary["copies"]

    def test_online_import_equals_local_and_reruns_once(
        self, driver: Driver, reference: Reference, tmp_path: Path, make_server: Any
    ) -> None:
        # Given a server with the destinations declared
        server = make_server(data_dir=reference.data_dir(tmp_path / "data"))
        to = [*reference.imports, "--to", server.url]
        # When the import posts from the cluster's executors
        summary = clusters.summary_of(driver.ok(*to, "--rejects", tmp_path / "rej"))
        # Then its summary and rejects are local[2]'s, and the server holds what local[2]'s held
        assert summary == reference.online
        assert clusters.table(tmp_path / "rej", "row").equals(reference.online_rejects)
        assert clusters.stored(server.url) == reference.online_stored
        # When it runs again: every accepted message is already there, nothing is stored twice
        again = clusters.summary_of(driver.ok(*to, "--rejects", tmp_path / "rej2"))
        assert (again["created"], again["already_there"]) == (0, summary["accepted"])
        unchanged = {k: v for k, v in again.items() if k not in ("created", "already_there")}
        assert unchanged == {k: v for k, v in summary.items() if k in unchanged}
        assert clusters.table(tmp_path / "rej2", "row").equals(reference.online_rejects)
        assert clusters.stored(server.url) == reference.online_stored

    def test_report_equals_local(
        self, driver: Driver, reference: Reference, tmp_path: Path
    ) -> None:
        out = tmp_path / "out"
        summary = clusters.summary_of(driver.ok(*reference.report, "--out", out))
        assert summary == reference.report_summary
        for name, order in REPORT_TABLES.items():
            got = clusters.table(out / name, *order)
            assert got.num_rows > 0 or name.startswith("forecast")
            assert got.equals(clusters.table(reference.root / "report" / name, *order)), name
        assert (out / "report.html").stat().st_size > 0

    def test_paths_the_executors_cannot_see_fail_at_once_naming_them(
        self, driver: Driver, spark_cluster: Cluster, reference: Reference, tmp_path: Path
    ) -> None:
        if not spark_cluster.hidden:
            clusters.unavailable(
                "the workers cannot have a mount namespace of their own here (unshare --mount), "
                "so no path can be hidden from them"
            )
        # Given the input, a data directory and --rejects where this machine has them and the
        # executors see an empty directory (as executors on another host would)
        here = spark_cluster.hidden[0] / tmp_path.name
        here.mkdir()
        shutil.copy(reference.root / "in.parquet", here / "in.parquet")
        data = reference.data_dir(here / "data")
        imports = ["pipeline", "import", here / "in.parquet", *reference.imports[3:]]
        # When the import starts
        reply = driver.run(*imports, "--into", data, "--rejects", here / "rej", "--json")
        # Then it stops before any work with invalid_argument, naming each path
        assert reply.exit_code != 0
        assert reply.stderr.startswith("invalid_argument: the Spark executors on "), reply.stderr
        assert "Traceback" not in reply.stderr
        for path in (here / "in.parquet", data / "log" / "imports", here / "rej"):
            assert str(path) in reply.stderr
        assert not list((data / "log" / "imports").rglob("*.log"))
        assert not (here / "rej").exists() or not list((here / "rej").iterdir())
