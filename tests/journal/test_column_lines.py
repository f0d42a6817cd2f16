"""The journal's lines of plain sends kept as columns (``ColumnMessages``) are, byte for byte,
the lines of the same messages as objects, and are written without making the objects."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tarry.journal.lines import encode_lines
from tarry.model.events import EventRun
from tests.plain_columns import Row, columns_of, plain_rows

NOW = 1_800_000_000_000


@settings(max_examples=100, deadline=None)
@given(plain_rows(NOW), st.sampled_from(["scheduled", "released"]))
def test_lines_of_columns_are_the_lines_of_their_messages(rows: list[Row], event: str) -> None:
    columns = columns_of(rows, NOW)
    lazy = columns.messages()
    got = encode_lines(EventRun(event, lazy, NOW + 5), "node-1")
    assert (lazy._made is None) is (event == "scheduled")  # a released line has its lateness
    want = encode_lines(EventRun(event, list(columns.messages()), NOW + 5), "node-1")
    assert got == want


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.binary(max_size=300), st.integers(NOW + 1, NOW + 10**12)),
        min_size=1,
        max_size=50,
    ),
    st.sampled_from(["q", "é.q", "100%d.q"]),
    st.sampled_from(["node-1", "nœud-%s-%%"]),
)
def test_lines_of_columns_all_to_one_queue_and_never_expiring_are_their_messages_lines(
    sends: list[tuple[bytes, int]], destination: str, node: str
) -> None:
    # Given plain sends all to one destination, none expiring (the common batch), with names
    # JSON or a template could mistake
    columns = columns_of([(destination, body, due, -1) for body, due in sends], NOW)
    # When their scheduled lines are written from the columns and from their messages
    lazy = columns.messages()
    got = encode_lines(EventRun("scheduled", lazy, NOW + 5), node)
    made = lazy._made
    want = encode_lines(EventRun("scheduled", list(lazy), NOW + 5), node)
    # Then they are the same bytes, and no message was made for the first
    assert made is None
    assert got == want and got[1] == len(sends)


@settings(max_examples=100, deadline=None)
@given(plain_rows(NOW), st.data())
def test_lines_of_columns_with_message_ids_are_the_lines_of_their_messages(
    rows: list[Row], data: st.DataObject
) -> None:
    # Given plain sends as columns, some with a message_id (an idempotent producer's), some
    # with a correlation id
    ids = st.one_of(st.none(), st.text(min_size=1, max_size=6))
    message_ids, correlation_ids = (
        data.draw(st.lists(ids, min_size=len(rows), max_size=len(rows))) for _ in range(2)
    )
    columns = columns_of(rows, NOW, message_ids, correlation_ids)
    # When their scheduled lines are written from the columns and from their messages
    got = encode_lines(EventRun("scheduled", columns.messages(), NOW + 5), "node-1")
    want = encode_lines(EventRun("scheduled", list(columns.messages()), NOW + 5), "node-1")
    # Then they are the same bytes: each line tells its producer's ids
    assert got == want
