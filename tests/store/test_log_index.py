"""``DueIndex.pop_due`` against a plain list of (due, position) entries: for any index, any
removed entries and any sequence of rounds (time, limit), each round takes the earliest due
entries up to its limit, in due order, never one not yet due nor one removed, and the count
left matches."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tarry.store.log.index import DueIndex


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 40), max_size=60),
    st.data(),
    st.lists(st.tuples(st.integers(-5, 50), st.integers(1, 9)), min_size=1, max_size=20),
    st.lists(st.integers(0, 40), max_size=20),
)
def test_pop_due_takes_the_earliest_due_live_entries_up_to_the_limit(
    dues: list[int],
    data: st.DataObject,
    rounds: list[tuple[int, int]],
    arriving: list[int],
) -> None:
    # Given an index of sorted due times at shuffled positions, some of them removed, and
    # later arrivals not merged yet
    dues = sorted(dues)
    positions = data.draw(st.permutations(range(len(dues))))
    index = DueIndex(np.array(dues, np.int64), np.array(positions, np.int64))
    entries = list(zip(dues, positions, strict=True))
    for due, pos in data.draw(st.lists(st.sampled_from(entries), unique=True)) if entries else []:
        assert index.discard(due, pos)
        entries.remove((due, pos))
    late = [(due, 1000 + k) for k, due in enumerate(arriving)]
    if late:
        index.add([d for d, _ in late], [p for _, p in late])
        entries = sorted(entries + late, key=lambda entry: entry[0])
    for now_ms, limit in rounds:
        # When a round takes what is due
        dues_got, positions_got = index.pop_due(now_ms, limit)
        # Then it is the earliest due entries, up to the limit, in due order
        want = [entry for entry in entries if entry[0] <= now_ms][:limit]
        got = list(zip(dues_got, positions_got, strict=True))
        assert sorted(got) == sorted(want)
        assert dues_got == sorted(dues_got)
        entries = [entry for entry in entries if entry not in want]
        assert len(index) == len(entries)
