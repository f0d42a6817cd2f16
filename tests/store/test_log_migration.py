"""Log store directories written by earlier versions (``fixtures/make_log_v1.py`` with that
version's code: a snapshot, changes past it, a kill -9) are opened and migrated: every pending
message is kept where it was due, with its body, its de-duplication key, its failure back-off;
the cancelled one stays cancelled; and the directory is in this version's format afterwards.

- ``log-v1``: before the write-ahead log (version-1 manifests, no ``wal/``, a directory per
  fine partition);
- ``log-dirs``: a WAL and coarser partitions far ahead, but a directory per partition (before
  the flat layout: every segment file in ``parts/``, ``migrate.py``).
"""

from __future__ import annotations

import json
import shutil
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tarry.model.ids import IdGenerator
from tarry.model.state import MessageState
from tarry.store.log import LogStore
from tarry.store.log.layout import Layout
from tarry.store.log.manifest import VERSION
from tarry.store.log.tools import inspect, verify
from tests.store.crashfs import CrashFiles, Mode

FIXTURES = Path(__file__).parent / "fixtures"
DAY = 86_400_000
OLD = ["log-v1", "log-dirs"]


def copy_of(tmp_path: Path, name: str) -> tuple[Path, dict[str, Any]]:
    """A copy of fixture ``name`` and what it holds."""
    root = tmp_path / "log"
    shutil.copytree(FIXTURES / name, root)
    return root, json.loads((FIXTURES / f"{name}.json").read_text())


def partition_dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if Layout.parse_name(p.name) is not None)


def manifest_versions(root: Path) -> list[int]:
    paths = sorted((root / "snapshots").glob("manifest-*"))
    return [struct.unpack_from("<I", p.read_bytes(), 8)[0] for p in paths]


@pytest.mark.parametrize("name", OLD)
async def test_a_directory_of_an_earlier_version_is_opened_and_migrated(
    tmp_path: Path, name: str
) -> None:
    # Given a copy of a directory written by an earlier version, its partitions in directories
    root, expected = copy_of(tmp_path, name)
    now = expected["now_ms"]
    dirs = partition_dirs(root)
    assert dirs and not (root / "parts").exists()
    assert (root / "wal").exists() == (name != "log-v1")
    # And the read-only tools read it in place, moving nothing
    assert verify(root)["ok"] and len(
        inspect(root, granularity_ms=expected["granularity_ms"])["partitions"]
    ) == len(dirs)
    assert partition_dirs(root) == dirs
    # When this version opens it
    store = LogStore(root, granularity_ms=expected["granularity_ms"])
    await store.open()
    # Then it is in this version's format at once: a WAL, a checkpoint of this version, every
    # segment file in parts/ (some new: the WAL's tail replayed) and no partition directory left
    assert (root / "wal").is_dir()
    assert manifest_versions(root)[-1] == VERSION
    assert partition_dirs(root) == []
    flat = {p.name for p in (root / "parts").iterdir()}
    assert {Layout.segment_name(Layout.parse_name(d) or 0, 0) for d in dirs} <= flat
    # And every pending message is found by id, with its body and (moved) due time
    for message_id, want in expected["pending"].items():
        got = await store.get(message_id)
        assert got is not None, message_id
        assert (got.body.decode(), got.deliver_at_ms) == (want["body"], want["due"])
    cancelled = await store.get(expected["cancelled"])
    assert cancelled is None or cancelled.state is MessageState.CANCELLED
    # And a message sent again with a message_id it holds is not kept twice
    for message_id, want in expected["pending"].items():
        if want["message_id"] is not None:
            kept = await store.get(message_id)
            assert kept is not None
            again = replace(kept, id=IdGenerator().new_due(now, want["due"]), body=b"again")
            [outcome] = await store.store([again])
            assert not outcome.created and outcome.message.id == message_id
    await store.close()
    # And after a restart in the new format, everything falls due once, never early, and the
    # failure back-off recorded by the previous version still holds
    store = LogStore(root, granularity_ms=expected["granularity_ms"])
    await store.open()
    released: dict[str, int] = {}
    times = sorted({w["due"] for w in expected["pending"].values()} | {now + 59_999, now + 60_000})
    for now_ms in times:
        for got in await store.fetch_due(now_ms, limit=100, lease_ms=400 * DAY):
            assert got.id != expected["cancelled"]
            due = expected["pending"][got.id]["due"]
            retry_at = expected["failed"].get(got.id, due)
            assert now_ms >= max(due, retry_at), (got.id, now_ms)
            if got.id in expected["failed"]:
                assert got.failures == 1
            released[got.id] = released.get(got.id, 0) + 1
    assert released == {message_id: 1 for message_id in expected["pending"]}
    assert await store.check() == []
    await store.close()
    assert verify(root)["ok"], verify(root)


@pytest.mark.parametrize("name", OLD)
async def test_a_migrated_directory_keeps_the_old_snapshot_until_a_new_one_supersedes_it(
    tmp_path: Path, name: str
) -> None:
    # Given a copy of an earlier version's directory, opened by this version
    root, expected = copy_of(tmp_path, name)
    store = LogStore(root, granularity_ms=expected["granularity_ms"])
    await store.open()
    # When it is closed cleanly and opened again
    await store.close()
    store = LogStore(root, granularity_ms=expected["granularity_ms"])
    await store.open()
    # Then it starts from its own checkpoints (the version-1 manifests are superseded) and
    # still holds every pending message
    assert set(manifest_versions(root)) == {VERSION}
    assert await store.count_scheduled() == len(expected["pending"])
    await store.close()


def seeded(fs: CrashFiles, name: str) -> Path:
    """Fixture ``name`` written under ``fs.base / "log"`` through ``fs``, every byte and entry
    durable (the trace's first changes)."""
    source, root = FIXTURES / name, fs.base / "log"
    directories = [root]
    fs.mkdir(root)
    for path in sorted(source.rglob("*")):
        out = root / path.relative_to(source)
        if path.is_dir():
            fs.mkdir(out)
            directories.append(out)
        else:
            fs.write_file(out, path.read_bytes(), what="probe")
    for directory in sorted(directories, key=lambda d: -len(d.parts)):
        fs.fsync_dir(directory)
    fs.fsync_dir(fs.base)
    return root


@pytest.mark.parametrize("mode", ["drop", "prefix"])
async def test_a_power_loss_during_the_move_into_the_flat_layout_loses_nothing(
    tmp_path: Path, mode: Mode
) -> None:
    # Given a directory with a directory a partition, opened (and so moved into parts/) by this
    # version, every change recorded
    base = tmp_path / "live"
    base.mkdir()
    fs = CrashFiles(base)
    root = seeded(fs, "log-dirs")
    expected = json.loads((FIXTURES / "log-dirs.json").read_text())
    first = len(fs.ops)
    store = LogStore(root, granularity_ms=expected["granularity_ms"], fs=fs)
    await store.open()
    await store.close()
    assert any(op.kind == "link" for op in fs.ops[first:])
    # When the power fails at any point of it, then the next start holds every message, and
    # no partition directory is left
    for point in [p for p in fs.crash_points() if p >= first]:
        target = tmp_path / f"crash-{point}"
        target.mkdir()
        fs.disk_after(point, target, mode=mode, seed=point)
        store = LogStore(target / "log", granularity_ms=expected["granularity_ms"])
        await store.open()
        assert partition_dirs(target / "log") == [], point
        assert await store.count_scheduled() == len(expected["pending"]), point
        for message_id in expected["pending"]:
            assert await store.get(message_id) is not None, (point, message_id)
        await store.close()
