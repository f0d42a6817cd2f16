"""After downtime, a partition that fell due while the server was down (never indexed) is indexed
in the background when it is large, and the dispatcher's rounds release every message of it
once, in due order, none early: the engine on the log store, restarted, its clock moved past."""

from __future__ import annotations

from pathlib import Path

import pytest

from tarry.store.log import reading

pytestmark = pytest.mark.parametrize("engine_store", ["log"])

MINUTE = 60_000


async def test_a_large_partition_that_fell_due_during_downtime_is_released_once_in_order(
    make_engine, clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 3,000 messages due in ten minutes (a partition not indexed yet, since it is
    # beyond prefetch_ms), more than a round indexes itself
    monkeypatch.setattr(reading, "SYNC_RECORDS", 1_000)
    engine = await make_engine()
    await engine.declare_queue("q", {})
    for first in range(0, 3_000, 500):
        await engine.send_batch(
            [
                {"destination": "q", "body": str(k), "delay_ms": 10 * MINUTE + (k * 7919) % MINUTE}
                for k in range(first, first + 500)
            ]
        )
    # When the server is down past their due times and starts again
    await engine.stop()
    clock.advance(20 * MINUTE)
    engine = await make_engine(data_dir=tmp_path / "data")
    store = engine.store
    [partition] = [p for p in store.partitions.values() if p.live]
    assert partition.index is None
    # Then the first round leaves it to a build in the background (nothing released yet)
    assert not await engine.dispatcher.run_once()
    assert partition.number in store.table.building
    # And the next due time waits for that build, after which rounds release everything
    assert await store.next_due_time() is not None
    assert partition.index is not None
    await engine.dispatcher.release_all_due()
    got = []
    while received := await engine.receive("q", max_messages=1000):
        await engine.ack("q", [d.receipt for d in received])
        got += [d.message for d in received]
    assert sorted(int(m.body) for m in got) == list(range(3_000))
    assert [m.deliver_at_ms for m in got] == sorted(m.deliver_at_ms for m in got)
    assert all(m.deliver_at_ms <= clock.now_ms() for m in got)
