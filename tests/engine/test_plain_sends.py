"""A big batch of plain sends (``tarry.model.accepted``): kept as columns by the log store, as
objects by the others, and answered, told and released exactly as the general path does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tarry.engine.types import ColumnResults, SendResult
from tarry.errors import TarryError
from tarry.model.batch import COLUMN_MIN
from tarry.model.ids import id_due_ms
from tarry.store.base import ColumnStore


def _batch(n: int = COLUMN_MIN + 44) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"destination": "q", "body": f"m{i}", "delay_ms": 1000 + 7 * i} for i in range(n)
    ]
    items[5] = {"destination": "q", "delay_ms": -1}  # invalid_argument
    items[9] = {"destination": "q", "delay_ms": 5000, "ttl_ms": 10}  # expiry_error
    items[11] = {"destination": "q", "body": "kept", "delay_ms": 2000, "ttl_ms": 60_000}
    items[12] = {"destination": "q", "body": None, "deliver_at": 1_700_000_003_000}
    return items


def _answer(result: SendResult | TarryError) -> object:
    """A result as the HTTP answer shows it, its id left out (each send makes its own)."""
    if isinstance(result, TarryError):
        return {"error": result.to_dict()}
    public = result.to_public()
    return {k: v for k, v in public.items() if k != "id"}


def _public(answer: dict[str, Any]) -> object:
    """An answer of ``ColumnResults.public``, as ``_answer`` shows a result."""
    return answer if "error" in answer else {k: v for k, v in answer.items() if k != "id"}


def _spy(engine: Any, calls: list[str]) -> None:
    store = engine.store
    for name in ("store", "store_columns"):
        method = getattr(store, name, None)
        if method is None:
            continue

        def spied(*args: Any, _name: str = name, _method: Any = method) -> Any:
            calls.append(_name)
            return _method(*args)

        setattr(store, name, spied)


async def _spied(make_engine: Any) -> tuple[Any, list[str]]:
    """An engine with a queue ``q``, and the names of the store's calls (``_spy``)."""
    engine = await make_engine()
    await engine.declare_queue("q", {})
    calls: list[str] = []
    _spy(engine, calls)
    return engine, calls


async def test_plain_sends_are_answered_as_the_general_path_answers_them(
    make_engine, clock
) -> None:
    # Given an engine (log store: the column path; SQLite: objects), and one whose sends all
    # take the general path
    engine, calls = await _spied(make_engine)
    # When the same batch is sent both ways
    results = await engine.send_batch(_batch())
    engine.sender._columns = None
    general = await engine.send_batch(_batch())
    # Then the log store kept the first as columns, and every answer is the same
    if isinstance(engine.store, ColumnStore):
        assert calls == ["store_columns", "store"]
    else:  # SQLite keeps sends inside the engine's queue transaction (``store_in``)
        assert "store_columns" not in calls
    assert [_answer(r) for r in results] == [_answer(r) for r in general]
    if isinstance(engine.store, ColumnStore):
        # and the answer written from the columns is the results' public form, dict for dict
        assert isinstance(results, ColumnResults)
        refusal = lambda e: {"error": e.to_dict()}  # noqa: E731
        assert results.public(refusal) == [
            refusal(r) if isinstance(r, TarryError) else r.to_public() for r in results
        ]
        assert [_public(a) for a in results.public(refusal)] == [_answer(r) for r in general]
    assert [getattr(r, "code", None) for r in results[4:13]] == [
        None,
        "invalid_argument",
        None,
        None,
        None,
        "expiry_error",
        None,
        None,
        None,
    ]
    kept = [r for r in results if isinstance(r, SendResult)]
    assert all(id_due_ms(r.id) == r.deliver_at_ms for r in kept)
    # and each message reads back as sent, and was told once as scheduled
    for index in (0, 11, 12):
        result = results[index]
        assert isinstance(result, SendResult)
        message = await engine.get_message(result.id)
        assert (message.state.value, message.deliver_at_ms, message.expires_at_ms) == (
            "scheduled",
            result.deliver_at_ms,
            result.expires_at_ms,
        )
    assert (await engine.get_message(results[11].id)).body == b"kept"  # type: ignore[union-attr]
    assert (await engine.get_message(results[12].id)).body == b""  # type: ignore[union-attr]
    told = [e for e in engine.recorder.of("scheduled")]
    assert len(told) == 2 * len(kept) and {e[1] for e in told} >= {r.id for r in kept}


async def test_plain_sends_kept_as_columns_fall_due_and_are_received_in_order(
    make_engine, clock
) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {})
    results = await engine.send_batch(_batch())
    kept = sorted((r for r in results if isinstance(r, SendResult)), key=lambda r: r.deliver_at_ms)
    # Nothing before the first is due; then each in due order
    clock.advance(999)
    await engine.dispatcher.run_once()
    assert await engine.receive("q") == []
    clock.advance(10_000)
    while await engine.dispatcher.run_once():
        pass
    received = await engine.receive("q", max_messages=1000)
    assert [d.message.id for d in received] == [r.id for r in kept]


@pytest.mark.parametrize(
    "odd",
    [
        {"destination": "t", "body": "to a topic", "delay_ms": 10},
        {"destination": "q", "body": "now"},
        {"destination": "q", "body": "grouped", "group_id": "g"},
        {"destination": "missing", "delay_ms": 10},
    ],
)
async def test_a_batch_with_one_send_that_is_not_plain_takes_the_general_path(
    make_engine, odd: dict[str, Any]
) -> None:
    engine = await make_engine()
    await engine.declare_queue("q", {})
    await engine.declare_queue("sub", {})
    await engine.declare_topic("t")
    await engine.subscribe("t", "sub")
    calls: list[str] = []
    _spy(engine, calls)
    items = _batch()
    items[3] = odd
    results = await engine.send_batch(items)
    assert "store_columns" not in calls
    refused = [i for i, r in enumerate(results) if isinstance(r, TarryError)]
    assert refused == ([3, 5, 9] if odd["destination"] == "missing" else [5, 9])


async def test_a_plain_batch_refused_whole_is_answered_as_the_general_path_answers_it(
    make_engine,
) -> None:
    engine = await make_engine()
    items = [{"body": "x", "delay_ms": 10} for _ in range(COLUMN_MIN)]
    results = await engine.send_batch(items)
    engine.sender._columns = None
    assert [_answer(r) for r in results] == [_answer(r) for r in await engine.send_batch(items)]
    assert {getattr(r, "code", None) for r in results} == {"invalid_argument"}


def _keyed(n: int = COLUMN_MIN + 4) -> list[dict[str, Any]]:
    return [
        {"destination": "q", "body": f"m{i}", "delay_ms": 1000 + i, "message_id": f"order-{i}"}
        for i in range(n)
    ]


def _created(results: Sequence[SendResult | TarryError]) -> list[bool]:
    return [isinstance(r, SendResult) and r.created for r in results]


async def test_sends_with_a_message_id_are_kept_as_columns_and_repeats_named_as_duplicates(
    make_engine, clock
) -> None:
    # Given an engine and a batch of plain sends, each with a message_id of its own
    engine, calls = await _spied(make_engine)
    items = _keyed()
    columns = isinstance(engine.store, ColumnStore)
    # When it is sent
    first = await engine.send_batch(items)
    # Then the log store kept it as columns, every send created, each with its message_id
    assert calls == (["store_columns"] if columns else [])
    assert all(_created(first))
    message = await engine.get_message(first[3].id)  # type: ignore[union-attr]
    assert message is not None and message.message_id == "order-3"
    # When it is sent again, with one new send
    calls.clear()
    again = await engine.send_batch([*items, {**items[0], "message_id": "order-new"}])
    # Then the repeats name the messages kept (the general path answers them) and the new
    # one is kept
    assert calls == (["store_columns", "store"] if columns else [])
    assert [r.id for r in again[:-1]] == [r.id for r in first]  # type: ignore[union-attr]
    assert _created(again) == [False] * len(items) + [True]
    assert again[0].to_public()["duplicate"] is True  # type: ignore[union-attr]
    # When they fall due and are released into the queue
    clock.advance(20_000)
    while await engine.dispatcher.run_once():
        pass
    received = await engine.receive("q", max_messages=1000)
    assert {d.message.message_id for d in received} == {i["message_id"] for i in items} | {
        "order-new"
    }
    # Then a third send of the batch still names them (their keys are in the queue
    # database), without the store being asked to keep it as columns
    calls.clear()
    third = await engine.send_batch(items)
    assert "store_columns" not in calls
    assert [r.id for r in third] == [r.id for r in first]  # type: ignore[union-attr]
    assert not any(_created(third))


async def test_sends_with_a_correlation_id_are_kept_as_columns_and_read_back_with_it(
    make_engine, clock
) -> None:
    # Given a batch of plain sends, every other one with a correlation id (a saga's)
    engine, calls = await _spied(make_engine)
    items = _batch()
    for i in range(0, len(items), 2):
        items[i] = {**items[i], "correlation_id": f"saga-{i}"}
    # When it is sent
    results = await engine.send_batch(items)
    # Then the log store kept it as columns, and a message reads back with its correlation id
    if isinstance(engine.store, ColumnStore):
        assert calls == ["store_columns"]
    message = await engine.get_message(results[4].id)  # type: ignore[union-attr]
    assert message is not None and message.correlation_id == "saga-4"
    # and once released, a consumer receives it with it
    clock.advance(20_000)
    while await engine.dispatcher.run_once():
        pass
    received = await engine.receive("q", max_messages=1000)
    by_id = {d.message.id: d.message.correlation_id for d in received}
    assert by_id[results[4].id] == "saga-4"  # type: ignore[union-attr]
    assert by_id[results[3].id] is None  # type: ignore[union-attr]


async def test_a_message_id_repeated_within_a_batch_is_answered_by_the_general_path(
    make_engine,
) -> None:
    # Given a batch of sends with a message_id each, one of them repeating an earlier one's
    engine, calls = await _spied(make_engine)
    items = _keyed()
    items[7]["message_id"] = items[3]["message_id"]
    # When it is sent
    results = await engine.send_batch(items)
    # Then the repeat names the first message with that message_id, and nothing else repeats
    if isinstance(engine.store, ColumnStore):
        assert calls == ["store_columns", "store"]
    assert results[7].id == results[3].id  # type: ignore[union-attr]
    assert _created(results) == [i != 7 for i in range(len(items))]
