"""`tarry store inspect DIR` and `tarry store verify DIR` on real store files."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tarry.cli.main import cli
from tarry.store.log.layout import Layout
from tarry.store.log.tools import inspect
from tests.store.test_log_recovery import NOW, crash, message, opened, segments


async def test_inspect_shows_partitions_counts_and_the_snapshot(tmp_path: Path) -> None:
    store = await opened(tmp_path)
    await store.store([message(NOW + 5), message(NOW + 70_000), message(NOW + 80_000)])
    await store.close()  # writes a snapshot
    result = CliRunner().invoke(
        cli, ["store", "inspect", str(tmp_path), "--granularity-ms", "60000", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [p["messages"] for p in data["partitions"]] == [1, 2]
    assert data["pending"] == 3 and data["snapshot"]["seq"] >= 1
    assert data["problems"] == []


async def test_verify_reports_a_damaged_record_and_fixes_nothing(tmp_path: Path) -> None:
    store = await opened(tmp_path)
    await store.store([message(NOW + i, body=b"y" * 100) for i in range(5)])
    store.files.flush()  # the partition's bytes, written behind the WAL
    await crash(store)
    [segment] = segments(tmp_path)
    assert CliRunner().invoke(cli, ["store", "verify", str(tmp_path)]).exit_code == 0
    data = bytearray(segment.read_bytes())
    data[60] ^= 0xFF
    segment.write_bytes(bytes(data))
    before = segment.read_bytes()
    result = CliRunner().invoke(cli, ["store", "verify", str(tmp_path)])
    assert result.exit_code == 1
    assert str(segment) in result.output and "damaged" in result.output
    assert segment.read_bytes() == before  # reported, never fixed silently


async def test_inspect_reads_a_partition_whose_move_into_parts_was_cut_short(
    tmp_path: Path,
) -> None:
    # Given a store whose one partition has several segment files, put back in the layout
    # before flat files (a directory a partition)
    store = await opened(tmp_path, segment_bytes=4096)
    await store.store([message(NOW + 5 + i, body=b"z" * 200) for i in range(60)])
    await store.close()
    parts = tmp_path / "parts"
    files = sorted(parts.glob("*.seg-*.log"))
    assert len(files) >= 3
    named = {f: Layout.parse_segment(f.name) for f in files}
    [key] = {found[0] for found in named.values() if found is not None}
    old = tmp_path / Layout.name_of(key)
    old.mkdir()
    for f, found in named.items():
        assert found is not None
        f.rename(old / f"seg-{found[1]:06d}.log")
    whole = inspect(tmp_path, granularity_ms=60_000)
    assert whole["pending"] == 60 and whole["partitions"][0]["segments"] == len(files)
    # When a start's move was cut short after linking only the first segment into parts/,
    # or after deleting only the first old file once every one was linked
    (parts / Layout.segment_name(key, 0)).hardlink_to(old / "seg-000000.log")
    linking = inspect(tmp_path, granularity_ms=60_000)
    for n in range(1, len(files)):
        (parts / Layout.segment_name(key, n)).hardlink_to(old / f"seg-{n:06d}.log")
    (old / "seg-000000.log").unlink()
    deleting = inspect(tmp_path, granularity_ms=60_000)
    # Then inspect reads every message either way, and moved nothing
    for seen in (linking, deleting):
        assert seen["pending"] == 60, seen["partitions"]
        assert seen["partitions"][0]["segments"] == len(files)
    assert (old / "seg-000001.log").exists()
