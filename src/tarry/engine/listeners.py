"""Telling listeners (the journal, the metrics) about state changes: each takes a batch's
events in one call, and a listener that fails never breaks a change or the other listeners.

A queue transaction tells a change of many messages (a release, a receive, an ack) as one
event each; told on as runs (``EventRun``: one change at one time for many messages), every
listener counts or writes a run's shared values once, not once a message."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from itertools import groupby
from operator import itemgetter

from tarry.model.events import Event, EventBatchListener, EventListener, EventRun

__all__ = ["as_runs", "emit_all", "one_by_one"]

log = logging.getLogger("tarry.engine.core")

#: What events of one run share: the event, the time, the queue and the reason.
_SHARED = itemgetter(0, 2, 3, 4)
_MESSAGE = itemgetter(1)


def one_by_one(listener: EventListener) -> EventBatchListener:
    """A listener without a form for many events, given them one at a time (one that fails on
    an event still gets the others)."""

    def many(events: Sequence[Event]) -> None:
        for event in events:
            try:
                listener(*event)
            except Exception:
                log.exception("event listener failed")

    return many


def as_runs(events: Sequence[Event]) -> Iterator[Sequence[Event]]:
    """``events`` as runs, in order: each stretch of events that share their event, time,
    queue and reason as one ``EventRun``."""
    if isinstance(events, EventRun):
        yield events
        return
    if len(events) > 1:
        # A transaction's events are most often one run (a batch released, received or
        # acked): read a column at a time, the run is found without a key tuple an event.
        kinds, messages, times, queues, reasons = zip(*events, strict=True)
        n = len(kinds)
        event, time_ms, queue, reason = kinds[0], times[0], queues[0], reasons[0]
        if (
            kinds.count(event) == n
            and times.count(time_ms) == n
            and queues.count(queue) == n
            and reasons.count(reason) == n
        ):
            yield EventRun(event, messages, time_ms, queue, reason)
            return
    for (event, time_ms, queue, reason), run in groupby(events, _SHARED):
        yield EventRun(event, list(map(_MESSAGE, run)), time_ms, queue, reason)


def emit_all(listeners: Sequence[EventBatchListener], events: Sequence[Event]) -> None:
    """Tell every listener about ``events`` (state changes already made), in order, a run at a
    time (``as_runs``)."""
    if not listeners or not events:
        return
    for run in as_runs(events):
        for many in listeners:
            try:
                many(run)
            except Exception:
                log.exception("event listener failed")
