"""Telling listeners (the journal, the metrics) about state changes: each takes a batch's
events in one call, and a listener that fails never breaks a change or the other listeners."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tarry.model.events import Event, EventBatchListener, EventListener

__all__ = ["emit_all", "one_by_one"]

log = logging.getLogger("tarry.engine.core")


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


def emit_all(listeners: Sequence[EventBatchListener], events: Sequence[Event]) -> None:
    """Tell every listener about ``events`` (state changes already made), each listener
    taking them all in one call, in order."""
    for many in listeners:
        try:
            many(events)
        except Exception:
            log.exception("event listener failed")
