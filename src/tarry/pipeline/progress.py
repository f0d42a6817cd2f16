"""Progress of a running Spark job on the terminal: the current phase and its tasks done, read
from Spark's status tracker by a background thread (the job itself is not slowed down)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SparkProgress"]


class SparkProgress:
    """``with progress.phase("validating"): ...`` shows a bar of that phase's Spark tasks."""

    def __init__(self, spark: SparkSession, *, enabled: bool, console: Console | None = None):
        from tarry.pipeline.session import is_connect

        # Over Spark Connect there is no status tracker on this side: phases without counts.
        self._tracker = None if is_connect(spark) else spark.sparkContext.statusTracker()
        self._enabled = enabled
        #: Seconds spent in each phase, in order (for the summary).
        self.seconds: dict[str, float] = {}
        self._progress = Progress(
            TextColumn("{task.description:<12}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} tasks"),
            TimeElapsedColumn(),
            console=console or Console(stderr=True),
            transient=False,
        )

    def _tasks(self) -> tuple[int, int]:
        done = total = 0
        if self._tracker is None:
            return done, total
        for stage_id in self._tracker.getActiveStageIds():
            info = self._tracker.getStageInfo(stage_id)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        return done, total

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            with self._show(name):
                yield
        finally:
            self.seconds[name] = round(
                self.seconds.get(name, 0.0) + time.perf_counter() - started, 3
            )

    @contextmanager
    def _show(self, name: str) -> Iterator[None]:
        if not self._enabled:
            yield
            return
        stop = threading.Event()
        with self._progress:
            task: TaskID = self._progress.add_task(name, total=None)

            def watch() -> None:
                while not stop.wait(0.25):
                    done, total = self._tasks()
                    if total:
                        self._progress.update(task, completed=done, total=total)

            thread = threading.Thread(target=watch, daemon=True)
            thread.start()
            try:
                yield
            finally:
                stop.set()
                thread.join()
                total = self._progress.tasks[-1].total or 1
                self._progress.update(task, completed=total, total=total)
