"""``tarry pipeline import`` and ``report`` over Spark Connect (``--remote sc://``): the Connect
server the pyspark package ships, on a standalone cluster whose executors run a bare Python
without tarry; the results equal ``local[2]``'s row for row."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline import clusters
from tests.pipeline.test_cluster import (
    offline_import_matches_local,
    online_import_matches_local,
    report_matches_local,
)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def bare() -> str:
    return clusters.bare_python()


@pytest.fixture(scope="module")
def remote(bare: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    state = tmp_path_factory.mktemp("spark-connect")
    for urls in clusters.cluster(state, connect=True, python=bare):
        yield urls["connect"]


def test_offline_import_over_spark_connect_equals_local(
    spark: Any, make_server: Any, tmp_path: Path, remote: str, bare: str
) -> None:
    offline_import_matches_local(make_server, tmp_path, ["--remote", remote], bare, rerun=False)


def test_online_import_over_spark_connect_equals_local_and_reruns_once(
    spark: Any, make_server: Any, tmp_path: Path, remote: str, bare: str
) -> None:
    online_import_matches_local(make_server, tmp_path, ["--remote", remote], bare, rerun=True)


def test_report_over_spark_connect_equals_local(
    spark: Any, tmp_path: Path, remote: str, bare: str
) -> None:
    report_matches_local(tmp_path, ["--remote", remote], bare)
