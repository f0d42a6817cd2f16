"""A release of plain due messages read as columns (``DueColumns``, ``QueueTxn.enqueue_columns``)
writes the same queue rows, remembers the same rows and tells the same events and journal lines
as the release of the same messages as objects (``enqueue_many``), plain, keyed (a
``message_id``) and neither alike, also when some were released before a crash that came ahead
of the store's marker."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tarry.journal.lines import encode_lines
from tarry.model.due import DueColumns, ReadyColumns
from tarry.model.events import Event, EventRun
from tarry.model.message import Message
from tarry.queues.txn import QueueTxn
from tarry.store.sqlite.rows import SELECT_SQL


@pytest.fixture
def engine_store() -> str:
    return "log"  # the store that reads due messages as columns


NOW = 1_700_000_000_000


def _messages(*, expiring: bool = True) -> list[Message]:
    """Due messages to two queues (one with a TTL), some plain, some sent with a
    ``message_id`` (an idempotent producer's) or a ``correlation_id`` (read as columns too),
    some with headers; with ``expiring`` every fourth expires."""
    out = []
    for i in range(40):
        message = Message(
            id=f"{i:026d}",
            destination="q" if i % 3 else "ttl",
            body=f"m{i}".encode(),
            headers={"k": "v"} if i in (7, 20) else {},
            message_id=f"order-{i}" if i % 5 == 2 else None,
            correlation_id=f"saga-{i % 7}" if i % 3 == 1 else None,
            sent_at_ms=NOW - 5000,
            deliver_at_ms=NOW - 1000 + i,
            expires_at_ms=NOW + 60_000 if expiring and i % 4 == 0 else None,
            updated_at_ms=NOW - 5000,
        )
        out.append(message)
    return out


async def _released(
    make_engine: Any, tmp_path: Path, name: str, messages: list[Message], *, before: int
) -> tuple[list[Event], bytes, list[Any], dict[int, Any], list[Sequence[Message]]]:
    """Release ``messages`` (the first ``before`` released already, their markers lost) through
    an engine of its own: (events, journal lines, queue rows, remembered rows, fetched)."""
    engine = await make_engine(data_dir=tmp_path / name)
    await engine.declare_queue("q", {})
    await engine.declare_queue("ttl", {"message_ttl_ms": 30_000})
    events: list[Event] = []
    lines: list[bytes] = []

    def many(batch: Sequence[Event]) -> None:
        # The lines first: reading the events makes a release's messages.
        lines.append(encode_lines(batch, "node")[0])
        events.extend(batch)

    engine.add_listener(lambda *event: None, many=many)
    fetched: list[Sequence[Message]] = []
    fetch_due = engine.store.fetch_due

    async def spied(*args: Any, **kwargs: Any) -> Sequence[Message]:
        got = await fetch_due(*args, **kwargs)
        fetched.append(got)
        return got

    engine.store.fetch_due = spied
    await engine.store.store([_copy(m) for m in messages])
    if before:
        # Released before a crash that came ahead of the store's marker: in the queue database.
        def release(conn: Any) -> None:
            txn = engine.ctx.txn(conn, engine.clock.now_ms())
            for message in messages[:before]:
                txn.enqueue_many([_copy(message)], message.destination)
            txn.flush()

        await engine.qdb.write(release)
    while await engine.dispatcher.run_once():
        pass
    rows = await engine.qdb.read(lambda conn: conn.execute(f"{SELECT_SQL} ORDER BY seq").fetchall())
    memory = await engine.qdb.read(
        lambda conn: {} if conn.released is None else dict(conn.released._rows)
    )
    return events, b"".join(lines), rows, memory, fetched


def _copy(message: Message) -> Message:
    return Message(**{f: getattr(message, f) for f in message.__dataclass_fields__})


@pytest.mark.parametrize("expiring", [True, False])
@pytest.mark.parametrize("plain_only", [True, False])
@pytest.mark.parametrize("before", [0, 5])
async def test_a_release_by_columns_writes_and_tells_what_the_release_by_objects_does(
    make_engine: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    plain_only: bool,
    before: int,
    expiring: bool,
) -> None:
    # Given the same due messages in two engines
    messages = [m for m in _messages(expiring=expiring) if not (plain_only and m.headers)]
    # When one releases them as the store reads them (plain ones as columns)
    by_columns = await _released(make_engine, tmp_path, "columns", messages, before=before)
    # and the other as objects
    monkeypatch.setattr(QueueTxn, "enqueue_columns", lambda self, due: False)
    by_objects = await _released(make_engine, tmp_path, "objects", messages, before=before)
    # Then the first read plain batches as columns, the second wrote them as objects
    assert any(isinstance(got, DueColumns) for got in by_columns[4]) is plain_only
    # and the events, the journal's lines, the queue's rows and the remembered rows agree
    events, lines, rows, memory, _ = by_columns
    assert events == by_objects[0]
    assert len(events) == len(messages) - before
    assert lines == by_objects[1]
    assert rows == by_objects[2]
    assert len(rows) == len(messages)
    assert memory == by_objects[3]


async def test_a_queue_that_needs_the_general_path_takes_the_whole_batch_as_objects(
    make_engine: Any, tmp_path: Path
) -> None:
    # Given due plain messages, one of them for a queue with a length limit
    engine = await make_engine()
    await engine.declare_queue("q", {})
    await engine.declare_queue("ttl", {})
    await engine.declare_queue("short", {"max_length": 2, "overflow": "reject_publish"})
    messages = [_copy(m) for m in _messages() if not m.headers and not m.expires_at_ms]
    messages[3].destination = messages[4].destination = messages[5].destination = "short"
    await engine.store.store(messages)
    # When they are released
    while await engine.dispatcher.run_once():
        pass
    # Then the full queue refused its third message, and every other one was released once
    ids = {m.id for m in messages}  # not the dead-lettered copy
    released = [e for e in engine.recorder.of("released") if e[1] in ids]
    assert sorted(e[1] for e in released) == sorted(m.id for i, m in enumerate(messages) if i != 5)
    assert (await engine.queue_info("short")).ready == 2


def test_a_release_by_columns_is_journalled_and_timed_from_its_columns() -> None:
    # Given plain due messages of two queues read as columns, one queue's share released
    due = DueColumns(
        ids=[f"{i:026d}" for i in range(6)],
        destination=["q", "r", "q", "q", "r", "q"],
        body=[b"x" * i for i in range(6)],
        sent_at_ms=[NOW - 9000] * 6,
        deliver_at_ms=[NOW - 100 * i for i in range(6)],
        expires_at_ms=[None] * 6,
    )
    ready = ReadyColumns(due, [0, 2, 3, 5], "q", NOW + 7, [None] * 4)
    run = EventRun("released", ready, NOW + 7, "q")
    # When the journal writes its lines and the metrics read its lateness
    lines, count, dropped = encode_lines(run, "node")
    late = run.late_ms()
    # Then no message was made for either
    assert ready._made is None
    # and both are what the same run of messages gives
    made = EventRun("released", list(ready), NOW + 7, "q")
    assert (lines, count, dropped) == encode_lines(made, "node")
    assert late == made.late_ms() == [7, 207, 307, 507]
