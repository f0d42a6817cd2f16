"""Cleanup: a partition whose window is over and whose every message was released or cancelled
(state ``released``) is deleted with its files. Its markers are no longer needed once the queue
database holds the releases durably, so the store's ``barrier`` (a durable queue-database
commit) runs first. De-duplication keys and reschedule forwards into it are dropped with it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tarry.model.ids import id_due_ms
from tarry.store.log.partition import PartitionState

if TYPE_CHECKING:
    from tarry.store.log.engine import LogStore

__all__ = ["delete_released"]

log = logging.getLogger(__name__)


async def delete_released(store: LogStore, now_ms: int) -> int:
    """Delete every released partition; returns how many were deleted."""
    busy = {held.number for held in store._held()}
    doomed = []
    for number in list(store._numbers):
        partition = store.partitions[number]
        partition.settle(now_ms)
        if partition.state is PartitionState.RELEASED and number not in busy:
            doomed.append(partition)
    if not doomed:
        return 0
    if store.barrier is not None:
        await store.barrier()
        # Messages may have arrived (or been claimed) while the barrier committed: look again.
        busy = {held.number for held in store._held()}
        for partition in doomed:
            partition.settle(now_ms)
        doomed = [
            p
            for p in doomed
            if p.state is PartitionState.RELEASED
            and p.number not in busy
            and store.partitions.get(p.number) is p
        ]
    numbers = {p.number for p in doomed}
    granularity = store.granularity_ms

    def gone(message_id: str) -> bool:
        due = id_due_ms(message_id)
        return due is not None and due // granularity in numbers

    if any(gone(k) for k in store.state.forwards):
        # A reschedule out of a doomed partition is on disk only as its MOVED marker there:
        # a snapshot keeps the forward (find by id) before the marker goes; while another
        # snapshot is being written, the next round deletes.
        if await store.snapshot() is None:
            return 0
    for partition in doomed:
        files = sorted(partition.dir.glob("*"))
        store.files.close_partition(partition)
        store.files.fs.remove_tree(partition.dir)
        del store.partitions[partition.number]
        store._numbers.remove(partition.number)
        log.info(
            "partition %d released: deleted %s (%d files)",
            partition.number,
            partition.dir,
            len(files),
        )
    store.files.fs.fsync_dir(store.root)
    forwards = store.state.forwards

    def kept(message_id: str) -> bool:
        """The message lives on outside the deleted partitions (moved out of one, perhaps)."""
        due = forwards.get(message_id) or id_due_ms(message_id)
        return due is None or due // granularity not in numbers

    store.state.dedupe = {k: v for k, v in store.state.dedupe.items() if kept(v)}
    store.state.forwards = {
        k: v for k, v in store.state.forwards.items() if v // granularity not in numbers
    }
    return len(doomed)
