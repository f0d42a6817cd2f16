"""A run's lines (``EventRun``: one change at one time for many messages, written as text a
line at a time) are, byte for byte, the lines of the same events one by one (the general
``%`` template of each), whatever the messages hold."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tarry.journal.lines import encode_lines
from tarry.model.events import EventRun
from tarry.model.message import Message

_NAMES = st.sampled_from(["q", "q.%d", "100%s", "é.q", "q\u2028", 'q"\\', "q\ud800"])
_TEXT = st.one_of(st.none(), _NAMES, st.text(max_size=8))
#: Times that repeat from one message to the next (a batch's send time, a due millisecond).
_TIME = st.one_of(st.sampled_from([0, 7, 1_800_000_000_000]), st.integers(0, 2**53))
#: Tarry's ids (letters and digits), and ids whose JSON needs escapes or is not text at all.
_IDS = st.one_of(
    st.text("0123456789ABCDEFGHJKMNPQRSTVWXYZ", min_size=26, max_size=26),
    st.text(max_size=8),
    st.integers(),
)


@st.composite
def _messages(draw: st.DrawFn) -> Message:
    # Most plain (as a released, received or acked batch holds them), the rest with any
    # optional field set, or a time that is not an ``int``.
    plain = draw(st.booleans())
    due = draw(st.one_of(_TIME, _TIME.map(np.int64), st.just(True)) if not plain else _TIME)
    return Message(
        id=draw(_IDS),
        destination=draw(st.sampled_from(["q", "q"]) if plain else _NAMES),
        body=draw(st.sampled_from([b"", b"x" * 100]) if plain else st.binary(max_size=20)),
        headers=draw(st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)),
        sent_at_ms=draw(_TIME),
        deliver_at_ms=due,
        expires_at_ms=None if plain else draw(st.one_of(st.none(), _TIME)),
        message_id=None if plain else draw(_TEXT),
        correlation_id=None if plain else draw(_TEXT),
        topic=None if plain else draw(_TEXT),
        failures=0 if plain else draw(st.integers(0, 3)),
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_messages(), min_size=1, max_size=12),
    st.sampled_from(["released", "received", "acked", "expired", "dead_lettered"]),
    st.one_of(_TIME, st.just(False)),
    st.one_of(st.none(), _NAMES),
    st.one_of(st.none(), _NAMES),
    st.sampled_from(["node-1", "nœud-%s-%%"]),
)
def test_a_runs_lines_are_its_events_lines_one_by_one(
    messages: list[Message],
    event: str,
    time_ms: int,
    queue: str | None,
    reason: str | None,
    node: str,
) -> None:
    # Given a run of messages whose names, ids and times take every path
    run = EventRun(event, messages, time_ms, queue, reason)
    # When it is encoded as a run and as separate events
    # Then the lines, their count and the dropped count are the same
    assert encode_lines(run, node) == encode_lines(list(run), node)


def test_a_run_of_tarry_ids_writes_each_id_in_quotes() -> None:
    # Given a plain run whose ids are letters and digits, and one with an id needing escapes
    ids = ["01ABCDEFGHJKMNPQRSTVWXYZ00", "01ABCDEFGHJKMNPQRSTVWXYZ01"]
    plain = [Message(i, "q", b"x", {}, 1, 2, None) for i in ids]
    odd = [*plain, Message('a"b', "q", b"x", {}, 1, 2, None)]
    for messages in (plain, odd):
        # When each is encoded as a run
        data, lines, dropped = encode_lines(EventRun("received", messages, 7, "q"), "n")
        # Then each id is its JSON, the run's lateness after it
        assert data == encode_lines(list(EventRun("received", messages, 7, "q")), "n")[0]
        assert (lines, dropped) == (len(messages), 0)
        assert data.count(b'"lateness_ms":5}\n') == len(messages)
    assert b'"id":"a\\"b"' in data
