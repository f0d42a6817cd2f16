"""`tarry store inspect DIR` and `tarry store verify DIR` on real store files."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tarry.cli.main import cli
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
