"""The PostgreSQL store: several tarry nodes share one database (delayed messages, local
queues, their declarations and policies). Needs the ``postgres`` extra (psycopg 3)."""

from tarry.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
