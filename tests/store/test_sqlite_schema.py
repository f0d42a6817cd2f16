"""The SQLite schema's migrations, from a database as the tarry before them wrote it (an SQLite
store's file, or a queue database of its own, keyed): version 5 moves to finding finished
messages through an index whose condition is written as comparisons (``schema.FINISHED``);
version 6 to a receipt index holding only receipts of the form made before receipts named
their row (``schema.OLD_RECEIPT``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tarry.queues.receipts import held_by_receipt
from tarry.store.sqlite.schema import FINISHED, OLD_RECEIPT, SCHEMA_VERSION, is_keyed, migrate

NOW = 1_700_000_000_000
#: ``messages_finished`` as version 5 made it.
_FINISHED_V5 = (
    "CREATE INDEX messages_finished ON messages(updated_at_ms) "
    "WHERE state IN ('acked','cancelled','expired','dead_lettered')"
)


#: ``messages_receipt`` as versions 1 to 6 made it.
_RECEIPT_V6 = "CREATE INDEX messages_receipt ON messages(receipt) WHERE receipt IS NOT NULL"
#: A receipt of the older form (an id alone), and the in-flight row of ``_older`` holding it.
OLD = "01JOLDFORMRECEIPT000000000"


def _older(path: Path, *, keyed: bool, version: int) -> None:
    """A database as tarry at schema ``version`` (5 or 6) left it (this version's, with the
    indexes later versions changed as ``version`` made them), holding an acked message finished
    long ago, a ready one, and two in flight: the third under a receipt of the older form, the
    fourth under one naming its row."""
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, queues_only=keyed)
    assert SCHEMA_VERSION == 7  # a later version: make its predecessor the same way
    script = f"DROP INDEX messages_receipt; {_RECEIPT_V6};"
    if version < 6:
        script += f"DROP INDEX messages_finished; {_FINISHED_V5};"
    conn.executescript(f"{script} PRAGMA user_version = {version};")
    for seq, state, receipt in (
        (1, "acked", None),
        (2, "ready", None),
        (3, "delivered", OLD),
        (4, "delivered", "01JNEWFORMRECEIVE000000000.4"),
    ):
        conn.execute(
            "INSERT INTO messages (id, destination, state, headers, sent_at_ms, deliver_at_ms, "
            "on_undeliverable, persistent, queue, seq, receipt, visible_at_ms, updated_at_ms) "
            "VALUES (?, 'orders', ?, '{}', ?, ?, 'dead_letter', 1, 'orders', ?, ?, ?, ?)",
            (f"000000000{seq}AAAAAAAAAAAAAAAA", state, NOW, NOW, seq, receipt, NOW, NOW),
        )
    conn.close()


def _migrated(
    tmp_path: Path, *, keyed: bool, version: int, finished_in: bool
) -> sqlite3.Connection:
    """The database ``_older`` makes, opened by this tarry; ``finished_in``: its finished
    messages' index was made with an ``IN`` list before."""
    path = tmp_path / "queues.db"
    _older(path, keyed=keyed, version=version)
    conn = sqlite3.connect(path, isolation_level=None)
    assert (" IN " in _index(conn, "messages_finished")) is finished_in
    migrate(conn, queues_only=keyed)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert is_keyed(conn) is keyed
    return conn


def _plan(conn: sqlite3.Connection, sql: str, args: tuple[object, ...]) -> str:
    return " ".join(str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args))


def _index(conn: sqlite3.Connection, name: str) -> str:
    row = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()
    return str(row[0])


@pytest.mark.parametrize("keyed", [False, True], ids=["sqlite-store", "queue-database"])
def test_a_version_5_database_finds_finished_messages_through_the_comparisons(
    tmp_path: Path, keyed: bool
) -> None:
    conn = _migrated(tmp_path, keyed=keyed, version=5, finished_in=True)
    assert _index(conn, "messages_finished").endswith(f"WHERE {FINISHED}")
    assert " IN " not in _index(conn, "messages_finished")
    purge = (
        "SELECT rowid FROM messages WHERE "
        f"{FINISHED} AND updated_at_ms < ? LIMIT 10"  # as the store's purge words it
    )
    assert "messages_finished" in _plan(conn, purge, (NOW,))
    assert [r[0] for r in conn.execute(purge, (NOW + 1,))] == [1]
    assert [r[0] for r in conn.execute("SELECT state FROM messages ORDER BY rowid")] == [
        "acked",
        "ready",
        "delivered",
        "delivered",
    ]
    conn.close()


@pytest.mark.parametrize("keyed", [False, True], ids=["sqlite-store", "queue-database"])
def test_a_new_database_has_the_indexes_a_migrated_one_has(tmp_path: Path, keyed: bool) -> None:
    def indexes(conn: sqlite3.Connection) -> dict[str, str]:
        return dict(
            conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
            )
        )

    _older(tmp_path / "old.db", keyed=keyed, version=5)
    old = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    new = sqlite3.connect(tmp_path / "new.db", isolation_level=None)
    migrate(old, queues_only=keyed)
    migrate(new, queues_only=keyed)
    assert indexes(old)["messages_finished"] == indexes(new)["messages_finished"]
    assert indexes(old)["messages_receipt"] == indexes(new)["messages_receipt"]
    assert set(indexes(old)) == set(indexes(new))


@pytest.mark.parametrize("keyed", [False, True], ids=["sqlite-store", "queue-database"])
def test_a_version_6_database_keeps_only_older_receipts_in_the_receipt_index(
    tmp_path: Path, keyed: bool
) -> None:
    conn = _migrated(tmp_path, keyed=keyed, version=6, finished_in=False)
    assert _index(conn, "messages_receipt").endswith(f"WHERE {OLD_RECEIPT}")
    # The index holds the older receipt alone: a receive and an ack of today write none
    indexed = f"SELECT receipt FROM messages INDEXED BY messages_receipt WHERE {OLD_RECEIPT}"
    assert conn.execute(indexed).fetchall() == [(OLD,)]
    # Each receipt still finds its message in flight: the older one through that index
    lookup = (
        "SELECT rowid FROM messages WHERE receipt IN (SELECT value FROM json_each(?)) "
        f"AND {OLD_RECEIPT}"  # as held_by_receipt words it
    )
    assert "messages_receipt" in _plan(conn, lookup, ("[]",))
    new = "01JNEWFORMRECEIVE000000000.4"
    found = held_by_receipt(conn, "orders", [OLD, new, "01JNEWFORMRECEIVE000000000.x"])
    assert {receipt: (key, m.id) for receipt, (key, m) in found.items()} == {
        OLD: (3, "0000000003AAAAAAAAAAAAAAAA"),
        new: (4, "0000000004AAAAAAAAAAAAAAAA"),
    }
    conn.close()
