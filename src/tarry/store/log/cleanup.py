"""Cleanup: a partition whose window is over and whose every message was released or cancelled
(state ``released``) is deleted with its files. Its markers are no longer needed once the queue
database holds the releases durably, so the store's ``barrier`` (a durable queue-database
commit) runs first. Then a checkpoint: it covers every record of the doomed partitions, so the
write-ahead log's tail replayed after a crash never names a deleted partition, and it keeps the
forwards of messages rescheduled out of them (find by id). De-duplication keys and reschedule
forwards into deleted partitions are dropped with them. A key is filed under a partition that
may hold its message (``file_key``): a deleted partition's keys are looked at again, and each
is dropped or filed under another partition that may still hold its message (a coarser one
covering the same time, or the one a reschedule moved it to). Reading every key instead held
the event loop for seconds at every deletion once a million keys were kept.

A deleted partition's files are moved into ``trash/`` on the event loop and unlinked there on
a thread: unlinking a file frees its blocks, which takes as long as the file is large (a busy
partition holds hundreds of MB), while a move changes a directory entry only. A file a crash
leaves in ``trash/`` is deleted at the next open (``empty_trash``); one a crash returns to
``parts/`` is a partition deleted again, as before.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from tarry.model.ids import id_due_ms
from tarry.store.log.fs import Files
from tarry.store.log.partition import Partition, PartitionState, parts_root
from tarry.store.log.segment import SegmentFiles
from tarry.store.log.table import PartitionTable

__all__ = ["delete_released", "empty_trash", "file_all", "file_key", "trash_root"]

log = logging.getLogger(__name__)

TRASH = "trash"
#: Makes each name in ``trash/`` its own (a partition of the same key may be deleted again).
_moves = itertools.count()


def trash_root(root: Path) -> Path:
    return root / TRASH


def empty_trash(root: Path, *, fs: Files) -> None:
    """Delete what a crash left in ``trash/`` (at open, before anything is written)."""
    fs.remove_tree(trash_root(root))


def file_key(table: PartitionTable, key: int, message_id: str) -> bool:
    """File de-duplication ``key`` (of ``message_id``) under a partition that may hold its
    message; False when none may (the key is dead). A key whose id carries no due time is
    kept unfiled: never dropped."""
    due = table.state.forwards.get(message_id) or id_due_ms(message_id)
    if due is None:
        return True
    holders = table.holding(due)
    if not holders:
        return False
    table.state.filed.setdefault(holders[0].number, []).append(key)
    return True


def file_all(table: PartitionTable) -> None:
    """File every de-duplication key (at open), dropping those no partition may hold."""
    state = table.state
    state.filed.clear()
    dead = [key for key, message_id in state.dedupe.items() if not file_key(table, key, message_id)]
    for key in dead:
        del state.dedupe[key]


def _refile(table: PartitionTable, deleted: list[Partition]) -> None:
    """The keys filed under ``deleted`` (gone from the table): dropped, or filed again under a
    partition that may still hold their message."""
    dedupe, filed = table.state.dedupe, table.state.filed
    for partition in deleted:
        for key in filed.pop(partition.number, ()):
            message_id = dedupe.get(key)
            if message_id is not None and not file_key(table, key, message_id):
                del dedupe[key]


def _doomed(table: PartitionTable, now_ms: int) -> list[Partition]:
    busy = {held.number for held in table.held()}
    doomed = []
    for number in list(table.numbers):
        partition = table.partitions[number]
        partition.settle(now_ms)
        if partition.state is PartitionState.RELEASED and number not in busy:
            doomed.append(partition)
    return doomed


async def delete_released(
    table: PartitionTable,
    now_ms: int,
    *,
    files: SegmentFiles,
    checkpoint: Callable[[], Awaitable[Path | None]],
    barrier: Callable[[], Awaitable[None]] | None = None,
) -> int:
    """Delete every released partition; returns how many were deleted."""
    doomed = _doomed(table, now_ms)
    if not doomed:
        return 0
    if barrier is not None:
        await barrier()
    # The checkpoint's capture comes first in its own step: whatever arrived meanwhile (a
    # message, a claim) shows in the check after it.
    if await checkpoint() is None:
        return 0  # another checkpoint is being written: the next round deletes
    again = {p.number for p in _doomed(table, now_ms)}
    doomed = [p for p in doomed if p.number in again and table.partitions.get(p.number) is p]
    trash = trash_root(table.root)
    moved: list[Path] = []
    for partition in doomed:
        files.close_partition(partition)
        found = partition.on_disk()
        if found and not moved:
            files.fs.mkdir(trash)
        for path, _ in found:
            moved.append(trash / f"{next(_moves)}-{path.name}")
            files.fs.rename(path, moved[-1])
        table.drop(partition)
        log.info("partition %s released: deleted its %d segment files", partition.name, len(found))
    if not doomed:
        return 0
    # Gone from ``parts/`` for good before a later snapshot leaves their partitions out.
    files.fs.fsync_dir(parts_root(table.root))
    forwards = table.state.forwards

    _refile(table, doomed)
    # Forwards are few (reschedules): all read.
    table.state.forwards = {k: v for k, v in forwards.items() if table.holding(v)}
    if moved:
        await asyncio.to_thread(_unlink_all, files.fs, moved)
    return len(doomed)


def _unlink_all(fs: Files, paths: Sequence[Path]) -> None:
    for path in paths:
        fs.unlink(path)
