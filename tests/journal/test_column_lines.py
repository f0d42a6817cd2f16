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
