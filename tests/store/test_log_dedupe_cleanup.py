"""De-duplication keys at cleanup (``tarry.store.log.cleanup``): a deleted partition's keys are
dropped without reading every key, and a few thousand an event-loop step; a key moves with its
message; a restart files them again; filing in arrays keeps the rule of one key at a time; a
checkpoint finds every key kept where they are filed, a cleanup's among them."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tarry.model.ids import id_due_ms
from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.store.log import LogStore, cleanup
from tarry.store.log.snapshot import KeysAsOf
from tarry.store.log.table import PartitionTable
from tests.store.test_log_recovery import NOW, G, crash, keyed


async def opened(root: Path) -> LogStore:
    """No upkeep of its own: each test deletes partitions when it says."""
    store = LogStore(root, granularity_ms=G, snapshot_interval_ms=1 << 62)
    await store.open()
    return store


async def release_until(store: LogStore, now_ms: int) -> None:
    """Release everything due by ``now_ms``."""
    while due := await store.fetch_due(now_ms, limit=100, lease_ms=60_000):
        await store.remove([m.id for m in due], state=MessageState.READY, now_ms=now_ms)


async def created(store: LogStore, message: Message) -> bool:
    [outcome] = await store.store([message])
    return outcome.created


async def first_window_deleted_keeps_one(store: LogStore, *, gone: str, kept: str) -> None:
    """Delete the first window's partition: one key is left, ``kept`` (sent again, it is
    refused), and ``gone`` is a new message when sent again. Closes the store."""
    assert await store.delete_released(NOW + G + 1) == 1
    assert len(store.state.dedupe) == 1
    assert await created(store, keyed(NOW + 2 * G + 10, gone))
    assert not await created(store, keyed(NOW + 2 * G + 10, kept))
    await store.close()


async def test_a_deleted_partitions_keys_are_dropped_and_the_others_kept(tmp_path: Path) -> None:
    # Given keyed messages in the first window and in the next
    store = await opened(tmp_path)
    await store.store([keyed(NOW + 10 + i, f"first-{i}") for i in range(3)])
    await store.store([keyed(NOW + G + 10, "second")])
    await release_until(store, NOW + G - 1)
    # When cleanup deletes the first window's partition
    # Then its keys are gone (the same message_id is a new message now), the other's is kept
    await first_window_deleted_keeps_one(store, gone="first-0", kept="second")


async def test_a_rescheduled_messages_key_lives_until_its_new_partition_is_deleted(
    tmp_path: Path,
) -> None:
    # Given a keyed message rescheduled from the first window into the third
    store = await opened(tmp_path)
    [outcome] = await store.store([keyed(NOW + 10, "moved")])
    await store.reschedule(outcome.message.id, deliver_at_ms=NOW + 2 * G + 10, now_ms=NOW + 1)
    await store.store([keyed(NOW + 20, "stays-behind")])
    await release_until(store, NOW + G - 1)
    # When the first window's partition is deleted
    assert await store.delete_released(NOW + G + 1) == 1
    # Then the moved message's key still refuses a repeat; the other key is gone
    assert list(store.state.dedupe.values()) == [outcome.message.id]
    assert not await created(store, keyed(NOW + 3 * G, "moved"))
    assert await created(store, keyed(NOW + 3 * G, "stays-behind"))
    # and once its new partition is released and deleted too, the key goes with it
    await release_until(store, NOW + 4 * G)
    assert await store.delete_released(NOW + 4 * G) >= 1
    assert outcome.message.id not in store.state.dedupe.values()
    await store.close()


async def test_after_a_restart_a_deleted_partitions_keys_are_still_dropped(
    tmp_path: Path,
) -> None:
    # Given keyed messages in two windows, the store closed and opened again
    store = await opened(tmp_path)
    await store.store([keyed(NOW + 10, "first"), keyed(NOW + G + 10, "second")])
    await store.close()
    store = await opened(tmp_path)
    # When the first window is released and its partition deleted
    await release_until(store, NOW + G - 1)
    # Then its key is gone and the other's kept: the keys were filed again at the open
    await first_window_deleted_keeps_one(store, gone="first", kept="second")


def one_key_at_a_time(table: PartitionTable) -> tuple[dict[int, list[int]], set[int]]:
    """The filing rule, a key at a time: under the finest partition that may hold the key's
    message (at its forwarded due time if rescheduled), or dropped when none may; unfiled
    when its id carries no due time. (filed, dropped)."""
    state = table.state
    filed: dict[int, list[int]] = {}
    dropped: set[int] = set()
    for key, message_id in state.dedupe.items():
        due = state.forwards.get(message_id) or id_due_ms(message_id)
        if due is None:
            continue
        holders = table.holding(due)
        if holders:
            filed.setdefault(holders[0].number, []).append(key)
        else:
            dropped.add(key)
    return filed, dropped


async def test_filing_keys_in_arrays_keeps_the_rule_of_one_key_at_a_time(tmp_path: Path) -> None:
    # Given keys in fine and coarse partitions over the same time, a rescheduled message's,
    # one whose id carries no due time, and partitions dropped from under some of them
    store = await opened(tmp_path)
    layout = store.table.layout
    far = NOW + 40 * G  # past level 0's reach from NOW: a coarse partition
    coarse_start, coarse_end = layout.window(layout.key(far, 1))
    await store.store([keyed(NOW + 10 + i, f"near-{i}") for i in range(5)])
    await store.store([keyed(far + i, f"far-{i}") for i in range(5)])
    await store.store([keyed(NOW + 100 * 86_400_000, "next-season")])
    # sent just before they are due: fine partitions over the coarse one's start and end
    for due, message_id in ((coarse_start + 5, "fine-kept"), (coarse_end - 5, "fine-dropped")):
        await store.store([replace(keyed(due, message_id), sent_at_ms=due - G)])
    [moved] = await store.store([keyed(NOW + 20, "moved")])
    await store.reschedule(moved.message.id, deliver_at_ms=far + 9, now_ms=NOW + 1)
    table = store.table
    table.state.dedupe[12345] = "an id of another kind"
    for number in (layout.key(NOW + 10, 0), layout.key(coarse_end - 5, 0)):
        table.drop(table.partitions[number])
    filed, dropped = one_key_at_a_time(table)
    # each case is there: dropped keys, and keys under a fine and under a coarse partition
    assert dropped and layout.key(coarse_start + 5, 0) in filed and layout.key(far, 1) in filed
    # When every key is filed again, in arrays
    cleanup.file_all(table)
    # Then the same keys are filed under the same partitions, and the same dropped
    assert {n: sorted(keys) for n, keys in table.state.filed.items()} == {
        n: sorted(keys) for n, keys in filed.items()
    }
    assert not dropped & table.state.dedupe.keys()
    assert 12345 in table.state.dedupe
    await store.close()


async def released_keyed(
    root: Path, count: int, monkeypatch: pytest.MonkeyPatch, *, a_step: int
) -> LogStore:
    """A store whose first window's ``count`` keyed messages (``first-<i>``) are released, its
    cleanup looking at ``a_step`` keys an event-loop step."""
    store = await opened(root)
    await store.store([keyed(NOW + 10 + i, f"first-{i}") for i in range(count)])
    await release_until(store, NOW + G - 1)
    monkeypatch.setattr(cleanup, "_KEYS_A_STEP", a_step)
    return store


async def test_a_deleted_partitions_keys_are_looked_at_over_several_loop_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a partition of 10 keyed messages, released, and a cleanup looking at 3 keys a step
    store = await released_keyed(tmp_path, 10, monkeypatch, a_step=3)
    steps: list[int] = []
    ticks = 0
    file_keys = cleanup.file_keys

    def counted(table: PartitionTable, keys: list[int]) -> None:
        steps.append(ticks)
        file_keys(table, keys)

    monkeypatch.setattr(cleanup, "file_keys", counted)

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticking = asyncio.create_task(tick())
    # When the partition is deleted
    assert await store.delete_released(NOW + G + 1) == 1
    ticking.cancel()
    # Then its keys were looked at 3 at a time, the event loop running between, and all dropped
    assert len(steps) == 4
    assert all(a < b for a, b in zip(steps, steps[1:], strict=False))
    assert not store.state.dedupe
    await store.close()


async def test_a_key_taken_back_while_its_old_partition_is_cleaned_up_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a released partition of keyed messages, cleaned up 2 keys a step
    store = await released_keyed(tmp_path, 6, monkeypatch, a_step=2)
    sent: list[bool] = []

    async def a_message_takes_a_key_back() -> None:
        if not sent:  # after the first step, before the last one looks at "first-5"
            [outcome] = await store.store([keyed(NOW + 3 * G, "first-5")])
            sent.append(outcome.created)

    monkeypatch.setattr(cleanup, "_next_step", a_message_takes_a_key_back)
    # When the partition is deleted, and the new message is stored between two steps
    assert await store.delete_released(NOW + G + 1) == 1
    assert sent == [True]
    # Then the new message's key is kept: a repeat is refused; the other keys are gone
    assert not await created(store, keyed(NOW + 3 * G, "first-5"))
    assert await created(store, keyed(NOW + 3 * G, "first-0"))
    await store.close()


async def test_a_snapshot_holds_every_key_kept_when_it_was_captured(tmp_path: Path) -> None:
    # Given keyed messages in three partitions and a key whose id carries no due time
    store = await opened(tmp_path)
    await store.store([keyed(NOW + 10 + i * G, f"kept-{i}") for i in range(9)])
    store.state.dedupe[12345] = "an id of another kind"
    cleanup.file_all(store.table)
    kept = dict(store.state.dedupe)
    # When a snapshot's keys are captured, and keys come and go before they are read
    keys = KeysAsOf.capture(store.state)
    await store.store([keyed(NOW + 20, "new")])
    del store.state.dedupe[next(iter(kept))]
    hashes, ids = (np.concatenate(chunks) for chunks in keys.chunks())
    # Then every key kept at the capture and still kept is read, with its id; no other
    read = dict(zip(hashes.tolist(), (i.decode() for i in ids.tolist()), strict=True))
    assert read == {k: v for k, v in kept.items() if k in store.state.dedupe}
    await store.close()


async def test_a_checkpoint_during_a_cleanup_keeps_the_keys_it_has_yet_to_look_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a keyed message rescheduled out of a released partition, its key last there
    store = await opened(tmp_path)
    await store.store([keyed(NOW + 10 + i, f"first-{i}") for i in range(4)])
    [moved] = await store.store([keyed(NOW + 20, "moved")])
    await store.reschedule(moved.message.id, deliver_at_ms=NOW + 3 * G, now_ms=NOW + 1)
    await release_until(store, NOW + G - 1)
    monkeypatch.setattr(cleanup, "_KEYS_A_STEP", 2)
    snapshots = []

    async def a_checkpoint() -> None:
        if not snapshots:  # before the last step looks at "moved"
            snapshots.append(await store.snapshot())

    monkeypatch.setattr(cleanup, "_next_step", a_checkpoint)
    # When its partition is deleted with a checkpoint between two steps, and the store
    # restarts from that checkpoint after a crash
    assert await store.delete_released(NOW + G + 1) == 1
    assert snapshots[0] is not None
    await crash(store)
    store = await opened(tmp_path)
    # Then the moved message's key still refuses a repeat
    assert list(store.state.dedupe.values()) == [moved.message.id]
    assert not await created(store, keyed(NOW + 4 * G, "moved"))
    await store.close()
