"""A batch's bookkeeping in ``PartitionTable`` done in passes over the batch (``take_many``,
``finished``, ``defer``, ``counted``) leaves the table as one message at a time would: for any
mix of claimed, waiting and unknown ids, ``take_many`` takes what ``take`` takes, in order, and
``finished`` counts each partition and destination once per message."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tarry.store.log.held import Failure, Held
from tarry.store.log.layout import Layout
from tarry.store.log.table import PartitionTable, counted

_WHERE = st.sampled_from(["claimed", "claimed", "waiting", "unknown"])


def _table(tmp: Path) -> PartitionTable:
    return PartitionTable(tmp, Layout(60_000), prefetch_ms=0, flush=lambda _: None)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_WHERE, st.sampled_from(["a", "b"]), st.integers(0, 2)), max_size=12))
def test_take_many_and_finished_are_take_and_finish_one_at_a_time(
    batch: list[tuple[str, str, int]],
) -> None:
    # Given two tables holding the same messages, claimed, waiting, or not held at all
    tables = [_table(Path("/nonexistent")) for _ in range(2)]
    ids = [f"{k:026d}" for k in range(len(batch))]
    for table in tables:
        for number in range(3):
            table.partition(number)
        for message_id, (where, destination, number) in zip(ids, batch, strict=True):
            held = Held(number, len(message_id), 5, destination)
            table.state.scheduled[destination] += 1
            if where == "claimed":
                table.claims[message_id] = held
            elif where == "waiting":
                table.wait(message_id, held, 5)
        table.state.failures[ids[0] if ids else "x"] = Failure(1, "refused", 5)
    one_at_a_time, batched = tables
    # When one takes and finishes them one by one and the other as a batch
    alone = [(i, h) for i in ids if (h := one_at_a_time.take(i)) is not None]
    for pair in alone:
        one_at_a_time.leaving[pair[0]] = pair[1]
        one_at_a_time.finished([pair])
    together = batched.take_many(ids)
    batched.leaving.update(together)
    batched.finished(together)
    # Then both took the same messages and were left the same
    assert together == alone
    a, b = one_at_a_time, batched
    assert (a.claims, a.waiting, a.leaving) == (b.claims, b.waiting, b.leaving)
    assert a.state.failures == b.state.failures
    assert a.state.scheduled == b.state.scheduled
    assert [p.finished for p in a.partitions.values()] == [
        p.finished for p in b.partitions.values()
    ]
    assert a.changes == b.changes == len(alone)


@given(st.lists(st.sampled_from(["q", "r", ""]), max_size=20))
def test_counted_is_a_counter(values: list[str]) -> None:
    assert counted(values) == dict(Counter(values))
