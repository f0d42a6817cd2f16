"""``tarry pipeline import`` and ``report`` on a standalone Spark cluster (``--master spark://``)
whose executors run a bare Python without tarry: the code they need is shipped with the job,
the results equal ``local[2]``'s row for row, reruns store nothing twice, and what the executors
lack (a module, a path) is named before any work (``cluster_runs.ClusterSuite``, and a Python
without pyarrow here)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipeline import clusters
from tests.pipeline.cluster_runs import ClusterSuite

#: The first test also waits for the session's cluster and local[2]'s reference runs.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(400)]


class TestOnAStandaloneClusterWithoutTarry(ClusterSuite):
    mode = "master"


def test_executors_without_pyarrow_fail_at_once_naming_it(
    spark_cluster: clusters.Cluster, reference: clusters.Reference, tmp_path: Path
) -> None:
    # Given executors on a Python with nothing installed (an application of its own)
    empty = tmp_path / "empty-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(empty)], check=True)
    data = reference.data_dir(tmp_path / "data")
    # When an import starts
    started = time.monotonic()
    done = clusters.tarry(
        *reference.imports,
        "--into",
        str(data),
        "--master",
        spark_cluster.url("master"),
        "--rejects",
        str(tmp_path / "rej"),
        python=str(empty / "bin" / "python"),
    )
    # Then it stops before any work, naming what the executors lack, without a traceback
    assert done.returncode != 0
    assert "executors cannot run tarry's tasks" in done.stderr
    assert "No module named 'pyarrow'" in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - started < 120
    assert not list((data / "log" / "imports").rglob("*.log"))
