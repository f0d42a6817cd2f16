"""The embedded SQLite store: delayed messages and local queues in one database file."""

from tarry.store.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]
