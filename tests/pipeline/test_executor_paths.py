"""Which locations the executors' check looks at: local paths (plain or ``file:``) are checked
on every executor; a shared store's URL is handed to Spark untouched. (The check itself, on a
cluster whose executors cannot see a local path: ``test_cluster``, ``test_connect``.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tarry.pipeline.executors import is_local_path, local_path


@pytest.mark.parametrize(
    ("location", "path"),
    [
        ("/data/in.parquet", "/data/in.parquet"),
        (Path("/data/rejects"), "/data/rejects"),
        ("relative/out", "relative/out"),
        ("file:/data/in.parquet", "/data/in.parquet"),
        ("file:///data/in.parquet", "/data/in.parquet"),
    ],
)
def test_a_local_location_is_checked_as_its_file_system_path(
    location: str | Path, path: str
) -> None:
    assert is_local_path(location)
    assert local_path(location) == path


@pytest.mark.parametrize(
    "location",
    [
        "s3a://bucket/in/",
        "gs://bucket/rejects",
        "abfss://container@account.dfs.core.windows.net/out",
        "hdfs://namenode:8020/user/me/in.parquet",
    ],
)
def test_a_shared_store_url_passes_through_unchecked(location: str) -> None:
    assert not is_local_path(location)
    assert local_path(location) is None
