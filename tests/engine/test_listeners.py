"""Events told to listeners as runs (``tarry.engine.listeners``): the same events in the same
order, a stretch of one change at one time given as one ``EventRun``."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

from hypothesis import given, settings
from hypothesis import strategies as st

from tarry.engine.listeners import as_runs, emit_all, one_by_one
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


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["released", "received", "acked"]),
            st.integers(0, 3),
            st.sampled_from([10, 11]),
            st.sampled_from(["q", "r", None]),
            st.sampled_from([None, "maxlen"]),
        ),
        max_size=12,
    ),
    st.booleans(),
)
def test_runs_are_the_stretches_of_events_sharing_event_time_queue_and_reason(
    picks: list[tuple[str, int, int, str | None, str | None]], one_run: bool
) -> None:
    # Given a transaction's events, some all of one run (the common batch), some mixed
    messages = [_message(i) for i in range(4)]
    events: list[Event] = [
        (picks[0][0], messages[m], picks[0][2], picks[0][3], picks[0][4])
        if one_run
        else (event, messages[m], time_ms, queue, reason)
        for event, m, time_ms, queue, reason in picks
    ]
    # When they are told as runs
    runs = list(as_runs(events))
    # Then each run is a longest stretch of events sharing all but the message, in order
    want = [
        (key, [event[1] for event in stretch])
        for key, stretch in groupby(events, lambda e: (e[0], e[2], e[3], e[4]))
    ]
    assert [((r.event, r.time_ms, r.queue, r.reason), list(r.messages)) for r in runs] == want  # type: ignore[attr-defined]
    assert [event for run in runs for event in run] == events
