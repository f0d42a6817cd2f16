"""The engine tells a store several nodes share by the ``ClusterStore`` protocol, once: the
PostgreSQL store is one, the embedded stores are not (their nodes share nothing)."""

from tarry.store.base import ClusterStore
from tarry.store.log import LogStore
from tarry.store.memory import MemoryStore
from tarry.store.postgres.store import PostgresStore
from tarry.store.sqlite.store import SQLiteStore


def test_postgres_store_is_a_cluster_store() -> None:
    assert issubclass(PostgresStore, ClusterStore)


def test_embedded_stores_are_not_cluster_stores() -> None:
    for store in (SQLiteStore, LogStore, MemoryStore):
        assert not issubclass(store, ClusterStore), store.__name__
