"""A probe, not a design: ``tarry serve`` with its local queues kept in a dict instead of the
queue database, to measure what the issue-23 workload costs once a release, a receive and an
ack write nothing (``ontime.py --only tarry,in-memory``).

Nothing here is durable: a release keeps its rows in memory and writes the log store's markers
at once, a receive hands rows out of memory, an ack forgets them. So the figure is an upper
bound of what WAL-backed local queues (a memory operation plus a group-committed append, the
issue's first item) can save, not what they would cost. Only what the workload does is kept:
plain messages released as columns into queues without limits, receive (with ``ack``) and ack;
anything else is refused, so a run that strays fails loudly rather than measuring something
else.

With ``TARRY_PROBE_RETAIN=1`` (``ontime.py --only ...,in-memory-retained``) acked messages are
also written to the queue database as finished rows, one transaction every
``RETAIN_EVERY_S``: what the README's design for local queues without a transaction a cycle
keeps writing ("each finished message is still inserted once, for ``retention_ms``"), so
that the difference between the two parts is what keeping finished messages in the queue
database costs. The ack's append to a write-ahead log is still not counted.

    python bench/probes/queues_in_memory.py serve --port 0 --data DIR --store log
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections import deque
from collections.abc import Sequence
from typing import Any

from tarry.cli.main import main as tarry_main
from tarry.engine import consuming, release
from tarry.engine.context import EngineContext
from tarry.engine.types import Deliveries
from tarry.model.due import DueColumns
from tarry.model.events import EventRun
from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.model.time import wait_at_most
from tarry.queues.release_columns import plain_release
from tarry.queues.row_messages import ReceivedRows, RowMessages
from tarry.queues.sequence import Sequencer
from tarry.store.sqlite.rows import COLUMNS

_SEQ = COLUMNS.index("seq")
#: Ready rows by queue, in arrival order; rows handed out, by receipt.
_ready: dict[str, deque[tuple[Any, ...]]] = {}
_in_flight: dict[str, tuple[tuple[Any, ...], int]] = {}
_arrivals = Sequencer()
_receives = itertools.count(1)

#: Whether acked messages are written to the queue database as finished rows.
RETAIN = os.environ.get("TARRY_PROBE_RETAIN") == "1"
RETAIN_EVERY_S = 0.2
#: Columns of a finished row that differ row to row (the rest are the same for every row).
_RETAINED = ("id", "destination", "body", "sent_at_ms", "deliver_at_ms", "queue", "seq",
             "enqueued_at_ms", "visible_at_ms", "updated_at_ms")  # fmt: skip
#: Rows an INSERT writes at most.
_RETAIN_CHUNK = 256
_finished: list[tuple[Any, ...]] = []
_retainer: asyncio.Task[None] | None = None


def _row(released: Sequence[Any], queue: str, now: int) -> tuple[Any, ...]:
    """A ``SELECT_SQL`` row as ``insert_released`` would have written it."""
    id_, body, sent, due, seq, expires, queue_expires, message_id, key, correlation = released
    values = dict.fromkeys(COLUMNS)
    values.update(
        id=id_, destination=queue, state="ready", body=body, headers="{}", sent_at_ms=sent,
        deliver_at_ms=due, expires_at_ms=expires, message_id=message_id, dedupe_key=key,
        correlation_id=correlation, report="", on_undeliverable="dead_letter", persistent=1,
        failures=0, queue=queue, seq=seq, enqueued_at_ms=now, queue_expires_at_ms=queue_expires,
        visible_at_ms=now, redelivered=0, delivery_count=0, updated_at_ms=now,
    )  # fmt: skip
    return tuple(values.values())


async def _release(ctx: EngineContext, batch: Sequence[Message]) -> list[tuple[Message, Exception]]:
    now = ctx.clock.now_ms()
    planned = (
        plain_release(batch, ctx.catalog, now_ms=now, seq=_arrivals)
        if isinstance(batch, DueColumns)
        else None
    )
    try:
        if planned is None:
            raise RuntimeError("the in-memory probe releases plain columns into plain queues only")
        for ready, rows in planned:
            _ready.setdefault(ready.queue, deque()).extend(_row(r, ready.queue, now) for r in rows)
            ctx.emit(EventRun("released", ready, now, ready.queue))
            ctx.waiters.wake({ready.queue})
        await ctx.store.remove(batch.ids, state=MessageState.READY, now_ms=now)
    finally:
        ctx.store.release_claims(batch.ids if isinstance(batch, DueColumns) else [])
    return []


def _take(ctx: EngineContext, queue: str, most: int, now: int) -> ReceivedRows:
    ready = _ready.get(queue)
    if not ready:
        return ReceivedRows([], [], now)
    rows = [ready.popleft() for _ in range(min(most, len(ready)))]
    prefix = f"p{next(_receives)}"
    receipts = [f"{prefix}.{row[_SEQ]}" for row in rows]
    for receipt, row in zip(receipts, rows, strict=True):
        _in_flight[receipt] = (row, now)
    taken = ReceivedRows(rows, receipts, now)
    ctx.emit(EventRun("received", taken.messages, now, queue))
    return taken


def _retained_sql(count: int) -> str:
    one = "(" + ", ".join(["?"] * len(_RETAINED)) + ", 'acked', '{}', 'dead_letter', 1, 1)"
    return (
        f"INSERT INTO messages ({', '.join(_RETAINED)}, state, headers, on_undeliverable, "
        f"persistent, delivery_count) VALUES {', '.join([one] * count)}"
    )


_AT = [COLUMNS.index(name) for name in _RETAINED if name not in ("visible_at_ms", "updated_at_ms")]


async def _retain(ctx: EngineContext) -> None:
    """Every ``RETAIN_EVERY_S``, the acked rows since in one transaction, as finished rows."""
    while True:
        await asyncio.sleep(RETAIN_EVERY_S)
        if not _finished:
            continue
        rows = _finished[:]
        del _finished[:]

        def work(conn: Any, rows: list[tuple[Any, ...]] = rows) -> None:
            for start in range(0, len(rows), _RETAIN_CHUNK):
                chunk = rows[start : start + _RETAIN_CHUNK]
                conn.execute(_retained_sql(len(chunk)), list(itertools.chain.from_iterable(chunk)))

        await ctx.qdb.write(work)


def _ack(ctx: EngineContext, queue: str, receipts: Sequence[str], now: int) -> dict[str, Any]:
    global _retainer
    rows, received_at, unknown = [], [], []
    for receipt in receipts:
        found = _in_flight.pop(receipt, None)
        if found is None:
            unknown.append(receipt)
        else:
            rows.append(found[0])
            received_at.append(found[1])
    if RETAIN and rows:
        if _retainer is None:
            _retainer = asyncio.get_running_loop().create_task(_retain(ctx))
        _finished.extend(
            (*(row[k] for k in _AT), at, now) for row, at in zip(rows, received_at, strict=True)
        )
    ctx.emit(EventRun("acked", RowMessages(rows, received_at, MessageState.ACKED), now, queue))
    return {"acked": len(rows), "unknown": unknown}


async def _receive(
    ctx: EngineContext,
    queue: str,
    *,
    max_messages: int = 1,
    wait_ms: int = 0,
    visibility_ms: int | None = None,
    ack: Sequence[str] | None = None,
) -> Deliveries:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_ms / 1000
    settled = None if ack is None else _ack(ctx, queue, ack, ctx.clock.now_ms())
    while True:
        event = ctx.waiters.event(queue)
        taken = _take(ctx, queue, max_messages, ctx.clock.now_ms())
        remaining = deadline - loop.time()
        if taken or remaining <= 0:
            return Deliveries(taken, settled)
        await wait_at_most(event, min(remaining, 1.0))


async def _settle(
    ctx: EngineContext, queue: str, receipts: Sequence[str], *, ack: bool, requeue: bool
) -> dict[str, Any]:
    if not ack:
        raise RuntimeError("the in-memory probe acks only")
    return _ack(ctx, queue, receipts, ctx.clock.now_ms())


def main() -> None:
    release.release = _release  # type: ignore[assignment]
    consuming.receive = _receive
    consuming.settle = _settle
    tarry_main()


if __name__ == "__main__":
    main()
