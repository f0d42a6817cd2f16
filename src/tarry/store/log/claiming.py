"""Claiming the due messages a fetch picked (``pick_due``): their records read, each claimed
until its lease ends, a failed one's count and error put back on it, and one whose back-off
outlived a restart left waiting.

A batch of plain records that never failed (nearly every round) is read straight into columns
(``DueColumns``): no ``Message`` is made for it unless someone reads one."""

from __future__ import annotations

from collections.abc import Sequence

from tarry.model.due import DueColumns
from tarry.model.message import Message, plain_message
from tarry.store.log.held import Held
from tarry.store.log.reading import read_records
from tarry.store.log.record import PlainRow, plain_row
from tarry.store.log.segment import SegmentFiles
from tarry.store.log.table import PartitionTable

__all__ = ["claim_due"]


def claim_due(
    table: PartitionTable,
    files: SegmentFiles,
    helds: list[Held],
    *,
    now_ms: int,
    until_ms: int,
) -> Sequence[Message]:
    """Claim (``table.claims``) the readable messages of ``helds`` until ``until_ms``; returns
    them in order, as ``DueColumns`` when every one is plain and none has failed before."""
    due = _plain_batch(table, files, helds)
    if due is not None:
        return _claim_columns(table, helds, due, until_ms)
    got = read_records(table, files, helds, plain_row)
    failures, claims = table.state.failures, table.claims
    if got and all(type(g) is tuple for g in got):
        rows: list[PlainRow] = got  # type: ignore[assignment]  # checked just above
        if not failures or not any(row[0] in failures for row in rows):
            return _claim_columns(
                table, helds, DueColumns(*map(list, zip(*rows, strict=True))), until_ms
            )
    out: list[Message] = []
    for held, read in zip(helds, got, strict=True):
        if read is None:
            continue
        message = plain_message(*read) if type(read) is tuple else read
        assert isinstance(message, Message)
        failure = failures.get(message.id)
        if failure is not None:
            if failure.retry_at_ms > now_ms:  # a back-off that outlived a restart
                table.wait(message.id, held, failure.retry_at_ms)
                continue
            message.failures, message.last_error = failure.attempts, failure.error
        held.destination, held.until = message.destination, until_ms
        claims[message.id] = held
        out.append(message)
    return out


def _plain_batch(
    table: PartitionTable, files: SegmentFiles, helds: list[Held]
) -> DueColumns | None:
    """A round's usual batch (one partition's records in one segment, every one plain and
    readable, none failed before) read straight into columns; None for anything else, which
    the general way reads (and reports) without anything done here."""
    if not helds:
        return None
    number = helds[0].number
    partition = table.partitions.get(number)
    if partition is None or any(held.number != number for held in helds):
        return None
    columns = files.read_plain_columns(partition, [held.pos for held in helds])
    if columns is None:
        return None
    failures = table.state.failures
    if failures and not failures.keys().isdisjoint(columns[0]):
        return None
    return DueColumns(*columns)


def _claim_columns(
    table: PartitionTable, helds: list[Held], due: DueColumns, until_ms: int
) -> DueColumns:
    claims = table.claims
    for held, message_id, destination in zip(helds, due.ids, due.destination, strict=True):
        held.destination, held.until = destination, until_ms
        claims[message_id] = held
    return due
