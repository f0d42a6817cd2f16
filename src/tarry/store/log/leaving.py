"""Messages leaving the log store: taken out of circulation (``PartitionTable.leaving``) before
the marker that ends them is written, by ``LogStore.remove`` at once, or by ``LogStore.leave``
now and ``LogStore.finish_left`` later (local queues kept in memory, ``tarry.queues.memory``:
a crash before the marker finds such a message due again, which is what makes them safe).

Markers go one contiguous append per partition (one reservation, one part of the write).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tarry.errors import NotCancellable
from tarry.model.state import MessageState
from tarry.store.log.held import STATE_CODES, Held
from tarry.store.log.locate import Located
from tarry.store.log.partition import Partition
from tarry.store.log.reading import read_message
from tarry.store.log.record import RELEASED, encode_markers
from tarry.store.log.segment import SegmentFiles
from tarry.store.log.table import PartitionTable

__all__ = ["Taken", "left", "markers", "refuse_claimed", "take_located", "take_out"]

#: Messages out of circulation, each with where it is held.
Taken = list[tuple[str, Held]]


def take_out(table: PartitionTable, files: SegmentFiles, ids: Iterable[str]) -> Taken:
    """The pending messages of ``ids`` (claimed, waiting or indexed) moved to ``leaving``, each
    with its destination known (a marker names it). Ids not pending are left out."""
    taken: Taken = []
    leaving = table.leaving
    for message_id in ids:
        held = table.take(message_id)
        if held is None or held.number not in table.partitions:
            continue
        if not held.destination:
            message = read_message(table, files, held)
            held.destination = message.destination if message else ""
        leaving[message_id] = held
        taken.append((message_id, held))
    return taken


def left(table: PartitionTable, ids: Iterable[str]) -> Taken:
    """The messages of ``ids`` still in ``leaving`` (``LogStore.leave`` put them there)."""
    leaving = table.leaving
    return [(message_id, held) for message_id in ids if (held := leaving.get(message_id))]


def markers(
    table: PartitionTable, taken: Sequence[tuple[str, Held]], state: MessageState
) -> list[tuple[Partition, bytes]]:
    """The RELEASED markers (with ``state``) of ``taken``, one chunk per partition."""
    by_partition: dict[int, list[tuple[str, int, str]]] = {}
    for message_id, held in taken:
        by_partition.setdefault(held.number, []).append((message_id, held.pos, held.destination))
    code = STATE_CODES[state]
    return [
        (table.partitions[n], encode_markers(RELEASED, code, entries))
        for n, entries in by_partition.items()
    ]


def refuse_claimed(table: PartitionTable, message_id: str) -> None:
    """Raises ``not_cancellable`` for a message being released (claimed, or leaving)."""
    if message_id in table.claims or message_id in table.leaving:
        raise _being_delivered(message_id)


def take_located(table: PartitionTable, found: Located) -> Held:
    """Take a located scheduled message out of circulation for a cancel or a move."""
    message = found.message
    refuse_claimed(table, message.id)
    held = table.waiting.pop(message.id, None)
    table.recent.pop(message.id, None)
    if held is None:
        held = Held(found.partition.number, found.pos, found.due, message.destination)
        index = found.partition.index
        if index is not None and not index.discard(found.due, found.pos):
            # Not indexed any more and not held: another path finished it meanwhile.
            raise _being_delivered(message.id)
    held.destination = message.destination
    table.leaving[message.id] = held
    return held


def _being_delivered(message_id: str) -> NotCancellable:
    return NotCancellable(
        f"message {message_id} is being delivered right now; it can no longer be changed"
    )
