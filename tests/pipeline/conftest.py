"""Shared fixtures: one SparkSession for the whole test run (local[2], tiny shuffles, a light
JVM); and, for the cluster tests, one local standalone cluster with the Spark Connect server and
``local[2]``'s reference results, made once per session (``clusters``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import ServerProcess
from tests.pipeline import clusters


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


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[clusters.Cluster]:
    """The session's standalone cluster and Connect server, begun in the background (the tests
    ask it for a driver or a URL, which waits for it); its workers see ``hidden`` empty, where
    this machine lets them have a mount namespace of their own."""
    unseen = tmp_path_factory.mktemp("unseen")
    cluster = clusters.Cluster(
        tmp_path_factory.mktemp("spark-cluster"),
        python=clusters.bare_python(),
        hide=[unseen] if clusters.can_hide(unseen) else [],
    )
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def reference(
    spark_cluster: clusters.Cluster, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> clusters.Reference:
    """``local[2]``'s import into a data directory and into a server, and its report, on the
    session's input (computed while the cluster starts)."""
    from tests.pipeline.test_report import NOW, journals

    root = tmp_path_factory.mktemp("reference")
    now_ms = int(time.time()) // 60 * 60_000
    clusters.write_input(root / "in.parquet", now_ms)
    journals(root)  # node-a as a data directory, node-b's journal file (torn last line)
    ref = clusters.Reference(
        root=root,
        catalog=root / "catalog",
        imports=["pipeline", "import", str(root / "in.parquet"), "--now", str(now_ms)]
        + clusters.SHUFFLE,
        report=["pipeline", "report", "--data", str(root / "node-a"), "--now", str(NOW)]
        + ["--journal", str(root / "node-b" / "journal-2-b.jsonl.open"), *clusters.SHUFFLE],
    )
    server = ServerProcess(ref.catalog, config=None, env=None, args=[])
    clusters.declare(server.url)
    server.stop()

    data = ref.data_dir(root / "offline")
    output = clusters.local(*ref.imports, "--into", data, "--rejects", root / "offline-rejects")
    ref.offline = clusters.summary_of(output)
    ref.offline_rejects = clusters.table(root / "offline-rejects", "row")
    ref.offline_segments = clusters.segments(data)
    # the input holds each case the import sorts out
    assert ref.offline["rows_read"] == 4_000 and ref.offline["duplicates"] > 0
    assert ref.offline["rejected"]
    rejected = sum(ref.offline["rejected"].values()) + ref.offline["duplicates"]
    assert ref.offline_rejects.num_rows == rejected

    server = ServerProcess(ref.data_dir(root / "online"), config=None, env=None, args=[])
    try:
        output = clusters.local(
            *ref.imports, "--to", server.url, "--rejects", root / "online-rejects"
        )
        ref.online = clusters.summary_of(output)
        ref.online_rejects = clusters.table(root / "online-rejects", "row")
        ref.online_stored = clusters.stored(server.url)
    finally:
        server.stop()
    assert ref.online["created"] == ref.online["accepted"] > 0
    assert ref.online_stored == ref.online["copies"]

    ref.report_summary = clusters.summary_of(clusters.local(*ref.report, "--out", root / "report"))
    return ref
