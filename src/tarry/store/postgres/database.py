"""Connections to PostgreSQL: an async pool for the store's own statements, a small sync pool
on worker threads for the engine's shared-transaction work, and the one place where psycopg's
errors become tarry's.

Why two pools: the queue rules (``queues/txn.py``) are synchronous code shared with the embedded
store; to run them in the same transaction as fetch and remove they need a synchronous
connection, which runs on a worker thread so the event loop never blocks. Everything else (the
``DelayedStore`` methods, LISTEN) is async psycopg.

Losing PostgreSQL makes every call raise ``Unavailable`` (which the store and fetch breakers
count); the pools reconnect by themselves when it comes back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from tarry.errors import TarryError, Unavailable
from tarry.store.postgres.dialect import PgConnection
from tarry.store.postgres.schema import migrate

__all__ = ["PgDatabase", "redact_dsn"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Conflicts PostgreSQL resolves by aborting one side; the work is simply run again.
_RETRYABLE = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected)


def redact_dsn(dsn: str) -> str:
    """The DSN without its password, for logs and errors."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparsable dsn>"
    if "password" in info:
        info["password"] = "***"
    return psycopg.conninfo.make_conninfo(**{k: str(v) for k, v in info.items()})


class PgDatabase:
    def __init__(
        self,
        dsn: str,
        *,
        pool_size: int = 4,
        connect_timeout_ms: int = 3_000,
        application_name: str = "tarry",
    ) -> None:
        self.dsn = dsn
        self._application_name = application_name
        self._pool_size = pool_size
        self._timeout_s = connect_timeout_ms / 1000
        self._executor = ThreadPoolExecutor(max_workers=pool_size, thread_name_prefix="tarry-pg")
        self._sync: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._async: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self.commits = 0

    async def open(self) -> None:
        """Connect, and create or migrate the schema. Raises ``Unavailable``."""
        loop = asyncio.get_running_loop()
        kwargs: dict[str, Any] = {
            "connect_timeout": max(1, int(self._timeout_s)),
            # Names this node's changes in notifications (and in pg_stat_activity).
            "application_name": self._application_name,
        }
        try:
            await loop.run_in_executor(self._executor, self._migrate, kwargs)
        except psycopg.Error as exc:
            raise self._unavailable(exc, "cannot open the PostgreSQL store") from exc
        # The same limits for both pools: the sync one serves the shared queue transactions on
        # worker threads, the async one the store's own statements.
        pool: dict[str, Any] = {
            "min_size": 1,
            "max_size": self._pool_size,
            "kwargs": kwargs,
            "open": False,
            "timeout": self._timeout_s,
        }
        self._sync = ConnectionPool(self.dsn, name="tarry-sync", **pool)
        self._async = AsyncConnectionPool(self.dsn, name="tarry-async", **pool)
        await loop.run_in_executor(self._executor, self._sync.open)
        await self._async.open()

    def _migrate(self, kwargs: dict[str, Any]) -> None:
        with psycopg.connect(self.dsn, **kwargs) as conn:
            found = migrate(conn)
            if found:
                log.info("PostgreSQL schema at version %d", found)

    async def close(self) -> None:
        if self._async is not None:
            await self._async.close()
            self._async = None
        if self._sync is not None:
            pool, self._sync = self._sync, None
            await asyncio.get_running_loop().run_in_executor(self._executor, pool.close)
        self._executor.shutdown(wait=True)

    # --- synchronous work on a worker thread (the engine's shared transactions) ---------------
    async def run(self, work: Callable[[PgConnection], T]) -> T:
        """Run ``work`` in one transaction on a worker thread; commit when it returns, roll back
        when it raises. A serialization conflict with another node runs it again."""
        loop = asyncio.get_running_loop()
        for attempt in range(5):
            try:
                result = await loop.run_in_executor(self._executor, self._run, work)
                self.commits += 1
                return result
            except _RETRYABLE:
                await asyncio.sleep(0.005 * (attempt + 1))
            except (psycopg.Error, PoolTimeout) as exc:
                raise self._unavailable(exc) from exc
        raise Unavailable("the store kept conflicting with other nodes; retry later")

    def _run(self, work: Callable[[PgConnection], T]) -> T:
        pool = self._require(self._sync)
        for attempt in range(self._pool_size + 1):
            conn = pool.getconn()
            try:
                begun = conn.transaction()
                try:
                    begun.__enter__()
                except psycopg.OperationalError:
                    # A connection the server dropped while it sat idle (a restart): nothing
                    # ran on it, so take the next one (the pool discards the broken one).
                    if attempt == self._pool_size:
                        raise
                    continue
                try:
                    result = work(PgConnection(conn))
                except BaseException as exc:
                    begun.__exit__(type(exc), exc, exc.__traceback__)
                    raise
                begun.__exit__(None, None, None)
                return result
            finally:
                pool.putconn(conn)
        raise AssertionError("unreachable")

    # --- async statements ----------------------------------------------------------------------
    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """An async connection inside a transaction; psycopg errors become ``Unavailable``."""
        pool = self._require(self._async)
        try:
            for attempt in range(self._pool_size + 1):
                conn = await pool.getconn()
                try:
                    begun = conn.transaction()
                    try:
                        await begun.__aenter__()
                    except psycopg.OperationalError:
                        if attempt == self._pool_size:  # as in _run: a dropped idle connection
                            raise
                        continue
                    try:
                        yield conn
                    except BaseException as exc:
                        await begun.__aexit__(type(exc), exc, exc.__traceback__)
                        raise
                    await begun.__aexit__(None, None, None)
                    self.commits += 1
                    return
                finally:
                    await pool.putconn(conn)
        except TarryError:
            raise
        except (psycopg.Error, PoolTimeout) as exc:
            raise self._unavailable(exc) from exc

    def _require(self, pool: T | None) -> T:
        if pool is None:
            raise Unavailable("the store is not open; wait for the server to finish starting")
        return pool

    def _unavailable(
        self,
        exc: BaseException,
        what: str = "the PostgreSQL store cannot do this now",
    ) -> Unavailable:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Unavailable(f"{what} ({detail}; {redact_dsn(self.dsn)}); retry later")
