"""``tarry pipeline import`` and ``report`` over Spark Connect (``--remote sc://``): the Connect
server the pyspark package ships, on a standalone cluster whose executors run a bare Python
without tarry; the results equal ``local[2]``'s row for row, reruns store nothing twice, and a
path the executors cannot see is named before any work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.pipeline import cluster_runs, clusters

pytestmark = [pytest.mark.spark, pytest.mark.timeout(400)]


@pytest.fixture
def driver(spark_cluster: clusters.Cluster, reference: clusters.Reference) -> clusters.Driver:
    return spark_cluster.driver("connect")


def test_offline_import_over_spark_connect_equals_local_and_reruns_once(
    driver: clusters.Driver, reference: clusters.Reference, tmp_path: Path, make_server: Any
) -> None:
    cluster_runs.offline_import_equals_local_and_reruns_once(
        driver, reference, tmp_path, make_server
    )


def test_online_import_over_spark_connect_equals_local_and_reruns_once(
    driver: clusters.Driver, reference: clusters.Reference, tmp_path: Path, make_server: Any
) -> None:
    cluster_runs.online_import_equals_local_and_reruns_once(
        driver, reference, make_server, tmp_path
    )


def test_report_over_spark_connect_equals_local(
    driver: clusters.Driver, reference: clusters.Reference, tmp_path: Path
) -> None:
    cluster_runs.report_equals_local(driver, reference, tmp_path)


def test_paths_the_executors_cannot_see_over_spark_connect_fail_at_once_naming_them(
    driver: clusters.Driver,
    spark_cluster: clusters.Cluster,
    reference: clusters.Reference,
    tmp_path: Path,
) -> None:
    cluster_runs.paths_the_executors_cannot_see_are_named(
        driver, reference, spark_cluster.hidden[0], tmp_path
    )
