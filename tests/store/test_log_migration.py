"""A log store directory written before the write-ahead log (``fixtures/log-v1``, written by
``fixtures/make_log_v1.py`` with that version's code: a snapshot, changes past it, a kill -9)
is opened and migrated: every pending message is kept where it was due, with its body, its
de-duplication key, its failure back-off; the cancelled one stays cancelled; and the directory
is in this version's format afterwards (a WAL, a version-2 manifest)."""

from __future__ import annotations

import json
import shutil
import struct
from dataclasses import replace
from pathlib import Path

from tarry.model.ids import IdGenerator
from tarry.model.state import MessageState
from tarry.store.log import LogStore
from tarry.store.log.manifest import VERSION
from tarry.store.log.tools import verify

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = json.loads((FIXTURES / "log-v1.json").read_text())
NOW: int = EXPECTED["now_ms"]
DAY = 86_400_000


def copy_of_v1(tmp_path: Path) -> Path:
    root = tmp_path / "log"
    shutil.copytree(FIXTURES / "log-v1", root)
    return root


def manifest_versions(root: Path) -> list[int]:
    paths = sorted((root / "snapshots").glob("manifest-*"))
    return [struct.unpack_from("<I", p.read_bytes(), 8)[0] for p in paths]


async def test_a_directory_of_the_version_before_the_wal_is_opened_and_migrated(
    tmp_path: Path,
) -> None:
    # Given a copy of a directory written by the previous version (no wal/, version-1 manifests)
    root = copy_of_v1(tmp_path)
    assert not (root / "wal").exists() and set(manifest_versions(root)) == {1}
    # When this version opens it
    store = LogStore(root, granularity_ms=EXPECTED["granularity_ms"])
    await store.open()
    # Then it is in this version's format at once: a WAL and a checkpoint of this version
    assert (root / "wal").is_dir()
    assert manifest_versions(root)[-1] == VERSION
    # And every pending message is found by id, with its body and (moved) due time
    for message_id, want in EXPECTED["pending"].items():
        got = await store.get(message_id)
        assert got is not None, message_id
        assert (got.body.decode(), got.deliver_at_ms) == (want["body"], want["due"])
    cancelled = await store.get(EXPECTED["cancelled"])
    assert cancelled is None or cancelled.state is MessageState.CANCELLED
    # And a message sent again with a message_id it holds is not kept twice
    for message_id, want in EXPECTED["pending"].items():
        if want["message_id"] is not None:
            kept = await store.get(message_id)
            assert kept is not None
            again = replace(kept, id=IdGenerator().new_due(NOW, want["due"]), body=b"again")
            [outcome] = await store.store([again])
            assert not outcome.created and outcome.message.id == message_id
    await store.close()
    # And after a restart in the new format, everything falls due once, never early, and the
    # failure back-off recorded by the previous version still holds
    store = LogStore(root, granularity_ms=EXPECTED["granularity_ms"])
    await store.open()
    released: dict[str, int] = {}
    times = sorted({w["due"] for w in EXPECTED["pending"].values()} | {NOW + 59_999, NOW + 60_000})
    for now_ms in times:
        for got in await store.fetch_due(now_ms, limit=100, lease_ms=400 * DAY):
            assert got.id != EXPECTED["cancelled"]
            due = EXPECTED["pending"][got.id]["due"]
            retry_at = EXPECTED["failed"].get(got.id, due)
            assert now_ms >= max(due, retry_at), (got.id, now_ms)
            if got.id in EXPECTED["failed"]:
                assert got.failures == 1
            released[got.id] = released.get(got.id, 0) + 1
    assert released == {message_id: 1 for message_id in EXPECTED["pending"]}
    assert await store.check() == []
    await store.close()
    assert verify(root)["ok"], verify(root)


async def test_a_migrated_directory_keeps_the_old_snapshot_until_a_new_one_supersedes_it(
    tmp_path: Path,
) -> None:
    # Given a copy of the previous version's directory, opened by this version
    root = copy_of_v1(tmp_path)
    store = LogStore(root, granularity_ms=EXPECTED["granularity_ms"])
    await store.open()
    # When it is closed cleanly and opened again
    await store.close()
    store = LogStore(root, granularity_ms=EXPECTED["granularity_ms"])
    await store.open()
    # Then it starts from its own checkpoints (the version-1 manifests are superseded) and
    # still holds every pending message
    assert set(manifest_versions(root)) == {VERSION}
    assert await store.count_scheduled() == len(EXPECTED["pending"])
    await store.close()
