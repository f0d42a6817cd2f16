"""``DueIndex.pop_due`` against a plain list of (due, position) entries: for any index, any
removed entries and any sequence of rounds (time, limit), each round takes the earliest due
entries up to its limit, in due order, never one not yet due nor one removed, and the count
left matches."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tarry.store.log.index import DueIndex, sort_entries


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


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 60), max_size=12),  # a batch arriving
            st.integers(-5, 70),  # then a round at this time
            st.integers(1, 9),  # taking at most this many
        ),
        min_size=1,
        max_size=25,
    ),
    st.integers(1, 8),
    st.integers(1, 40),
    st.data(),
)
def test_rounds_between_arrivals_take_the_earliest_due_across_runs(
    steps: list[tuple[list[int], int, int]],
    seal_at: int,
    merge_cap: int,
    data: st.DataObject,
) -> None:
    # Given an index that sorts arrivals into runs of its own at a few entries and merges
    # them up to a small cap (so that rounds find many runs), some entries removed
    index = DueIndex(seal_at=seal_at, merge_cap=merge_cap)
    entries: list[tuple[int, int]] = []
    next_pos = 0
    for arriving, now_ms, limit in steps:
        batch = [(due, next_pos + k) for k, due in enumerate(arriving)]
        next_pos += len(batch)
        index.add([d for d, _ in batch], [p for _, p in batch])
        entries = sorted(entries + batch, key=lambda entry: entry[0])
        if entries and data.draw(st.booleans()):
            gone = data.draw(st.sampled_from(entries))
            assert index.discard(*gone)
            entries.remove(gone)
        # When a round takes what is due
        dues_got, positions_got = index.pop_due(now_ms, limit)
        # Then it is the earliest due entries (the earlier arrival first among equal times),
        # up to the limit, in due order, and nothing taken is taken again
        want = [entry for entry in entries if entry[0] <= now_ms][:limit]
        assert list(zip(dues_got, positions_got, strict=True)) == want
        entries = [entry for entry in entries if entry not in want]
        assert len(index) == len(entries)
        # (a removed arrival may still wake a round early: never one too late)
        if entries:
            next_due = index.next_due()
            assert next_due is not None and next_due <= entries[0][0]
        lo, hi = sorted((data.draw(st.integers(-5, 70)), data.draw(st.integers(-5, 70))))
        assert index.count_between(lo, hi) == sum(lo <= due < hi for due, _ in entries)
    # And a snapshot holds what is left: captured run after run, stored in due order
    captured = index.entries()
    assert sorted(zip(*(a.tolist() for a in captured), strict=True)) == sorted(entries)
    due, pos = sort_entries(*captured)
    assert list(zip(due.tolist(), pos.tolist(), strict=True)) == entries
    due, pos = index.arrays()
    assert list(zip(due.tolist(), pos.tolist(), strict=True)) == entries
