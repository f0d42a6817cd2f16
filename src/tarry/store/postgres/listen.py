"""LISTEN/NOTIFY between nodes sharing one database.

Channels (payloads are short text):

- ``tarry_due``: a message due at ``<ms>`` was stored; a dispatcher sleeping past it wakes.
  Sent only for messages due within the dispatcher's longest sleep (the MSMQ poller's rule:
  later ones are found by the capped sleep anyway).
- ``tarry_catalog``: queues, topics, subscriptions or policies changed; every node reloads.
- ``tarry_filled``: ``<queue>`` received ready messages; consumers waiting on any node look now.

Every NOTIFY is sent once the change committed (catalog changes: by a trigger, in the same
transaction; the others: by the engine, right after the commit, coalesced). The listener
reconnects by itself when PostgreSQL goes away; while it is away nodes
fall back to their timed looks (the dispatcher's capped sleep, the consumers' one-second look).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import psycopg

__all__ = ["CHANNEL_CATALOG", "CHANNEL_DUE", "CHANNEL_FILLED", "Listener"]

log = logging.getLogger(__name__)

CHANNEL_DUE = "tarry_due"
CHANNEL_CATALOG = "tarry_catalog"
CHANNEL_FILLED = "tarry_filled"

Handler = Callable[[str], None]


class Listener:
    def __init__(self, dsn: str, *, retry_s: float = 0.5) -> None:
        self._dsn = dsn
        self._retry_s = retry_s
        self._handlers: dict[str, list[Handler]] = {}
        self._task: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        #: Set while LISTEN is in force (tests wait on it).
        self.listening = asyncio.Event()
        #: Called each time LISTEN comes into force, the first time too: changes committed
        #: before it (while a starting node read its catalog, or while away) sent their
        #: NOTIFY to no one here.
        self.on_listening: list[Callable[[], None]] = []

    def subscribe(self, channel: str, handler: Handler) -> None:
        self._handlers.setdefault(channel, []).append(handler)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def _run(self) -> None:
        while True:
            try:
                self._conn = await psycopg.AsyncConnection.connect(
                    self._dsn, autocommit=True, connect_timeout=3
                )
                for channel in self._handlers:
                    await self._conn.execute(f"LISTEN {channel}")
                self.listening.set()
                for callback in self.on_listening:
                    callback()
                async for note in self._conn.notifies():
                    for handler in self._handlers.get(note.channel, ()):
                        try:
                            handler(note.payload)
                        except Exception:  # a handler bug must not stop the wake-ups
                            log.exception("notification handler failed")
            except asyncio.CancelledError:
                raise
            except psycopg.Error as exc:
                log.warning("LISTEN connection lost (%s); reconnecting", exc)
            finally:
                self.listening.clear()
                if self._conn is not None:
                    await self._conn.close()
                    self._conn = None
            await asyncio.sleep(self._retry_s)
