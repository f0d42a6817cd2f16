"""One SparkSession for the whole test run (local[2], tiny shuffles, a light JVM)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tarry.pipeline.session import SparkSettings, spark_session, stop_session

    session = spark_session(
        SparkSettings(
            master="local[2]",
            driver_memory="1g",
            shuffle_partitions=2,
            light_jvm=True,
            work_dir=tmp_path_factory.mktemp("spark"),
            app_name="tarry-tests",
        )
    )
    yield session
    stop_session()
