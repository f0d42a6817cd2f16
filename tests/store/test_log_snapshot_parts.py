"""A snapshot's blobs written part by part (``tarry.store.log.snapshot``): parts of one size
joined from the arrays' slices, never one copy of a whole blob, and read back byte for byte."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tarry.store.log import snapshot
from tarry.store.log.fs import OsFiles
from tarry.store.log.manifest import Manifest
from tests.store.test_log_recovery import NOW, crash, keyed, opened


def test_a_blob_is_written_in_whole_parts_and_read_back_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given parts of 10 bytes, and arrays of 7, 25, 0 and 3 bytes (35 in all)
    monkeypatch.setattr(snapshot, "PART_BYTES", 10)
    arrays = [np.arange(n, dtype=np.uint8) + n for n in (7, 25, 0, 3)]
    manifest = Manifest(seq=1, created_ms=NOW)
    (tmp_path / "snap-000000000001").mkdir()
    # When they are written as one blob, after an empty one
    empty = snapshot._write_blob(tmp_path / "snap-000000000001", manifest, [], OsFiles())
    first, count = snapshot._write_blob(tmp_path / "snap-000000000001", manifest, arrays, OsFiles())
    # Then the empty blob is one empty part, the other three whole parts and the rest
    assert empty == [0, 1]
    assert [part["bytes"] for part in manifest.parts] == [0, 10, 10, 10, 5]
    assert (first, count) == (1, 4)
    blob = snapshot.read_blob(tmp_path, manifest, first, count)
    assert blob == b"".join(array.tobytes() for array in arrays)


async def test_keys_read_in_slices_across_parts_are_recovered_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given keys read 7 at a time into parts of 100 bytes: slices and parts never line up
    monkeypatch.setattr(snapshot, "PART_BYTES", 100)
    monkeypatch.setattr(snapshot, "_KEYS_A_SLICE", 7)
    store = await opened(tmp_path)
    await store.store([keyed(NOW + 10 + i, f"key-{i}") for i in range(50)])
    kept = dict(store.state.dedupe)
    # When a snapshot is taken and the store is killed
    await store.snapshot()
    await crash(store)
    # Then recovery reads every key from the snapshot, nothing from the log
    store = await opened(tmp_path)
    assert store.state.manifest is not None
    assert store.state.replayed_records == 0
    assert store.state.dedupe == kept
    await store.close()
