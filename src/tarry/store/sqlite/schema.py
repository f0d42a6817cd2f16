"""The SQLite schema and its versioned migrations.

One database holds the delayed store and the local queues, so that moving a due message into
its queue is one transaction: that is what makes release exactly-once across crashes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from tarry.errors import Unavailable

__all__ = ["FINISHED", "OLD_RECEIPT", "SCHEMA_VERSION", "is_keyed", "migrate"]

_TERMINAL = "('acked','cancelled','expired','dead_lettered')"
#: A finished message (``messages_finished``'s condition; a query must state it in these words
#: for SQLite to use that index). Written as comparisons, not ``state IN (...)``: SQLite tests a
#: partial index's condition at every write of a row whose ``state`` or ``updated_at_ms``
#: changes (each receive, each ack), and a list of more than two values is built into a
#: look-up table each time it is tested.
FINISHED = "(" + " OR ".join(f"state = {s}" for s in _TERMINAL[1:-1].split(",")) + ")"
#: A receipt of the form made before receipts named their row (``queues.receipts``): no dot.
#: Only those are found through ``messages_receipt`` (a query must state this condition in
#: these words for SQLite to use the index); a receipt naming its row is found by its key, so
#: since version 7 the index holds no such receipt, and a receive and an ack do not write one.
OLD_RECEIPT = "instr(receipt, '.') = 0"

#: The columns of ``messages`` after ``id`` (both layouts, see ``migrate``).
_COLUMNS = """
        destination TEXT NOT NULL,
        topic TEXT,
        state TEXT NOT NULL,
        body BLOB,
        headers TEXT NOT NULL,
        sent_at_ms INTEGER NOT NULL,
        deliver_at_ms INTEGER NOT NULL,
        expires_at_ms INTEGER,
        message_id TEXT,
        dedupe_key TEXT,
        correlation_id TEXT,
        reply_to TEXT,
        report TEXT NOT NULL DEFAULT '',
        on_undeliverable TEXT NOT NULL,
        persistent INTEGER NOT NULL,
        failures INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        deaths TEXT,
        retry_at_ms INTEGER NOT NULL DEFAULT 0,
        queue TEXT,
        seq INTEGER,
        enqueued_at_ms INTEGER,
        queue_expires_at_ms INTEGER,
        visible_at_ms INTEGER,
        receipt TEXT,
        redelivered INTEGER NOT NULL DEFAULT 0,
        delivery_count INTEGER NOT NULL DEFAULT 0,
        updated_at_ms INTEGER NOT NULL"""
#: Indexes every version has.
_INDEXES_KEPT = """
    -- "the next due messages" is a range scan over scheduled rows only
    CREATE INDEX messages_due ON messages(deliver_at_ms, id) WHERE state = 'scheduled';
    CREATE UNIQUE INDEX messages_dedupe ON messages(dedupe_key) WHERE dedupe_key IS NOT NULL;
    CREATE INDEX messages_queue_expiry ON messages(queue_expires_at_ms)
        WHERE state IN ('ready', 'delivered') AND queue_expires_at_ms IS NOT NULL;
    CREATE INDEX messages_correlation ON messages(correlation_id) WHERE correlation_id IS NOT NULL;
    CREATE INDEX messages_destination ON messages(destination, deliver_at_ms, id);
"""
#: Version 1 (``MIGRATIONS[0]``) found a queue's messages through one index over both states,
#: finished ones with an ``IN`` list (until version 6, see ``FINISHED``), and every receipt
#: through an index (until version 7, see ``OLD_RECEIPT``).
_QUEUE_INDEX_V1 = f"""
    CREATE INDEX messages_receipt ON messages(receipt) WHERE receipt IS NOT NULL;
    CREATE INDEX messages_queue ON messages(queue, seq) WHERE state IN ('ready', 'delivered');
    CREATE INDEX messages_finished ON messages(updated_at_ms) WHERE state IN {_TERMINAL};
"""
_FINISHED_INDEX = f"""
    CREATE INDEX IF NOT EXISTS messages_finished ON messages(updated_at_ms) WHERE {FINISHED};
"""
#: Since version 3 a queue's ready and in-flight messages each have an index of their own: one
#: index over both made a receive step over every message in flight before the first ready one,
#: so a consumer holding many messages made every receive slower.
_QUEUE_INDEXES = """
    CREATE INDEX IF NOT EXISTS messages_ready ON messages(queue, seq) WHERE state = 'ready';
    CREATE INDEX IF NOT EXISTS messages_held ON messages(queue, visible_at_ms)
        WHERE state = 'delivered';
"""
_RECEIPT_INDEX = f"""
    CREATE INDEX IF NOT EXISTS messages_receipt ON messages(receipt) WHERE {OLD_RECEIPT};
"""
#: The indexes of the current version (a ``messages`` table made anew, ``_KEYED``).
_INDEXES = _INDEXES_KEPT + _QUEUE_INDEXES + _FINISHED_INDEX + _RECEIPT_INDEX

#: Each entry moves the schema from version i to i + 1: a script, or a step run in a transaction.
MIGRATIONS: list[str | Callable[[sqlite3.Connection], object]] = [
    f"""
    CREATE TABLE messages (id TEXT PRIMARY KEY, {_COLUMNS});
    {_INDEXES_KEPT}
    {_QUEUE_INDEX_V1}
    CREATE TABLE queues (
        name TEXT PRIMARY KEY,
        args TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL,
        last_used_ms INTEGER NOT NULL
    );
    CREATE TABLE topics (name TEXT PRIMARY KEY, created_at_ms INTEGER NOT NULL);
    CREATE TABLE subscriptions (
        topic TEXT NOT NULL,
        queue TEXT NOT NULL,
        PRIMARY KEY (topic, queue)
    );
    CREATE TABLE policies (name TEXT PRIMARY KEY, definition TEXT NOT NULL);
    """,
    # De-duplication keys join their parts with U+001F instead of NUL (PostgreSQL shares the
    # row codec and refuses NUL in text). SQLite's text functions stop at NUL: done in Python.
    lambda conn: conn.executemany(
        "UPDATE messages SET dedupe_key = ? WHERE rowid = ?",
        [
            (key.replace("\x00", "\x1f"), rowid)
            for rowid, key in conn.execute(
                "SELECT rowid, dedupe_key FROM messages WHERE instr(dedupe_key, char(0)) > 0"
            ).fetchall()
        ],
    ),
    "DROP INDEX IF EXISTS messages_queue;" + _QUEUE_INDEXES,
    # Recurring schedules (tarry.queues.schedule_rows).
    """
    CREATE TABLE IF NOT EXISTS schedules (
        name TEXT PRIMARY KEY,
        definition TEXT NOT NULL,
        revision_ms INTEGER NOT NULL,
        created_at_ms INTEGER NOT NULL,
        planned_through_ms INTEGER NOT NULL,
        finished INTEGER NOT NULL DEFAULT 0,
        owner TEXT,
        lease_until_ms INTEGER NOT NULL DEFAULT 0,
        last_error TEXT
    );
    """,
    # Routes put at run time (PUT /v1/routes/{name}): the route's JSON, secrets included.
    """
    CREATE TABLE IF NOT EXISTS routes (
        name TEXT PRIMARY KEY,
        definition TEXT NOT NULL,
        updated_at_ms INTEGER NOT NULL
    );
    """,
    "DROP INDEX IF EXISTS messages_finished;" + _FINISHED_INDEX,
    "DROP INDEX IF EXISTS messages_receipt;" + _RECEIPT_INDEX,
]

SCHEMA_VERSION = len(MIGRATIONS)

#: A queue database of its own (the log and memory stores keep scheduled messages elsewhere)
#: takes rows when they are released, in due order, while ids sort by creation time: an index
#: on ``id`` would take each row on a random page (and each commit would write hundreds of those
#: pages to the WAL). Its rows are found through ``key`` instead: the id with its last 16
#: characters first, which for an id made by ``new_due`` starts with the due time, so rows are
#: added near the end of that index (``tarry.store.sql.id_column``) and each commit writes few
#: pages. The SQLite store keeps ``id`` as its key: it takes its rows in creation order.
_KEYED = f"""
    CREATE TABLE messages_keyed (
        id TEXT NOT NULL,
        key TEXT NOT NULL GENERATED ALWAYS AS (substr(id, 11) || substr(id, 1, 10)) VIRTUAL,
        {_COLUMNS}
    );
    INSERT INTO messages_keyed (id, {{names}}) SELECT id, {{names}} FROM messages ORDER BY rowid;
    DROP TABLE messages;
    ALTER TABLE messages_keyed RENAME TO messages;
    CREATE UNIQUE INDEX messages_key ON messages(key);
    {_INDEXES}
"""


def is_keyed(conn: sqlite3.Connection) -> bool:
    """Whether ``messages`` finds rows by ``key`` (a queue database of its own, see ``_KEYED``)."""
    return any(row[1] == "key" for row in conn.execute("PRAGMA table_xinfo(messages)"))


def migrate(conn: sqlite3.Connection, *, queues_only: bool = False) -> None:
    """Bring the database up to ``SCHEMA_VERSION``; refuse a database from a newer tarry. With
    ``queues_only`` (a queue database of its own) the ``messages`` table is rebuilt keyed in
    release order (``_KEYED``) when it is not yet, e.g. made by an older tarry."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise Unavailable(
            f"the database has schema version {version}, newer than this tarry understands "
            f"({SCHEMA_VERSION}); upgrade tarry"
        )
    for target in range(version, SCHEMA_VERSION):
        step = MIGRATIONS[target]
        if isinstance(step, str):
            conn.executescript("BEGIN;" + step + f"; PRAGMA user_version = {target + 1}; COMMIT;")
            continue
        conn.execute("BEGIN")
        try:
            step(conn)
            conn.execute(f"PRAGMA user_version = {target + 1}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    if queues_only and not is_keyed(conn):
        names = [r[1] for r in conn.execute("PRAGMA table_info(messages)") if r[1] != "id"]
        try:
            conn.executescript("BEGIN;" + _KEYED.format(names=", ".join(names)) + "; COMMIT;")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
