"""The shared SQL runs on both databases: placeholders, row locks, configuration, migrations."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tarry.config import load_config
from tarry.errors import InvalidArgument
from tarry.store.postgres.database import redact_dsn
from tarry.store.postgres.dialect import PgConnection, translate
from tarry.store.sql import id_column, id_key, row_key, row_lock
from tarry.store.sqlite.database import Connection
from tarry.store.sqlite.schema import SCHEMA_VERSION, is_keyed, migrate


def test_question_marks_become_psycopg_placeholders_and_percent_signs_are_escaped() -> None:
    assert translate("a = ? AND b LIKE '5%' AND c = ?") == (
        "a = %s AND b LIKE '5%%' AND c = %s",
        None,
    )


def test_numbered_placeholders_reorder_and_repeat_the_parameters() -> None:
    assert translate("x = ?2 OR y = ?1 OR z = ?2") == ("x = %s OR y = %s OR z = %s", (1, 0, 1))


def test_a_query_without_parameters_is_left_as_it_is() -> None:
    assert translate("SELECT '100%'") == ("SELECT '100%'", None)


def test_row_locks_exist_only_where_several_nodes_share_the_database() -> None:
    assert row_lock(sqlite3.connect(":memory:")) == ""
    assert row_lock(PgConnection.__new__(PgConnection)) == " FOR UPDATE"
    assert row_lock(PgConnection.__new__(PgConnection), skip_locked=True) == (
        " FOR UPDATE SKIP LOCKED"
    )


def test_a_row_is_named_within_a_statement_by_rowid_or_by_id() -> None:
    # SQLite's rowid needs no index look-up; PostgreSQL has none, its key is the id
    assert row_key(sqlite3.connect(":memory:")) == "rowid"
    assert row_key(PgConnection.__new__(PgConnection)) == "id"


def test_the_postgres_engine_without_a_dsn_is_refused_with_what_to_set() -> None:
    with pytest.raises(InvalidArgument, match="needs store.dsn"):
        load_config(None, {"store": {"engine": "postgres"}})


def test_the_dsn_password_never_reaches_the_logs() -> None:
    config = load_config(
        None, {"store": {"engine": "postgres", "dsn": "postgresql://tarry:s3cret@db:5432/t"}}
    )
    assert "s3cret" not in str(config.redacted())
    assert "s3cret" not in redact_dsn("postgresql://tarry:s3cret@db:5432/t")
    assert config.store.consistency == "exactly_once"


def test_the_sqlite_migration_rewrites_old_dedupe_keys(tmp_path: Path) -> None:
    # Given a version-1 database holding a key joined with NUL (before PostgreSQL shared the codec)
    conn = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    conn.executescript(
        # (with the columns later versions index)
        "CREATE TABLE messages (dedupe_key TEXT, queue TEXT, seq INTEGER, state TEXT, "
        "visible_at_ms INTEGER, updated_at_ms INTEGER, receipt TEXT); PRAGMA user_version = 1;"
    )
    conn.execute("INSERT INTO messages (dedupe_key) VALUES (?)", ("\x00q\x00m-1",))
    # When this tarry opens it, the key is rewritten with the unit separator
    migrate(conn)
    assert conn.execute("SELECT dedupe_key FROM messages").fetchone() == ("\x1fq\x1fm-1",)
    assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)


@pytest.mark.parametrize("queues_only", [False, True])
def test_version_3_gives_ready_and_in_flight_messages_an_index_each(queues_only: bool) -> None:
    # Given a version-2 database, whose one queue index held both ready and in-flight messages
    conn = Connection(":memory:", isolation_level=None)
    migrate(conn, queues_only=queues_only)
    conn.executescript(
        "DROP INDEX messages_ready; DROP INDEX messages_held; CREATE INDEX messages_queue ON "
        "messages(queue, seq) WHERE state IN ('ready', 'delivered'); PRAGMA user_version = 2;"
    )
    # When this tarry opens it
    migrate(conn, queues_only=queues_only)
    # Then each state has its index, and a consumer's look at a queue uses them
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"messages_ready", "messages_held"} <= names and "messages_queue" not in names
    for state, index in (("ready", "messages_ready"), ("delivered", "messages_held")):
        plan = conn.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM messages "
            f"WHERE queue = 'q' AND state = '{state}' AND visible_at_ms <= 0 ORDER BY seq"
        ).fetchall()
        assert index in str(plan)


def test_a_queue_database_of_its_own_finds_rows_by_a_key_in_release_order() -> None:
    # Given a queue database of its own and the SQLite store's database
    queues = Connection(":memory:", isolation_level=None)
    migrate(queues, queues_only=True)
    queues.keyed = is_keyed(queues)
    store = Connection(":memory:", isolation_level=None)
    migrate(store)
    # Then the queues' rows are found through ``key`` (its index), the store's through ``id``
    assert (queues.keyed, is_keyed(store)) == (True, False)
    assert (id_column(queues), id_column(store)) == ("key", "id")
    message_id = "01HF7YAT00P5WZSBBX039YYSSQ"
    assert id_key(queues, message_id) == "P5WZSBBX039YYSSQ01HF7YAT00"
    assert id_key(store, message_id) == message_id
    plan = queues.execute(
        "EXPLAIN QUERY PLAN SELECT id FROM messages WHERE key = ?", (id_key(queues, message_id),)
    ).fetchall()
    assert "messages_key" in str(plan)
    # and the SQL's key agrees with Python's
    queues.execute(
        "INSERT INTO messages (id, destination, state, headers, sent_at_ms, deliver_at_ms, "
        "on_undeliverable, persistent, updated_at_ms) VALUES (?, 'q', 'ready', '{}', 0, 0, "
        "'dead_letter', 1, 0)",
        (message_id,),
    )
    assert queues.execute("SELECT key FROM messages").fetchone() == (id_key(queues, message_id),)
