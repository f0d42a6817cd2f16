"""Adopting bulk-import areas (``tarry pipeline import --into``) at start: all or nothing, once
per message, and a crash in the middle rolls forward. Areas are built here with the same codec
the pipeline's executors use; the Spark path runs end to end in tests/pipeline."""

from __future__ import annotations

import os
from pathlib import Path

import google_crc32c
import orjson

from tarry.model.message import Message
from tarry.store.log import LogStore
from tarry.store.log.adopt import PLAN, ImportManifest, write_manifest
from tarry.store.log.held import dedupe_hash
from tarry.store.log.record import encode_message
from tests.store.test_log_recovery import NOW, G, crash, message, opened


def area_with(root: Path, name: str, messages: list[Message]) -> Path:
    area = root / "imports" / name
    files = []
    by_partition: dict[int, list[Message]] = {}
    for m in messages:
        by_partition.setdefault(m.deliver_at_ms // G, []).append(m)
    for number, group in sorted(by_partition.items()):
        path = area / f"p-{number:010d}" / "task-0.log"
        path.parent.mkdir(parents=True)
        data = b"".join(encode_message(m, dedupe_hash(m)) for m in group)
        path.write_bytes(data)
        files.append(
            {
                "name": str(path.relative_to(area)),
                "partition": number,
                "bytes": len(data),
                "crc": google_crc32c.value(data),
                "records": len(group),
            }
        )
    write_manifest(area, ImportManifest(name, NOW, G, files))
    return area


async def drain(store: LogStore) -> list[str]:
    """Every message due by NOW + 10 partitions (overdue partitions are indexed a few per call)."""
    keys: list[str] = []
    for _ in range(5):
        keys += [
            m.message_id or "" for m in await store.fetch_due(NOW + 10 * G, limit=10, lease_ms=1000)
        ]
    return sorted(keys)


def keyed(due_ms: int, key: str) -> Message:
    m = message(due_ms)
    m.message_id = key
    return m


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


async def test_a_crash_after_the_plan_rolls_forward(tmp_path: Path) -> None:
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
    targets = [
        f"p-{(NOW + 40) // G:010d}/seg-000001.log",
        f"p-{(NOW + 4 * G) // G:010d}/seg-000000.log",
    ]
    plan = [
        [str(s.relative_to(area)), t, int(t[2:12])] for s, t in zip(sources, targets, strict=True)
    ]
    (area / PLAN).write_bytes(orjson.dumps(plan))
    os.replace(sources[0], tmp_path / targets[0])
    store = await opened(tmp_path)
    assert await drain(store) == ["a", "b", "c", "d"]
    assert not area.exists()
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
