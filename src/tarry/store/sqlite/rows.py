"""Message ↔ row conversion for the ``messages`` table."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any, Final

import orjson

from tarry.model.message import Death, Message, Undeliverable, parse_reports, reports_text
from tarry.model.state import MessageState
from tarry.store.sql import SqlConnection

__all__ = [
    "COLUMNS",
    "SELECT_SQL",
    "Insert",
    "RELEASED_KEY",
    "Released",
    "from_row",
    "insert_released",
    "insert_rows",
    "is_plain",
    "kept_by_dedupe_key",
    "plain_released_rows",
    "queue_dedupe_key",
    "released_row",
    "to_insert",
]

COLUMNS = (
    "id",
    "destination",
    "topic",
    "state",
    "body",
    "headers",
    "sent_at_ms",
    "deliver_at_ms",
    "expires_at_ms",
    "message_id",
    "dedupe_key",
    "correlation_id",
    "reply_to",
    "report",
    "on_undeliverable",
    "persistent",
    "failures",
    "last_error",
    "deaths",
    "queue",
    "seq",
    "enqueued_at_ms",
    "queue_expires_at_ms",
    "visible_at_ms",
    "receipt",
    "redelivered",
    "delivery_count",
    "updated_at_ms",
)
SELECT_SQL = f"SELECT {', '.join(COLUMNS)} FROM messages"


#: One row to insert: its INSERT statement (naming only the columns it sets) and the values.
Insert = tuple[str, tuple[Any, ...]]

# ``to_insert`` leaves the columns a row does not set out of its INSERT (they take NULL, or their
# default) rather than binding None: Python's sqlite3 binds None and ``bytes`` through its
# adaptation protocol, which costs more than writing the column (an int or a ``bytearray``
# binds directly). A released message leaves about ten columns unset, so binding them would
# be a large part of the cost of binding its row.
_ALWAYS = (
    "id",
    "destination",
    "state",
    "body",
    "headers",
    "sent_at_ms",
    "deliver_at_ms",
    "report",
    "on_undeliverable",
    "persistent",
    "failures",
    "redelivered",
    "delivery_count",
    "updated_at_ms",
)
#: Every other column, in ``COLUMNS`` order (``to_insert`` lists their values in this order).
_OPTIONAL = tuple(c for c in COLUMNS if c not in _ALWAYS)
_INSERTS: dict[tuple[bool, ...], str] = {}
#: The text of each state and ``on_undeliverable`` member (a dict look-up is cheaper than
#: ``.value``, and this runs for every row written).
_VALUES: dict[object, str] = {m: m.value for e in (MessageState, Undeliverable) for m in e}


def _insert_sql(present: tuple[bool, ...]) -> str:
    sql = _INSERTS.get(present)
    if sql is None:
        names = [*_ALWAYS, *(n for n, p in zip(_OPTIONAL, present, strict=True) if p)]
        sql = f"INSERT INTO messages ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"
        _INSERTS[present] = sql
    return sql


def to_insert(
    message: Message,
    *,
    seq: int | None = None,
    receipt: str | None = None,
    visible_at_ms: int | None = None,
    dedupe: bool = True,
) -> Insert:
    """The row of ``message`` as an INSERT of the columns it sets (the others stay NULL or
    take their default)."""
    optional = (
        message.topic,
        message.expires_at_ms,
        message.message_id,
        dedupe_key(message) if dedupe and message.message_id is not None else None,
        message.correlation_id,
        message.reply_to,
        message.last_error,
        orjson.dumps([d.to_dict() for d in message.deaths]).decode() if message.deaths else None,
        message.queue,
        seq,
        message.enqueued_at_ms,
        message.queue_expires_at_ms,
        visible_at_ms,
        receipt,
    )
    present = tuple([value is not None for value in optional])
    return _INSERTS.get(present) or _insert_sql(present), (
        message.id,
        message.destination,
        _VALUES[message.state],
        bytearray(message.body),  # bound as a blob without the adaptation protocol
        orjson.dumps(message.headers).decode() if message.headers else "{}",
        message.sent_at_ms,
        message.deliver_at_ms,
        reports_text(message.report),
        _VALUES[message.on_undeliverable],
        int(message.persistent),
        message.failures,
        int(message.redelivered),
        message.delivery_count,
        message.updated_at_ms,
        *[value for value in optional if value is not None],
    )


#: Most rows one multi-row INSERT writes (its parameters stay far below SQLite's 32,766).
MAX_ROWS_PER_INSERT = 256
#: ``insert_released`` writes fewer rows than this (a release round's few, the rest of a
#: larger batch) in one statement of exactly their count, not in power-of-two chunks: a
#: statement per round whatever it found, for a dozen more cached statements per shape.
EXACT_ROWS_BELOW = 16
_MULTI: dict[tuple[str, int], str] = {}


def _multi_sql(sql: str, count: int) -> str:
    """``sql`` (one row's INSERT) writing ``count`` rows in one statement."""
    multi = _MULTI.get((sql, count))
    if multi is None:
        row = sql[sql.index(" VALUES ") + 8 :]
        multi = _MULTI[(sql, count)] = sql + ("," + row) * (count - 1)
    return multi


def insert_rows(conn: SqlConnection, inserts: Iterable[Insert]) -> None:
    """Write ``inserts`` with multi-row INSERTs (rows setting the same columns together, in
    chunks of powers of two up to ``MAX_ROWS_PER_INSERT``, so few statements get prepared).

    Not ``executemany``: Python's sqlite3 lets go of the GIL around every row's step and must
    take it back after each one; while another thread runs Python (the server's event loop
    under load) each take waits for that thread's switch interval, so a batch's rows wait
    one interval after another. One statement per chunk steps once."""
    groups: dict[str, list[tuple[Any, ...]]] = {}
    for sql, values in inserts:
        groups.setdefault(sql, []).append(values)
    for sql, rows in groups.items():
        start = 0
        while start < len(rows):
            count = min(len(rows) - start, MAX_ROWS_PER_INSERT)
            count = 1 << (count.bit_length() - 1)  # the largest power of two that fits
            chunk = rows[start : start + count]
            conn.execute(_multi_sql(sql, count), list(chain.from_iterable(chunk)))
            start += count


#: A plain message released into a queue, as ``insert_released`` writes it: (id, body,
#: sent_at_ms, deliver_at_ms, seq, expires_at_ms, queue_expires_at_ms, message_id,
#: dedupe_key, correlation_id): an idempotent producer's message carries its ``message_id``
#: and the key that ``dedupe_key`` gives it (``queue_dedupe_key``), or None where another row
#: holds that key.
Released = tuple[
    str, bytes, int, int, int, int | None, int | None, str | None, str | None, str | None
]
#: Where a ``Released`` row holds its de-duplication key.
RELEASED_KEY: Final = 8
_RELEASED_SQL: dict[tuple[tuple[bool, ...], int], str] = {}
#: The columns of ``Released`` after ``seq`` that a row may leave unset; a row's shape says
#: which it sets (``_BARE``: none).
_RELEASED_OPTIONAL = (
    "expires_at_ms",
    "queue_expires_at_ms",
    "message_id",
    "dedupe_key",
    "correlation_id",
)
_BARE = (False,) * len(_RELEASED_OPTIONAL)


def is_plain(message: Message) -> bool:
    """Whether ``message`` sets no column beyond those ``insert_released`` writes (no headers,
    topic, reports, failures or deaths, default delivery options; a ``message_id`` and a
    ``correlation_id`` it may have): most released messages."""
    return not (
        message.headers
        or message.topic
        or message.reply_to
        or message.report
        or message.failures
        or message.last_error
        or message.deaths
        or message.redelivered
        or message.delivery_count
        or not message.persistent
        or message.on_undeliverable is not Undeliverable.DEAD_LETTER
    )


# The state and the default choice a plain released message has, bound like the other shared
# values so the enums stay the only spelling of them.
_READY = MessageState.READY.value
_DEAD_LETTER = Undeliverable.DEAD_LETTER.value


def _released_sql(shape: tuple[bool, ...], count: int) -> str:
    """The INSERT of ``count`` released rows of one shape: whether they set each of
    ``_RELEASED_OPTIONAL``."""
    sql = _RELEASED_SQL.get((shape, count))
    if sql is None:
        varying = ["id", "body", "sent_at_ms", "deliver_at_ms", "seq"]
        varying += [n for n, p in zip(_RELEASED_OPTIONAL, shape, strict=True) if p]
        names = [*varying, "destination", "queue", "state", "headers", "on_undeliverable"]
        names += ["persistent", "enqueued_at_ms", "visible_at_ms", "updated_at_ms"]
        row = f"({', '.join('?' * len(varying))})"
        sql = (
            f"INSERT INTO messages ({', '.join(names)}) "
            f"SELECT {', '.join(f'v.column{i + 1}' for i in range(len(varying)))}, "
            "?, ?, ?, '{}', ?, 1, ?, ?, ? "
            f"FROM (VALUES {', '.join([row] * count)}) AS v "
            # ``WHERE true``: without it SQLite would read ``ON`` as a join's (its upsert docs).
            "WHERE true ON CONFLICT DO NOTHING"
        )
        _RELEASED_SQL[(shape, count)] = sql
    return sql


def insert_released(
    conn: SqlConnection, *, queue: str, now_ms: int, rows: Sequence[Released]
) -> int:
    """Write plain messages (``is_plain``) released into ``queue`` at ``now_ms``, in the state
    ``enqueue`` gives them (ready, visible at once), as ``insert_rows`` would write their
    ``to_insert`` rows. Column-wise: what every row shares is bound once per statement and
    only the varying columns once per row (binding is most of the Python-side cost of a row).

    A row whose id is taken already is not written, nor one whose de-duplication key another
    row holds (``release_writes`` tells the two apart). Returns how many were written, so the
    caller learns of such rows without looking every id up first."""
    shapes: dict[tuple[bool, ...], list[tuple[Any, ...]]] = {}
    for id_, body, sent, due, seq, expires, queue_expires, message_id, key, correlation in rows:
        # ``bytearray``: bound as a blob without the adaptation protocol (see ``to_insert``).
        values: tuple[Any, ...] = (id_, bytearray(body), sent, due, seq)
        if (
            expires is None
            and queue_expires is None
            and message_id is None
            and key is None
            and correlation is None
        ):
            shape = _BARE  # most rows
        else:
            optional = (expires, queue_expires, message_id, key, correlation)
            shape = tuple([value is not None for value in optional])
            values += tuple([value for value in optional if value is not None])
        shapes.setdefault(shape, []).append(values)
    shared = (queue, queue, _READY, _DEAD_LETTER, now_ms, now_ms, now_ms)
    written = 0
    for shape, values_of in shapes.items():
        start = 0
        while start < len(values_of):
            count = min(len(values_of) - start, MAX_ROWS_PER_INSERT)
            if count >= EXACT_ROWS_BELOW:  # as in ``insert_rows``; a small rest in one go
                count = 1 << (count.bit_length() - 1)
            chunk = values_of[start : start + count]
            written += conn.execute(
                _released_sql(shape, count),
                [*shared, *chain.from_iterable(chunk)],
            ).rowcount
            start += count
    return written


def released_row(queue: str, now_ms: int, released: Released) -> tuple[Any, ...]:
    """The row ``insert_released`` writes for ``released``, as ``SELECT_SQL`` reads it back
    (without the row key): the columns it binds, and the defaults of the others."""
    id_, body, sent, due, seq, expires, queue_expires, message_id, key, correlation_id = released
    return (
        *(id_, queue, None, _READY, bytes(body), "{}", sent, due, expires),
        *(message_id, key, correlation_id, None, "", _DEAD_LETTER, 1, 0, None, None),
        *(queue, seq, now_ms, queue_expires, now_ms, None, 0, 0, now_ms),
    )


def plain_released_rows(
    queue: str,
    now_ms: int,
    columns: tuple[
        Sequence[str], Sequence[bytes], Sequence[int], Sequence[int], Sequence[str | None]
    ],
    seqs: Iterable[int],
) -> list[tuple[Any, ...]]:
    """``released_row`` of each message of ``columns`` (ids, bodies, sent, due, correlation
    ids) that neither expires nor has a ``message_id``, entering ``queue`` as ``seqs``: a
    release kept in memory makes its rows column-wise, with no ``Released`` in between."""
    ids, bodies, sent, due, correlation_ids = columns
    ready, dead_letter = _READY, _DEAD_LETTER
    # One flat tuple display a row: starred parts or a call a row cost twice as much.
    return [
        (id_, queue, None, ready, body, "{}", sent_ms, due_ms, None, None, None, correlation_id,
         None, "", dead_letter, 1, 0, None, None, queue, seq, now_ms, None, now_ms, None, 0, 0,
         now_ms)
        for id_, body, sent_ms, due_ms, correlation_id, seq in zip(
            ids, bodies, sent, due, correlation_ids, seqs, strict=True
        )
    ]  # fmt: skip


def dedupe_key(message: Message) -> str | None:
    """Producer sends de-duplicate on (destination, message_id), where a topic copy's destination
    is its topic and queue; copies tarry makes itself (dead letters, reports) do not.
    The parts are joined with U+001F (unit separator): names cannot hold it and text columns
    of every store can (PostgreSQL refuses NUL)."""
    if message.message_id is None or message.deaths:
        return None
    return _joined_key(message.topic, message.destination, message.message_id)


def queue_dedupe_key(queue: str, message_id: str | None) -> str | None:
    """``dedupe_key`` of a producer's message sent to ``queue`` itself (no topic, no deaths),
    from its columns."""
    return None if message_id is None else _joined_key(None, queue, message_id)


def _joined_key(topic: str | None, destination: str, message_id: str) -> str:
    return f"{topic or ''}\x1f{destination}\x1f{message_id}"


#: Keys looked up per statement (well under SQLite's bound on parameters).
_KEYS_PER_LOOKUP = 500
_DEDUPE_AT = COLUMNS.index("dedupe_key")


def kept_by_dedupe_key(conn: SqlConnection, keys: Iterable[str]) -> dict[str, Message]:
    """The kept message of each of ``keys`` (``dedupe_key``) that a row holds: one statement
    per 500 keys, not one per key (a batch of repeats is a rerun's every message)."""
    wanted = list(keys)
    found: dict[str, Message] = {}
    for start in range(0, len(wanted), _KEYS_PER_LOOKUP):
        chunk = wanted[start : start + _KEYS_PER_LOOKUP]
        marks = ", ".join("?" * len(chunk))
        for row in conn.execute(f"{SELECT_SQL} WHERE dedupe_key IN ({marks})", chunk):
            found[row[_DEDUPE_AT]] = from_row(row)
    return found


_STATES = {state.value: state for state in MessageState}
_DELIVERED = MessageState.DELIVERED.value
_UNDELIVERABLE = {choice.value: choice for choice in Undeliverable}


def from_row(row: Sequence[Any], *, delivered_at_ms: int | None = None) -> Message:
    """The message of ``row`` (``SELECT_SQL``'s columns); with ``delivered_at_ms``, as a
    receive at that time leaves it (``queues.txn.QueueTxn.receive``'s UPDATE): delivered once
    more, redelivered if it was delivered before."""
    (
        id_,
        destination,
        topic,
        state,
        body,
        headers,
        sent_at,
        deliver_at,
        expires_at,
        message_id,
        _dedupe,
        correlation_id,
        reply_to,
        report,
        on_undeliverable,
        persistent,
        failures,
        last_error,
        deaths,
        queue,
        _seq,
        enqueued_at,
        queue_expires_at,
        _visible_at,
        _receipt,
        redelivered,
        delivery_count,
        updated_at,
    ) = row
    # Receive and ack read hundreds of rows a call: the enums are looked up in dicts (cheaper
    # than calling the enum), the usual empty values skip their parsing, and the message is
    # built positionally (keywords go through a dict), in ``Message``'s field order, in the
    # state a receive leaves it rather than changed after (each attribute set is a call);
    # tests/store/test_sqlite_rows.py gives every field a value of its own.
    if delivered_at_ms is not None:
        state, updated_at = _DELIVERED, delivered_at_ms
        redelivered = redelivered or delivery_count > 0
        delivery_count += 1
    return Message(
        id_,
        destination,
        body or b"",
        {} if headers == "{}" else orjson.loads(headers),
        sent_at,
        deliver_at,
        expires_at,
        _STATES[state],
        message_id,
        correlation_id,
        reply_to,
        parse_reports(report),
        _UNDELIVERABLE[on_undeliverable],
        bool(persistent),
        topic,
        failures,
        last_error,
        [Death.from_dict(d) for d in orjson.loads(deaths)] if deaths else [],
        queue,
        enqueued_at,
        queue_expires_at,
        bool(redelivered),
        delivery_count,
        updated_at,
    )
