"""Events told to listeners as runs (``tarry.engine.listeners``): the same events in the same
order, a stretch of one change at one time given as one ``EventRun``."""

from __future__ import annotations

from collections.abc import Sequence

from tarry.engine.listeners import emit_all, one_by_one
from tarry.model.events import Event, EventRun
from tarry.model.message import Message, plain_message


def _message(i: int) -> Message:
    return plain_message(f"m{i}", "q", b"x", 1, 2, None)


def test_a_transactions_events_reach_batch_listeners_as_runs_in_order() -> None:
    a, b, c, d = (_message(i) for i in range(4))
    events: list[Event] = [
        ("received", a, 10, "q", None),
        ("received", b, 10, "q", None),
        ("dead_lettered", c, 10, "q", "maxlen"),
        ("received", d, 10, "q", None),
        ("received", a, 11, "q", None),
    ]
    got: list[Sequence[Event]] = []
    one: list[Event] = []
    emit_all([got.append, one_by_one(lambda *event: one.append(event))], events)
    assert all(isinstance(run, EventRun) for run in got)
    assert [(r.event, r.time_ms, r.reason, len(r)) for r in got] == [  # type: ignore[attr-defined]
        ("received", 10, None, 2),
        ("dead_lettered", 10, "maxlen", 1),
        ("received", 10, None, 1),
        ("received", 11, None, 1),
    ]
    assert [event for run in got for event in run] == events
    assert one == events
    # A run already is one: told as it is.
    run = EventRun("acked", [a, b], 12, "q")
    got.clear()
    emit_all([got.append], run)
    assert got == [run]


def test_a_listener_that_fails_on_a_run_still_gets_the_others_and_so_do_the_rest() -> None:
    events: list[Event] = [("received", _message(0), 10, "q", None)]
    events.append(("acked", _message(1), 10, "q", None))
    told: list[str] = []
    after: list[str] = []

    def fails_on_received(run: Sequence[Event]) -> None:
        if run[0][0] == "received":
            raise RuntimeError("boom")
        told.append(run[0][0])

    emit_all([fails_on_received, lambda run: after.append(run[0][0])], events)
    assert told == ["acked"]
    assert after == ["received", "acked"]
