"""The PostgreSQL schema and its versioned migrations, applied by tarry itself.

The tables mirror the embedded store's (``store/sqlite/schema.py``) column for column, so the
same row codec (``store/sqlite/rows.py``) and the same queue rules (``queues/txn.py``) run on
both. PostgreSQL adds two columns for claims that must outlive a transaction (the lease of the
at-least-once path): ``claimed_by`` (the node) and ``claim_until_ms`` (when the claim lapses).

Every node runs ``migrate`` at start under a transaction-scoped advisory lock, so several nodes
starting at once migrate once; a database whose version is newer than this tarry is refused.
"""

from __future__ import annotations

import psycopg

from tarry.errors import Unavailable

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate"]

#: Any fixed number; it names the lock that serialises migrations between nodes.
_MIGRATION_LOCK = 0x7461727279  # "tarry"

_TERMINAL = "('acked','cancelled','expired','dead_lettered')"

#: Each entry moves the schema from version i to i + 1. Never edit a released entry; add one.
MIGRATIONS: list[str] = [
    f"""
    CREATE TABLE messages (
        id TEXT PRIMARY KEY,
        destination TEXT NOT NULL,
        topic TEXT,
        state TEXT NOT NULL,
        body BYTEA,
        headers TEXT NOT NULL,
        sent_at_ms BIGINT NOT NULL,
        deliver_at_ms BIGINT NOT NULL,
        expires_at_ms BIGINT,
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
        retry_at_ms BIGINT NOT NULL DEFAULT 0,
        queue TEXT,
        seq BIGINT,
        enqueued_at_ms BIGINT,
        queue_expires_at_ms BIGINT,
        visible_at_ms BIGINT,
        receipt TEXT,
        redelivered INTEGER NOT NULL DEFAULT 0,
        delivery_count INTEGER NOT NULL DEFAULT 0,
        updated_at_ms BIGINT NOT NULL,
        claimed_by TEXT,
        claim_until_ms BIGINT
    );
    -- "the next due messages" is a range scan over scheduled rows only
    CREATE INDEX messages_due ON messages (deliver_at_ms, id) WHERE state = 'scheduled';
    -- when the earliest claim lapses (a dead node's messages come back then)
    CREATE INDEX messages_claims ON messages (claim_until_ms)
        WHERE state = 'scheduled' AND claimed_by IS NOT NULL;
    CREATE UNIQUE INDEX messages_dedupe ON messages (dedupe_key) WHERE dedupe_key IS NOT NULL;
    CREATE INDEX messages_queue ON messages (queue, seq) WHERE state IN ('ready', 'delivered');
    CREATE INDEX messages_queue_expiry ON messages (queue_expires_at_ms)
        WHERE state IN ('ready', 'delivered') AND queue_expires_at_ms IS NOT NULL;
    CREATE INDEX messages_receipt ON messages (receipt) WHERE receipt IS NOT NULL;
    CREATE INDEX messages_finished ON messages (updated_at_ms) WHERE state IN {_TERMINAL};
    CREATE INDEX messages_correlation ON messages (correlation_id)
        WHERE correlation_id IS NOT NULL;
    CREATE INDEX messages_destination ON messages (destination, deliver_at_ms, id);
    -- Rows churn fast (scheduled -> ready -> delivered -> acked): keep statistics fresh.
    ALTER TABLE messages SET (
        autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_scale_factor = 0.05
    );
    CREATE TABLE queues (
        name TEXT PRIMARY KEY,
        args TEXT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        last_used_ms BIGINT NOT NULL
    );
    CREATE TABLE topics (name TEXT PRIMARY KEY, created_at_ms BIGINT NOT NULL);
    CREATE TABLE subscriptions (
        topic TEXT NOT NULL,
        queue TEXT NOT NULL,
        PRIMARY KEY (topic, queue)
    );
    CREATE TABLE policies (name TEXT PRIMARY KEY, definition TEXT NOT NULL);
    -- Tell every node (listen.py) that the catalog changed, and which node changed it
    -- (each node names its connections after itself: application_name).
    CREATE FUNCTION tarry_notify_catalog() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('tarry_catalog', current_setting('application_name'));
        RETURN NULL;
    END $$;
    CREATE TRIGGER queues_changed AFTER INSERT OR UPDATE OR DELETE ON queues
        FOR EACH STATEMENT EXECUTE FUNCTION tarry_notify_catalog();
    CREATE TRIGGER topics_changed AFTER INSERT OR UPDATE OR DELETE ON topics
        FOR EACH STATEMENT EXECUTE FUNCTION tarry_notify_catalog();
    CREATE TRIGGER subscriptions_changed AFTER INSERT OR UPDATE OR DELETE ON subscriptions
        FOR EACH STATEMENT EXECUTE FUNCTION tarry_notify_catalog();
    CREATE TRIGGER policies_changed AFTER INSERT OR UPDATE OR DELETE ON policies
        FOR EACH STATEMENT EXECUTE FUNCTION tarry_notify_catalog();
    """,
    # A queue's ready and in-flight messages each get an index of their own (one index over
    # both made a receive step over every message in flight; see tarry.queues.txn).
    """
    DROP INDEX IF EXISTS messages_queue;
    CREATE INDEX IF NOT EXISTS messages_ready ON messages (queue, seq) WHERE state = 'ready';
    CREATE INDEX IF NOT EXISTS messages_held ON messages (queue, visible_at_ms)
        WHERE state = 'delivered';
    """,
    # Recurring schedules (tarry.queues.schedule_rows), shared by every node.
    """
    CREATE TABLE IF NOT EXISTS schedules (
        name TEXT PRIMARY KEY,
        definition TEXT NOT NULL,
        revision_ms BIGINT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        planned_through_ms BIGINT NOT NULL,
        finished INTEGER NOT NULL DEFAULT 0,
        owner TEXT,
        lease_until_ms BIGINT NOT NULL DEFAULT 0,
        last_error TEXT
    );
    """,
    # Routes put at run time (PUT /v1/routes/{name}), shared by every node like the rest of
    # the catalog: a change tells every node to reload it.
    """
    CREATE TABLE IF NOT EXISTS routes (
        name TEXT PRIMARY KEY,
        definition TEXT NOT NULL,
        updated_at_ms BIGINT NOT NULL
    );
    CREATE OR REPLACE TRIGGER routes_changed AFTER INSERT OR UPDATE OR DELETE ON routes
        FOR EACH STATEMENT EXECUTE FUNCTION tarry_notify_catalog();
    """,
]

SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: psycopg.Connection[tuple[object, ...]], *, target: int = SCHEMA_VERSION) -> int:
    """Bring the database up to ``target`` (default: this tarry's version) and return the
    version found before. Raises ``Unavailable`` for a database from a newer tarry."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute("CREATE TABLE IF NOT EXISTS tarry_schema (version INTEGER NOT NULL)")
        row = conn.execute("SELECT version FROM tarry_schema").fetchone()
        if row is None:
            conn.execute("INSERT INTO tarry_schema (version) VALUES (0)")
            found = 0
        else:
            found = int(str(row[0]))
        if found > SCHEMA_VERSION:
            raise Unavailable(
                f"the PostgreSQL database has tarry schema version {found}, newer than this "
                f"tarry understands ({SCHEMA_VERSION}); upgrade tarry on every node"
            )
        for version in range(found, target):
            conn.execute(MIGRATIONS[version].encode())
            conn.execute("UPDATE tarry_schema SET version = %s", (version + 1,))
    return found
