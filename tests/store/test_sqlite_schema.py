"""The SQLite schema's migrations, from a database as the tarry before them wrote it: version 5
(an SQLite store's file, or a queue database of its own, keyed) moves to finding finished
messages through an index whose condition is written as comparisons (``schema.FINISHED``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tarry.store.sqlite.schema import FINISHED, SCHEMA_VERSION, is_keyed, migrate

NOW = 1_700_000_000_000
#: ``messages_finished`` as version 5 made it.
_FINISHED_V5 = (
    "CREATE INDEX messages_finished ON messages(updated_at_ms) "
    "WHERE state IN ('acked','cancelled','expired','dead_lettered')"
)


def _version_5(path: Path, *, keyed: bool) -> None:
    """A database as tarry at schema version 5 left it (this version's, with the one index
    version 6 changed as version 5 made it), holding an acked message finished long ago and a
    ready one."""
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, queues_only=keyed)
    assert SCHEMA_VERSION == 6  # a later version: make its predecessor the same way
    conn.executescript(f"DROP INDEX messages_finished; {_FINISHED_V5}; PRAGMA user_version = 5;")
    for name, state in (
        ("0000000001AAAAAAAAAAAAAAAA", "acked"),
        ("0000000002AAAAAAAAAAAAAAAA", "ready"),
    ):
        conn.execute(
            "INSERT INTO messages (id, destination, state, headers, sent_at_ms, deliver_at_ms, "
            "on_undeliverable, persistent, queue, seq, updated_at_ms) "
            "VALUES (?, 'orders', ?, '{}', ?, ?, 'dead_letter', 1, 'orders', 1, ?)",
            (name, state, NOW, NOW, NOW),
        )
    conn.close()


def _finished_index(conn: sqlite3.Connection) -> str:
    row = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'messages_finished'").fetchone()
    return str(row[0])


@pytest.mark.parametrize("keyed", [False, True], ids=["sqlite-store", "queue-database"])
def test_a_version_5_database_finds_finished_messages_through_the_comparisons(
    tmp_path: Path, keyed: bool
) -> None:
    path = tmp_path / "queues.db"
    _version_5(path, keyed=keyed)
    conn = sqlite3.connect(path, isolation_level=None)
    assert " IN " in _finished_index(conn)
    migrate(conn, queues_only=keyed)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert is_keyed(conn) is keyed
    assert _finished_index(conn).endswith(f"WHERE {FINISHED}")
    assert " IN " not in _finished_index(conn)
    purge = (
        "SELECT rowid FROM messages WHERE "
        f"{FINISHED} AND updated_at_ms < ? LIMIT 10"  # as the store's purge words it
    )
    plan = " ".join(str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {purge}", (NOW,)))
    assert "messages_finished" in plan
    assert [r[0] for r in conn.execute(purge, (NOW + 1,))] == [1]
    assert conn.execute("SELECT state FROM messages ORDER BY rowid").fetchall() == [
        ("acked",),
        ("ready",),
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

    _version_5(tmp_path / "old.db", keyed=keyed)
    old = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    new = sqlite3.connect(tmp_path / "new.db", isolation_level=None)
    migrate(old, queues_only=keyed)
    migrate(new, queues_only=keyed)
    assert indexes(old)["messages_finished"] == indexes(new)["messages_finished"]
    assert set(indexes(old)) == set(indexes(new))
