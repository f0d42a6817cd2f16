"""Which delayed store and which queue database a configuration asks for (``[store] engine``).

- ``sqlite``: one SQLite file holds both (``SQLiteStore`` shares its database with the queues).
- ``memory``: ``MemoryStore`` plus an in-memory SQLite queue database; nothing survives.
- ``log`` (default): ``LogStore`` under ``<data_dir>/log`` plus the SQLite queue database
  ``<data_dir>/queues.db``; the log store deletes a drained partition only after a durable
  queue-database commit (its ``barrier``).
- ``postgres``: ``PostgresStore``; with ``consistency = "exactly_once"`` it is the queue database
  too (shared by every node), with ``"at_least_once"`` each node keeps its queues in its own
  SQLite file under its data directory.
"""

from __future__ import annotations

from typing import cast

from tarry.config import TarryConfig
from tarry.errors import InvalidArgument
from tarry.store.base import DelayedStore, QueueDatabase
from tarry.store.log import LogStore
from tarry.store.memory import MemoryStore
from tarry.store.sqlite.store import SQLiteStore

__all__ = ["build_stores"]


def build_stores(config: TarryConfig) -> tuple[DelayedStore, QueueDatabase | None]:
    """The delayed store, and the queue database when the store does not share one."""
    store_config = config.store
    if store_config.engine == "memory":
        return MemoryStore(), SQLiteStore(None, queues_only=True)
    if store_config.engine == "log":
        data_dir = config.server.data_dir
        if (data_dir / "tarry.db").exists() and not (data_dir / "log").exists():
            # The default engine changed from sqlite to log: never start empty beside messages
            # an earlier tarry keeps in this directory.
            raise InvalidArgument(
                f"{data_dir} holds a SQLite store (tarry.db); start it with --store sqlite "
                '(or [store] engine = "sqlite"), or choose another --data for the log store'
            )
        queues = SQLiteStore(
            config.server.data_dir / "queues.db",
            synchronous=store_config.synchronous,
            max_pages=store_config.max_pages,
            queues_only=True,
        )

        async def barrier() -> None:
            await queues.write(lambda conn: None, durable=True)

        store = LogStore(
            config.server.data_dir / "log",
            granularity_ms=store_config.granularity_ms,
            segment_bytes=store_config.segment_bytes,
            fsync=store_config.fsync,
            commit_interval_ms=store_config.commit_interval_ms,
            snapshot_interval_ms=store_config.snapshot_interval_ms,
            barrier=barrier,
        )
        return store, queues
    if store_config.engine == "postgres":
        try:
            from tarry.store.postgres import PostgresStore
        except ImportError:
            raise InvalidArgument(
                "store.engine = \"postgres\" needs psycopg: pip install 'tarry[postgres]'"
            ) from None
        shared = store_config.consistency == "exactly_once"
        assert store_config.dsn is not None  # TarryConfig checks it
        pg = PostgresStore(
            store_config.dsn,
            pool_size=store_config.pool_size,
            connect_timeout_ms=store_config.connect_timeout_ms,
            notify_horizon_ms=config.dispatch.max_sleep_ms,
            shares_queue_database=shared,
        )
        # The engine's shared-transaction work is written against the sqlite3 calling
        # convention; PgConnection provides it (store/postgres/dialect.py).
        shared_store = cast(DelayedStore, pg)
        if shared:
            return shared_store, None
        queues = SQLiteStore(
            config.db_path,
            synchronous=store_config.synchronous,
            max_pages=store_config.max_pages,
            queues_only=True,
        )
        return shared_store, queues
    return (
        SQLiteStore(
            config.db_path,
            synchronous=store_config.synchronous,
            max_pages=store_config.max_pages,
        ),
        None,
    )
