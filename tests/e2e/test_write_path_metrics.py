"""Against a real `tarry serve` on the log store: /metrics shows the write path (fsyncs by what
they made durable, group commits, WAL bytes, snapshot and checkpoint durations)."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from tests.conftest import ServerProcess

SNAPSHOTS_OFTEN = (
    '[store]\nengine = "log"\nsnapshot_interval_ms = 200\n[dispatch]\nmax_sleep_ms = 100\n'
)


def samples(url: str) -> dict[str, float]:
    """Every sample of /metrics by its name with labels (``name{label="x"}``)."""
    out = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_count_the_log_stores_fsyncs_group_commits_and_snapshot_durations(
    make_server: Callable[..., ServerProcess],
) -> None:
    # Given a log store server that snapshots every 200 ms (the dispatcher looks every 100)
    server = make_server(SNAPSHOTS_OFTEN)
    before = samples(server.url)
    # When one batch is sent, due in one partition, and a snapshot has had time to run
    with httpx.Client(base_url=server.url, timeout=30) as client:
        client.put("/v1/queues/q", json={}).raise_for_status()
        batch = [{"destination": "q", "body": "x", "delay_ms": 3_600_000} for _ in range(50)]
        client.post("/v1/messages/batch", json={"messages": batch}).raise_for_status()
    deadline = time.monotonic() + 10
    while True:
        after = samples(server.url)
        if after.get("tarry_store_snapshot_seconds_count", 0) >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    # Then the batch's group commit and its WAL fsync are counted, with its WAL bytes, and so
    # is the checkpoint: the partition it fsynced, its new directories, its parts and manifest
    wal = 'tarry_store_fsyncs_total{what="wal"}'
    directory = 'tarry_store_fsyncs_total{what="directory"}'
    assert after["tarry_store_group_commits_total"] >= before["tarry_store_group_commits_total"] + 1
    durable = "tarry_store_durable_group_commits_total"
    assert after[durable] >= before[durable] + 1
    assert after[wal] - before.get(wal, 0) == after[durable] - before[durable]
    assert after['tarry_store_fsyncs_total{what="wal_segment"}'] >= 2  # at open, at a checkpoint
    assert after[wal] >= before.get(wal, 0) + 1
    assert after["tarry_store_wal_bytes_total"] >= before["tarry_store_wal_bytes_total"] + 50 * 40
    assert after[directory] >= before.get(directory, 0) + 2
    assert after["tarry_store_snapshot_seconds_count"] >= 1, after
    assert after["tarry_store_checkpoint_seconds_count"] >= 1, after
    assert after['tarry_store_fsyncs_total{what="partition"}'] >= 1
    assert after['tarry_store_fsyncs_total{what="checkpoint"}'] >= 2
    assert (
        after['tarry_store_snapshot_seconds_bucket{le="+Inf"}']
        == after["tarry_store_snapshot_seconds_count"]
    )
    assert after["tarry_store_snapshot_seconds_sum"] > 0


def test_metrics_of_a_sqlite_store_have_no_log_store_figures(
    make_server: Callable[..., ServerProcess],
) -> None:
    # Given a server on the SQLite store, when /metrics is read
    server = make_server('[store]\nengine = "sqlite"\n')
    text = httpx.get(server.url + "/metrics").text
    # Then it has no log store write path figures (and renders)
    assert "tarry_messages" in text
    assert "tarry_store_fsyncs_total" not in text
