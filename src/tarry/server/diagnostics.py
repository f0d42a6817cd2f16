"""``kill -USR1 <pid>``: the server logs where every thread and every asyncio task is waiting,
without stopping. What an operator (or a failing test) reads when a node seems stuck."""

from __future__ import annotations

import asyncio
import io
import logging
import signal
import sys
import traceback

__all__ = ["install_stack_dump"]

log = logging.getLogger(__name__)


def _dump() -> None:
    out = io.StringIO()
    for thread_id, frame in sys._current_frames().items():
        out.write(f"--- thread {thread_id}\n")
        traceback.print_stack(frame, file=out)
    for task in asyncio.all_tasks():
        out.write(f"--- task {task.get_name()} ({task.get_coro()!r})\n")
        task.print_stack(limit=12, file=out)
    log.warning("stack dump on SIGUSR1:\n%s", out.getvalue())


def install_stack_dump() -> None:
    """Call from the running event loop; a no-op where signals cannot be hooked (Windows)."""
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _dump)
    except (NotImplementedError, RuntimeError, AttributeError):
        pass
