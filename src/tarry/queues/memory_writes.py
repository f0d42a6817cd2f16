"""The rows a write-out takes from the queues kept in memory (``queues.memory.WriteOut``), written
to the queue database in one transaction, each as it would be there had every release, receive
and ack been written: ready rows as a release writes them, rows handed out in flight under
their receipt until their visibility timeout ends, acked rows finished (their body dropped).

A row whose id the database holds already is left as it is there (``INSERT OR IGNORE``): that
message was released before, and that row is its record."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from itertools import chain
from operator import itemgetter
from typing import Any

from tarry.queues.memory import InFlight, Row, WriteOut
from tarry.store.sql import SqlConnection
from tarry.store.sqlite.rows import COLUMNS

__all__ = ["write_out"]

_AT = {name: COLUMNS.index(name) for name in COLUMNS}
#: Rows an INSERT writes at most (well under SQLite's bound on parameters).
_CHUNK = 256


#: What an acked row of the memory (a plain release's, acked once) differs in from another,
#: bound per row; the rest is written into the statement (binding is most of a row's cost).
_ACKED_VARYING = (
    *("id", "destination", "queue", "sent_at_ms", "deliver_at_ms", "correlation_id"),
    *("seq", "enqueued_at_ms", "visible_at_ms", "updated_at_ms"),
)
_ACKED_FIXED = {
    "state": "'acked'",
    "headers": "'{}'",
    "report": "''",
    "on_undeliverable": "'dead_letter'",
    "persistent": "1",
    "failures": "0",
    "redelivered": "0",
    "delivery_count": "1",
}
_FROM_ROW = itemgetter(*(_AT[name] for name in _ACKED_VARYING[:-2]))


def write_out(conn: SqlConnection, out: WriteOut) -> None:
    """Write every row of ``out``."""
    rows = chain(chain.from_iterable(out.ready.values()), map(_in_flight, out.in_flight))
    for chunk in _chunks(rows):
        conn.execute(_insert_sql(len(chunk)), list(chain.from_iterable(chunk)))
    acked = (
        (*_FROM_ROW(f.flight.row), f.flight.visible_at_ms, f.acked_at_ms) for f in out.finished
    )
    for chunk in _chunks(acked):
        conn.execute(_acked_sql(len(chunk)), list(chain.from_iterable(chunk)))


def _in_flight(flight: InFlight) -> Row:
    return _with(
        flight.row,
        state="delivered",
        receipt=flight.receipt,
        visible_at_ms=flight.visible_at_ms,
        delivery_count=1,
        updated_at_ms=flight.received_at_ms,
    )


def _with(row: Row, **changes: Any) -> Row:
    values = list(row)
    for name, value in changes.items():
        values[_AT[name]] = value
    return tuple(values)


def _chunks(rows: Iterator[Row]) -> Iterator[list[Row]]:
    chunk: list[Row] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == _CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


@cache
def _insert_sql(count: int) -> str:
    one = "(" + ", ".join(["?"] * len(COLUMNS)) + ")"
    return (
        f"INSERT OR IGNORE INTO messages ({', '.join(COLUMNS)}) VALUES {', '.join([one] * count)}"
    )


@cache
def _acked_sql(count: int) -> str:
    one = "(" + ", ".join(["?"] * len(_ACKED_VARYING) + list(_ACKED_FIXED.values())) + ")"
    names = ", ".join([*_ACKED_VARYING, *_ACKED_FIXED])
    return f"INSERT OR IGNORE INTO messages ({names}) VALUES {', '.join([one] * count)}"
