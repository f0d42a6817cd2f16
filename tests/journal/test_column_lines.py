"""The journal's lines of plain sends kept as columns (``ColumnMessages``) are, byte for byte,
the lines of the same messages as objects, and are written without making the objects."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tarry.journal.lines import encode_lines
from tarry.model.accepted import AcceptedColumns
from tarry.model.events import EventRun
from tarry.model.ids import IdGenerator

NOW = 1_800_000_000_000


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["q", "bench.q01", "é"]),
            st.binary(max_size=30),
            st.integers(NOW + 1, NOW + 10**12),
            st.one_of(st.just(-1), st.integers(NOW, NOW + 10**12)),
        ),
        min_size=1,
        max_size=20,
    ),
    st.sampled_from(["scheduled", "released"]),
)
def test_lines_of_columns_are_the_lines_of_their_messages(
    rows: list[tuple[str, bytes, int, int]], event: str
) -> None:
    due = np.array([r[2] for r in rows], np.int64)
    columns = AcceptedColumns(
        rows=list(range(len(rows))),
        ids=[i.decode() for i in IdGenerator().new_due_many(NOW, due).tolist()],
        destination=[r[0] for r in rows],
        body=[r[1] for r in rows],
        sent_at_ms=NOW,
        deliver_at_ms=due,
        expires_at_ms=np.array([r[3] for r in rows], np.int64),
    )
    lazy = columns.messages()
    got = encode_lines(EventRun(event, lazy, NOW + 5), "node-1")
    assert (lazy._made is None) is (event == "scheduled")  # a released line has its lateness
    want = encode_lines(EventRun(event, list(columns.messages()), NOW + 5), "node-1")
    assert got == want
