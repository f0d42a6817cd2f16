"""Plain sends accepted as columns (``tarry.model.accepted``), for the tests of the forms made
from them: a strategy for their rows and the columns of such rows."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from tarry.model.accepted import AcceptedColumns
from tarry.model.ids import IdGenerator

#: (destination, body, due at, expires at or -1) of one plain send made at ``now``.
Row = tuple[str, bytes, int, int]


def plain_rows(now: int, *, max_size: int = 20) -> st.SearchStrategy[list[Row]]:
    return st.lists(
        st.tuples(
            st.sampled_from(["q", "bench.q01", "é.q"]),
            st.binary(max_size=300),
            st.integers(now + 1, now + 10**12),
            st.one_of(st.just(-1), st.integers(now, now + 10**12)),
        ),
        min_size=1,
        max_size=max_size,
    )


def columns_of(
    rows: list[Row],
    now: int,
    message_ids: list[str | None] | None = None,
    correlation_ids: list[str | None] | None = None,
) -> AcceptedColumns:
    due = np.array([r[2] for r in rows], np.int64)
    return AcceptedColumns(
        rows=list(range(len(rows))),
        ids=IdGenerator().new_due_many(now, due).astype("U26").tolist(),
        destination=[r[0] for r in rows],
        body=[r[1] for r in rows],
        sent_at_ms=now,
        deliver_at_ms=due,
        expires_at_ms=np.array([r[3] for r in rows], np.int64),
        message_id=message_ids,
        correlation_id=correlation_ids,
    )
