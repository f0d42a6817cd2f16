"""Adopting bulk-import areas (``tarry pipeline import --into``) at start: all or nothing, once
per message, and a crash in the middle rolls forward. Areas are built here with the same codec
the pipeline's executors use; the Spark path runs end to end in tests/pipeline."""

from __future__ import annotations

import os
from pathlib import Path

import google_crc32c
import numpy as np
import orjson
import pytest

from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.store.log import LogStore
from tarry.store.log.adopt import (
    IMPORT_LEGACY_VERSION,
    IMPORT_MAGIC,
    PLAN,
    ImportManifest,
    write_manifest,
)
from tarry.store.log.held import dedupe_hash
from tarry.store.log.layout import Layout
from tarry.store.log.manifest import frame
from tarry.store.log.record import encode_message
from tests.store.test_log_recovery import NOW, G, crash, keyed, opened


def area_with(
    root: Path, name: str, messages: list[Message], *, granularity_ms: int = G, legacy: bool = False
) -> Path:
    """An import area as the pipeline writes it: one file per partition of the store's layout
    (``Layout.keys_for``, the pipeline's call), or, ``legacy``, per ``due // granularity`` in a
    version-1 manifest (an import written before the layout)."""
    area = root / "imports" / name
    files = []
    by_partition: dict[int, list[Message]] = {}
    dues = np.array([m.deliver_at_ms for m in messages], np.int64)
    keys = dues // granularity_ms if legacy else Layout(granularity_ms).keys_for(dues, NOW)
    for m, key in zip(messages, keys.tolist(), strict=True):
        by_partition.setdefault(key, []).append(m)
    for key, group in sorted(by_partition.items()):
        # flat, named for the partition; before the flat layout, a directory a partition
        name = f"p-{key:010d}/task-0.log" if legacy else f"{Layout.name_of(key)}.task-0.log"
        path = area / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = b"".join(encode_message(m, dedupe_hash(m)) for m in group)
        path.write_bytes(data)
        files.append(
            {
                "name": str(path.relative_to(area)),
                "partition": key,
                "bytes": len(data),
                "crc": google_crc32c.value(data),
                "records": len(group),
            }
        )
    manifest = ImportManifest(name, NOW, granularity_ms, files)
    if legacy:
        body = orjson.dumps(
            {"import": name, "created_ms": NOW, "granularity_ms": granularity_ms, "files": files}
        )
        area.mkdir(parents=True, exist_ok=True)
        (area / "IMPORT").write_bytes(
            frame(body, magic=IMPORT_MAGIC, version=IMPORT_LEGACY_VERSION)
        )
    else:
        write_manifest(area, manifest)
    return area


async def drain(store: LogStore) -> list[str]:
    """Every message due by NOW + 10 partitions (overdue partitions are indexed a few per call)."""
    keys: list[str] = []
    for _ in range(5):
        keys += [
            m.message_id or "" for m in await store.fetch_due(NOW + 10 * G, limit=10, lease_ms=1000)
        ]
    return sorted(keys)


async def test_an_import_is_adopted_next_to_live_messages_and_only_once(tmp_path: Path) -> None:
    store = await opened(tmp_path)
    live = keyed(NOW + 10, "live")
    await store.store([live])
    await store.close()
    imported = [keyed(NOW + 20, "a"), keyed(NOW + 5 * G, "b"), keyed(NOW + 30, "live")]
    area_with(tmp_path, "import-1", imported)
    store = await opened(tmp_path)
    assert not (tmp_path / "imports" / "import-1").exists()
    # "live" was already held: the import's copy of it is dropped
    assert await drain(store) == ["a", "b", "live"]
    assert (await store.get(imported[1].id)) is not None
    assert await store.check() == []
    await store.close()


@pytest.mark.parametrize("nested", [False, True])
async def test_a_crash_after_the_plan_rolls_forward(tmp_path: Path, nested: bool) -> None:
    # (nested: the plan, and the file it moved, of a tarry with a directory a partition: the
    # start moves that file into parts/ first, then finishes the plan there)
    store = await opened(tmp_path)
    await store.close()
    area = area_with(tmp_path, "import-2", [keyed(NOW + 20, "a"), keyed(NOW + 3 * G, "b")])
    # One import adopted, then a crash (no closing snapshot)
    store = await opened(tmp_path)
    await crash(store)
    assert not area.exists()
    # A second import whose adoption died between its two moves: the plan written, one moved
    area = area_with(tmp_path, "import-3", [keyed(NOW + 40, "c"), keyed(NOW + 4 * G, "d")])
    sources = sorted(area.rglob("*.log"))
    keys = [Layout.level0((NOW + 40) // G), Layout.level0((NOW + 4 * G) // G)]
    if nested:
        targets = [f"{Layout.name_of(keys[0])}/seg-000001.log"]
        targets += [f"{Layout.name_of(keys[1])}/seg-000000.log"]
    else:
        targets = [
            f"parts/{Layout.segment_name(key, n)}" for key, n in zip(keys, [1, 0], strict=True)
        ]
    plan = [
        [str(s.relative_to(area)), t, k] for s, t, k in zip(sources, targets, keys, strict=True)
    ]
    (area / PLAN).write_bytes(orjson.dumps(plan))
    (tmp_path / targets[0]).parent.mkdir(exist_ok=True)
    os.replace(sources[0], tmp_path / targets[0])
    store = await opened(tmp_path)
    assert await drain(store) == ["a", "b", "c", "d"]
    assert not area.exists()
    assert not [p for p in tmp_path.iterdir() if Layout.parse_name(p.name) is not None]
    await store.close()


async def test_a_damaged_import_is_refused_whole(tmp_path: Path) -> None:
    area = area_with(tmp_path, "import-4", [keyed(NOW + 20, "a"), keyed(NOW + 3 * G, "b")])
    victim = sorted(area.rglob("*.log"))[1]
    raw = bytearray(victim.read_bytes())
    raw[40] ^= 1
    victim.write_bytes(bytes(raw))
    store = await opened(tmp_path)
    assert await drain(store) == []
    assert any("import refused" in d for d in store.damaged)
    assert area.exists()  # left for an operator to look at
    await store.close()


YEAR = 365 * 86_400_000


async def test_a_year_of_imported_due_times_fills_few_partitions_and_a_restart_keeps_them(
    tmp_path: Path,
) -> None:
    # Given an import of 5,000 messages due over a year into 5-minute partitions (105,120 of
    # them if each were its own)
    g = 300_000
    rng = np.random.default_rng(3)
    dues = sorted(NOW + 1_000 + int(d) for d in rng.integers(0, YEAR, 5_000))
    imported = [keyed(due, f"y{i}") for i, due in enumerate(dues)]
    area = area_with(tmp_path, "import-year", imported, granularity_ms=g)
    # When a store adopts it
    store = LogStore(tmp_path, granularity_ms=g)
    await store.open()
    # Then its partitions are the write path's own, a few hundred at most, and all are counted
    assert not area.exists()
    layout = store.layout
    assert set(store.partitions) == {layout.key_for(d, NOW) for d in dues}
    assert len(store.partitions) < 250, len(store.partitions)
    levels = {p.name.split("-")[0] for p in (tmp_path / "parts").glob("p*-*")}
    assert "p5" in levels and levels <= {"p", "p1", "p2", "p3", "p4", "p5"}, levels
    assert await store.count_scheduled() == 5_000
    # And a checkpoint was written at once: after a kill -9, the restart reads nothing again
    await crash(store)
    store = LogStore(tmp_path, granularity_ms=g)
    await store.open()
    assert store.state.replayed_records == 0
    assert await store.count_scheduled() == 5_000
    for m in imported[::250] + imported[-3:]:
        got = await store.get(m.id)
        assert got is not None and got.deliver_at_ms == m.deliver_at_ms
    # And, as time passes over the year, each is released once, when due: not before, and
    # not a step later (the coarse partitions far ahead are indexed as they come near)
    released: list[str] = []
    previous = NOW
    for step in range(1, 101):
        now = NOW + step * (YEAR + 2_000) // 100
        while batch := await store.fetch_due(now, limit=1_000, lease_ms=YEAR):
            assert all(previous < m.deliver_at_ms <= now for m in batch)
            released += [m.id for m in batch]
            await store.remove([m.id for m in batch], state=MessageState.DELIVERED, now_ms=now)
        previous = now
    assert sorted(released) == sorted(m.id for m in imported)
    assert await store.check() == []
    await store.close()


async def test_an_import_written_before_the_layout_is_adopted_into_fine_partitions(
    tmp_path: Path,
) -> None:
    # Given a version-1 area (partitions numbered due // granularity), one message far ahead
    imported = [keyed(NOW + 20, "a"), keyed(NOW + 40 * 86_400_000, "far")]
    area_with(tmp_path, "import-v1", imported, legacy=True)
    # When a store adopts it
    store = await opened(tmp_path)
    # Then each went to the level-0 partition it was written for, and is found
    assert set(store.partitions) == {Layout.level0(m.deliver_at_ms // G) for m in imported}
    assert (await store.get(imported[1].id)) is not None
    assert await drain(store) == ["a"]
    await store.close()


async def test_an_import_whose_file_does_not_fit_its_partition_is_refused_whole(
    tmp_path: Path,
) -> None:
    # Given an area whose manifest names a file outside a partition directory, and another
    # whose file holds a message due outside its partition's window
    outside = area_with(tmp_path, "import-5", [keyed(NOW + 20, "a")])
    entry = ImportManifest.decode((outside / "IMPORT").read_bytes())
    moved = outside / "elsewhere.log"
    (outside / entry.files[0]["name"]).rename(moved)
    entry.files[0]["name"] = "elsewhere.log"
    write_manifest(outside, entry)
    wrong = area_with(tmp_path, "import-6", [keyed(NOW + 3 * G, "b")])
    manifest = ImportManifest.decode((wrong / "IMPORT").read_bytes())
    [file] = manifest.files
    data = encode_message(keyed(NOW + 9 * G, "c"), 0)
    (wrong / file["name"]).write_bytes(data)
    file.update(bytes=len(data), crc=google_crc32c.value(data))
    write_manifest(wrong, manifest)
    # When a store opens
    store = await opened(tmp_path)
    # Then neither is adopted, and each refusal says why
    assert await drain(store) == []
    refused = [d for d in store.damaged if "import refused" in d]
    assert any("not a file of a partition" in d for d in refused), refused
    assert any("outside its partition" in d for d in refused), refused
    assert outside.exists() and wrong.exists()
    await store.close()
