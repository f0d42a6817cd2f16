"""Cleanup: a partition whose window is over and whose every message was released or cancelled
(state ``released``) is deleted with its files. Its markers are no longer needed once the queue
database holds the releases durably, so the store's ``barrier`` (a durable queue-database
commit) runs first. Then a checkpoint: it covers every record of the doomed partitions, so the
write-ahead log's tail replayed after a crash never names a deleted partition, and it keeps the
forwards of messages rescheduled out of them (find by id). De-duplication keys and reschedule
forwards into deleted partitions are dropped with them. A key is filed under a partition that
may hold its message (``file_keys``): a deleted partition's keys are looked at again, a few
thousand an event-loop step, and each is dropped or filed under another partition that may
still hold its message (a coarser one covering the same time, or the one a reschedule moved it
to). Reading every key instead held the event loop for seconds at every deletion once a
million keys were kept, and so did looking at a busy partition's own keys in one step.

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

import numpy as np
import numpy.typing as npt

from tarry.model.ids import ids_due_ms
from tarry.store.log.fs import Files
from tarry.store.log.layout import MAX_LEVEL
from tarry.store.log.partition import Partition, PartitionState, parts_root
from tarry.store.log.segment import SegmentFiles
from tarry.store.log.table import PartitionTable

__all__ = ["delete_released", "empty_trash", "file_all", "file_keys", "trash_root"]

log = logging.getLogger(__name__)

TRASH = "trash"
#: Makes each name in ``trash/`` its own (a partition of the same key may be deleted again).
_moves = itertools.count()
#: De-duplication keys a deleted partition's cleanup looks at again in one event-loop step (a
#: step holds the loop within a release round's lateness goal), and the pause between two.
_KEYS_A_STEP = 2_048
_PAUSE_S = 0.001
#: ... and an open, in one go (on the executor: the bound is the arrays' memory).
_KEYS_AT_OPEN = 65_536


def trash_root(root: Path) -> Path:
    return root / TRASH


def empty_trash(root: Path, *, fs: Files) -> None:
    """Delete what a crash left in ``trash/`` (at open, before anything is written)."""
    fs.remove_tree(trash_root(root))


def file_keys(table: PartitionTable, keys: Sequence[int]) -> None:
    """File each of ``keys`` still kept in ``state.dedupe`` under the finest partition that
    may hold its message (as ``holding`` lists them), and drop those no partition may hold. A
    key whose id carries no due time is kept unfiled: never dropped. Worked out in arrays (the
    ids' due times, each level's partition keys): a busy partition is deleted with millions,
    and a Python call a key for each held the event loop for seconds."""
    state = table.state
    dedupe = state.dedupe
    kept = [key for key in keys if key in dedupe]
    if not kept:
        return
    ids = list(map(dedupe.__getitem__, kept))
    dues = ids_due_ms(ids)
    if state.forwards:  # a rescheduled message is found at its new due time
        moved = np.array(list(map(state.forwards.get, ids, itertools.repeat(0))), np.int64)
        dues = np.where(moved != 0, moved, dues)
    holder = np.full(len(kept), -1, np.int64)
    dated = dues >= 0
    for level in range(MAX_LEVEL + 1):  # finest first
        here = table.layout.keys_at(dues, level)
        found = (holder < 0) & dated & _existing(table, here)
        holder[found] = here[found]
    for key in itertools.compress(kept, (dated & (holder < 0)).tolist()):
        dedupe.pop(key, None)  # a key may be listed twice
    if not dated.all():
        state.unfiled.extend(itertools.compress(kept, (~dated).tolist()))
    live = holder >= 0
    filed = state.filed
    for key, number in zip(
        itertools.compress(kept, live.tolist()), holder[live].tolist(), strict=True
    ):
        filed.setdefault(number, []).append(key)


def _existing(table: PartitionTable, keys: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Whether each partition key names a partition of the table: a lookup for each distinct
    key (a step's keys name a few), not an array of every partition (a store written before
    the layout has one a five minutes)."""
    distinct, where = np.unique(keys, return_inverse=True)
    present = np.fromiter(map(table.partitions.__contains__, distinct.tolist()), bool)
    found: npt.NDArray[np.bool_] = present[where.reshape(-1)]
    return found


def file_all(table: PartitionTable) -> None:
    """File every de-duplication key (at open), dropping those no partition may hold."""
    table.state.filed.clear()
    table.state.unfiled.clear()
    keys = list(table.state.dedupe)
    for first in range(0, len(keys), _KEYS_AT_OPEN):
        file_keys(table, keys[first : first + _KEYS_AT_OPEN])


async def _refile(table: PartitionTable, deleted: list[Partition]) -> None:
    """The keys filed under ``deleted`` (gone from the table): dropped, or filed again under a
    partition that may still hold their message. A few thousand an event-loop step: between
    two, a new message may take a key back (it is then filed under its own partition too)."""
    state = table.state
    lists = [state.filed.pop(partition.number, []) for partition in deleted]
    keys = lists[0] if len(lists) == 1 else list(itertools.chain.from_iterable(lists))
    state.refiling.append(keys)  # where a checkpoint meanwhile finds them
    try:
        for first in range(0, len(keys), _KEYS_A_STEP):
            if first:
                await _next_step()
            file_keys(table, keys[first : first + _KEYS_A_STEP])
    finally:
        state.refiling.remove(keys)


async def _next_step() -> None:
    """Let the event loop run what waits between two steps of a cleanup. A pause, not a bare
    yield: after a yield the cleanup's next step runs ahead of what a timer or a socket woke
    meanwhile (a release round, a request), which then waits for two steps."""
    await asyncio.sleep(_PAUSE_S)


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

    await _refile(table, doomed)
    # Forwards are few (reschedules): all read.
    table.state.forwards = {k: v for k, v in forwards.items() if table.holding(v)}
    if moved:
        await asyncio.to_thread(_unlink_all, files.fs, moved)
    return len(doomed)


def _unlink_all(fs: Files, paths: Sequence[Path]) -> None:
    for path in paths:
        fs.unlink(path)
