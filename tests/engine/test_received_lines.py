"""A receive's and an ack's events are kept as the rows the queue database read
(``RowMessages``): the journal writes their lines, and the metrics read their lateness, from
those rows when every message is plain, and from the messages otherwise; either way the
same bytes and figures as from the messages themselves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tarry.journal.lines import encode_lines
from tarry.model.events import Event, EventRun
from tarry.queues.row_messages import RowMessages


def _plain(i: int) -> dict[str, Any]:
    return {"destination": "q", "body": "x" * i, "delay_ms": 0}


#: A field of a message that is not plain, by name; the rows write the lines of messages
#: with producer ids (an idempotent producer's message_id, a correlation id) as of plain ones.
_ODD: dict[str, dict[str, Any]] = {
    "message_id": {"message_id": 'm-5\u00e9"%s'},
    "correlation_id": {"correlation_id": "c5\u00e9"},
    "ttl_ms": {"ttl_ms": 600_000},
}


@pytest.mark.parametrize("odd", [None, *_ODD])
async def test_received_and_acked_lines_from_rows_are_those_of_the_messages(
    make_engine: Any, odd: str | None
) -> None:
    # Given a queue of plain messages, one of them with another field when ``odd``, and one
    # more with a message_id of its own
    engine = await make_engine()
    await engine.declare_queue("q", {})
    items = [_plain(i) for i in range(12)]
    if odd:
        items[5] = {**items[5], **_ODD[odd]}
        items[8] = {**items[8], "message_id": "m-8"}
    # (run, its lines, its lateness, whether its lines could be written from its rows)
    runs: list[tuple[EventRun, bytes, list[int], bool]] = []

    def many(batch: Sequence[Event]) -> None:
        if isinstance(batch, EventRun) and isinstance(batch.messages, RowMessages):
            # Lines and lateness first: reading the events makes the messages.
            lines = encode_lines(batch, "node")[0]
            late = batch.late_ms()
            runs.append((batch, lines, late, batch.messages.plain_lines() is not None))

    engine.add_listener(lambda *event: None, many=many)
    await engine.send_batch(items)
    while await engine.dispatcher.run_once():
        pass
    # When a consumer receives them all and acks them
    deliveries = await engine.receive("q", max_messages=100)
    assert len(deliveries) == 12
    await engine.ack("q", [d.receipt for d in deliveries])
    # Then a received run and an acked run were told as rows
    assert [run.event for run, *_ in runs] == ["received", "acked"]
    for run, lines, late, from_rows in runs:
        # written from the rows alone when every message was plain or had producer ids
        assert from_rows is (odd in (None, "message_id", "correlation_id"))
        # and the same lines and lateness as the messages give
        made = EventRun(run.event, list(run.messages), run.time_ms, run.queue, run.reason)
        assert lines == encode_lines(made, "node")[0]
        assert lines.count(b"\n") == 12
        assert late == made.late_ms()
