"""De-duplication keys at cleanup (``tarry.store.log.cleanup``): a deleted partition's keys are
dropped without reading every key, a key moves with its message, and a restart files them
again."""

from __future__ import annotations

from pathlib import Path

from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.store.log import LogStore
from tests.store.test_log_recovery import NOW, G, keyed


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


async def test_a_deleted_partitions_keys_are_dropped_and_the_others_kept(tmp_path: Path) -> None:
    # Given keyed messages in the first window and in the next
    store = await opened(tmp_path)
    await store.store([keyed(NOW + 10 + i, f"first-{i}") for i in range(3)])
    await store.store([keyed(NOW + G + 10, "second")])
    await release_until(store, NOW + G - 1)
    # When cleanup deletes the first window's partition
    assert await store.delete_released(NOW + G + 1) == 1
    # Then its keys are gone (the same message_id is a new message now), the other's is kept
    assert len(store.state.dedupe) == 1
    assert await created(store, keyed(NOW + 2 * G + 10, "first-0"))
    assert not await created(store, keyed(NOW + 2 * G + 10, "second"))
    await store.close()


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
    assert await store.delete_released(NOW + G + 1) == 1
    # Then its key is gone and the other's kept: the keys were filed again at the open
    assert len(store.state.dedupe) == 1
    assert await created(store, keyed(NOW + 2 * G + 10, "first"))
    assert not await created(store, keyed(NOW + 2 * G + 10, "second"))
    await store.close()
