"""``Worker``: one thread that runs the callables handed to it, in order (the queue database's
writer and its reader each have one).

Lighter than a one-thread ``ThreadPoolExecutor``: a hand-over is one put on a queue, with no
``concurrent.futures.Future``, work item or idle semaphore made and locked on each side. The
queue database is handed a transaction at every release round, receive and ack, and the event
loop pays for what a hand-over builds while it holds the GIL."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

__all__ = ["Worker"]

T = TypeVar("T")

log = logging.getLogger(__name__)


class Worker:
    def __init__(self, name: str) -> None:
        """``name``: the thread's (``tarry-db_0``: ``/metrics`` and the benches read threads by
        these names)."""
        self._name = name
        self._jobs: SimpleQueue[Callable[[], None] | None] = SimpleQueue()
        self._thread: threading.Thread | None = None

    def put(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the thread after the jobs already handed over; it must not raise
        (what it computes it hands back itself)."""
        if self._thread is None:
            # A daemon, as the checkpointer: a process that exits without closing its database
            # is not held up by an idle thread; SQLite rolls back a transaction cut short.
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put(job)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread; its result, or what it raised."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def job() -> None:
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the caller, whatever it is
                loop.call_soon_threadsafe(_fail, future, exc)
            else:
                loop.call_soon_threadsafe(_succeed, future, result)

        self.put(job)
        return await future

    def stop(self) -> None:
        """Let the thread end once the jobs handed over are done, and wait for it."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception:  # a bug: keep the thread, or every later write would hang
                log.exception("queue database job failed")


def _succeed(future: asyncio.Future[T], result: T) -> None:
    if not future.done():  # its caller went away (cancelled)
        future.set_result(result)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
