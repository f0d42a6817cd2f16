"""A release of plain due messages (``DueColumns``) into their local queues, worked out from
the columns: each queue's rules looked up once, each message's queue expiry, arrival number
and ``insert_released`` row, and the run of "released" events (``ReadyColumns``), with no
``Message`` made. It is ``QueueTxn.enqueue_many`` of the same messages, in the same order (a
test holds the two to the same rows and events), for the queues where that writes every
message column-wise; anything else (a queue missing, put-disabled or with a length limit, a
message that expires on arrival) is left to it."""

from __future__ import annotations

from tarry.model.due import DueColumns, ReadyColumns
from tarry.model.expiry import is_expired, queue_expiries_ms
from tarry.model.queue_args import EffectiveQueueArgs
from tarry.queues.catalog import Catalog
from tarry.queues.sequence import Sequencer
from tarry.store.sqlite.rows import Released, queue_dedupe_key

__all__ = ["plain_release", "rows_by_queue", "takes_as_they_come"]


def plain_release(
    due: DueColumns, catalog: Catalog, *, now_ms: int, seq: Sequencer
) -> list[tuple[ReadyColumns, list[Released]]] | None:
    """Per queue, in the order the batch first names it: what it takes of ``due`` and the rows
    to write. None (no arrival number taken) when some queue or message needs the general
    path."""
    by_queue = rows_by_queue(due.destination)
    expires_at = due.expires_at_ms
    planned: list[tuple[str, list[int], list[int | None]]] = []
    for queue, rows in by_queue.items():
        args = catalog.effective(queue)
        if args is None or not takes_as_they_come(args):
            return None
        expiries = queue_expiries_ms(
            [expires_at[row] for row in rows] if len(rows) < len(due) else expires_at,
            enqueued_at_ms=now_ms,
            queue_ttl_ms=args.message_ttl_ms,
        )
        if any(is_expired(expires, now_ms) for expires in expiries if expires is not None):
            return None
        planned.append((queue, rows, expiries))
    ids, body, sent, deliver = due.ids, due.body, due.sent_at_ms, due.deliver_at_ms
    message_ids, keyed = due.message_ids(), due.message_id is not None
    correlation_ids = due.correlation_ids()
    out = []
    for queue, rows, expiries in planned:
        seqs = seq.next_many(len(rows))
        released: list[Released] = [
            (
                ids[row],
                body[row],
                sent[row],
                deliver[row],
                number,
                expires_at[row],
                expires,
                message_ids[row],
                queue_dedupe_key(queue, message_ids[row]) if keyed else None,
                correlation_ids[row],
            )
            for row, number, expires in zip(rows, seqs, expiries, strict=True)
        ]
        out.append((ReadyColumns(due, rows, queue, now_ms, expiries), released))
    return out


def rows_by_queue(destinations: list[str]) -> dict[str, list[int]]:
    """The rows of a batch by the queue each names, in the order the batch first names it."""
    first = destinations[0]
    if destinations.count(first) == len(destinations):  # nearly every round
        return {first: list(range(len(destinations)))}
    by_queue: dict[str, list[int]] = {}
    for row, queue in enumerate(destinations):
        by_queue.setdefault(queue, []).append(row)
    return by_queue


def takes_as_they_come(args: EffectiveQueueArgs) -> bool:
    """Whether a queue takes released messages column-wise as they come: it takes puts and
    has no length limit (one that has drops or refuses, message by message)."""
    return args.put_enabled and args.max_length is None
