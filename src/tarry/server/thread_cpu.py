"""CPU time of the server process by thread, for ``/metrics``: how a node's work spreads over the
machine's cores (README, "Using more than one core").

One process of tarry runs its event loop (HTTP, release rounds, the journal) on the main thread
and hands the queue database, the log store's writes and a few chores to threads of their own.
Work in those threads runs beside the loop only while it is outside the GIL (SQLite's C code,
``fsync``, file writes); the rate of ``tarry_thread_cpu_seconds_total{thread="MainThread"}``
near 1 says the loop is what limits the node, and that is when a split into processes pays
(README). Linux only: elsewhere nothing is exported.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

__all__ = ["OTHER", "ThreadCPU", "thread_cpu_seconds"]

#: The label of CPU time no live Python thread accounts for: threads that have exited, and
#: threads Python did not start (an allocator's, a library's).
OTHER = "other"


def _ticks(stat_path: Path) -> int | None:
    """utime + stime of a ``/proc/.../stat`` file in clock ticks, or None if it is gone."""
    try:
        raw = stat_path.read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = raw.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def thread_cpu_seconds(proc: Path = Path("/proc/self")) -> dict[str, float]:
    """CPU seconds (user + system) so far of each live Python thread of this process, by
    thread name, plus ``OTHER`` for the rest of the process's. Empty where ``/proc`` is not."""
    if not (proc / "task").is_dir():
        return {}
    by_name: dict[str, int] = {}
    counted = 0
    for thread in threading.enumerate():
        if thread.native_id is None:
            continue
        ticks = _ticks(proc / "task" / str(thread.native_id) / "stat")
        if ticks is None:  # exited since enumerate(): its time is in the total
            continue
        by_name[thread.name] = by_name.get(thread.name, 0) + ticks
        counted += ticks
    # Read last, the total holds at least what the threads were read at.
    total = _ticks(proc / "stat")
    if total is None:
        return {}
    by_name[OTHER] = max(0, total - counted)
    tick = os.sysconf("SC_CLK_TCK")
    return {name: ticks / tick for name, ticks in by_name.items()}


class ThreadCPU(Collector):
    """Exports ``tarry_thread_cpu_seconds_total{thread=...}`` at each scrape."""

    def __init__(self, proc: Path = Path("/proc/self")) -> None:
        self.proc = proc
        #: ``other`` as last exported: a thread read a moment before the total may have run
        #: on into it, which the next scrape shows as ``other`` going back (a counter never
        #: does).
        self._other = 0.0

    def collect(self) -> Iterator[CounterMetricFamily]:
        seconds = thread_cpu_seconds(self.proc)
        if not seconds:
            return
        self._other = seconds[OTHER] = max(self._other, seconds[OTHER])
        family = CounterMetricFamily(
            "tarry_thread_cpu_seconds",
            "CPU time of the server process by thread (MainThread: the event loop; tarry-db: "
            "the queue database; tarry-log: the log store's writes; other: exited threads and "
            "threads Python did not start)",
            labels=["thread"],
        )
        for name, value in sorted(seconds.items()):
            family.add_metric([name], value)
        yield family
