"""A receive's response encoded without a dict per message (``server.responses.received``) is
byte for byte what ``orjson`` makes of ``Delivery.to_public``, whatever the message holds."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tarry.engine.types import Deliveries, Delivery
from tarry.model.ids import IdGenerator
from tarry.model.message import Death, DeathReason, plain_message
from tarry.model.queue_args import QueueArgs
from tarry.queues.catalog import Catalog, QueueEntry
from tarry.queues.row_messages import ReceivedRows
from tarry.queues.sequence import Sequencer
from tarry.queues.txn import QueueTxn
from tarry.server.responses import received
from tarry.store.sqlite.database import _connect
from tarry.store.sqlite.row_memory import RowMemory
from tarry.store.sqlite.rows import released_row
from tarry.store.sqlite.schema import is_keyed, migrate

T = TypeVar("T")

_PLAIN = plain_message("01JABCDEFGHJKMNPQRSTVWXYZ0", "orders", b"hello", 1_000, 2_000, None)


def _expected(deliveries: list[Delivery]) -> bytes:
    return orjson.dumps({"messages": [d.to_public() for d in deliveries]})


def test_every_kind_of_message_is_encoded_as_its_public_form() -> None:
    death = Death(DeathReason.EXPIRED, "orders", 1_500, 1, "orders")
    messages = [
        _PLAIN,
        replace(_PLAIN, body='quote " back \\ newline \n tab \t nul \x00 é ✓ 😀'.encode()),
        replace(_PLAIN, body=b"\xff\xfe not text"),
        replace(_PLAIN, body=b""),
        replace(_PLAIN, headers={"k": "v", "é": '"'}),
        replace(_PLAIN, deaths=[death]),
        replace(_PLAIN, expires_at_ms=9_000, message_id='m"1', correlation_id="c\n1"),
        replace(_PLAIN, redelivered=True, delivery_count=3),
    ]
    deliveries = [Delivery(m, f"01JRECEIVE.{i}") for i, m in enumerate(messages)]
    assert received(deliveries) == _expected(deliveries)
    assert received([]) == b'{"messages":[]}'


@given(
    body=st.binary(max_size=40) | st.text(max_size=40).map(str.encode),
    message_id=st.none() | st.text(max_size=10),
    expires=st.none() | st.integers(0, 2**53),
    count=st.integers(0, 10),
)
def test_any_plain_message_is_encoded_as_its_public_form(
    body: bytes, message_id: str | None, expires: int | None, count: int
) -> None:
    message = replace(
        _PLAIN,
        body=body,
        message_id=message_id,
        expires_at_ms=expires,
        delivery_count=count,
        redelivered=count > 1,
    )
    deliveries = [Delivery(message, "01JRECEIVE.7")]
    assert received(deliveries) == _expected(deliveries)


def _queue_database(path: Path, *, memory: bool) -> sqlite3.Connection:
    conn = _connect(str(path))
    migrate(conn, queues_only=True)
    conn.keyed = is_keyed(conn)
    conn.released = RowMemory() if memory else None
    conn.handed_out = RowMemory() if memory else None
    return conn


def _in_transaction(conn: sqlite3.Connection, now_ms: int, work: Callable[[QueueTxn], T]) -> T:
    catalog = Catalog()
    catalog.queues["orders"] = QueueEntry("orders", QueueArgs(), 0, 0)
    catalog.recompute()
    txn = QueueTxn(
        conn,
        now_ms=now_ms,
        catalog=catalog,
        ids=IdGenerator(),
        seq=Sequencer(),
        waiting={},
        error_queue="tarry.errors",
    )
    conn.execute("BEGIN")
    result = work(txn)
    txn.flush()
    conn.execute("COMMIT")
    return result


@pytest.mark.parametrize("memory", [True, False])
def test_a_receive_answered_from_its_rows_is_the_answer_of_its_messages(
    tmp_path: Path, memory: bool
) -> None:
    """A receive's answer written from the rows it took (``Deliveries``) is byte for byte the
    general path's (``Delivery.to_public`` of each message), for plain messages and the others
    (headers, deaths, producer ids, an expiry, a body that is not text), first deliveries and
    redeliveries alike."""
    # Given a queue holding every kind of message, remembered at their release or not
    death = Death(DeathReason.EXPIRED, "orders", 1_500, 1, "orders")
    kinds = [
        _PLAIN,
        replace(_PLAIN, body='quote " back \\ é ✓ 😀 %d'.encode()),
        replace(_PLAIN, body=b"\xff\xfe not text"),
        replace(_PLAIN, body=b""),
        replace(_PLAIN, headers={"k": "v", "é": '"'}),
        replace(_PLAIN, deaths=[death]),
        replace(_PLAIN, expires_at_ms=90_000, message_id='m"1', correlation_id="c\n1"),
        replace(_PLAIN, correlation_id="c-2"),
    ]
    ids = IdGenerator()
    batch = [replace(m, id=ids.new(1_000)) for m in kinds]
    conn = _queue_database(tmp_path / "queues.db", memory=memory)
    _in_transaction(conn, 2_000, lambda txn: txn.enqueue_many(batch, "orders"))
    answers = []
    # When a consumer takes some, lets them lapse, and takes them all (redelivered)
    for now, count in ((2_001, 3), (40_000, 8)):
        taken = _in_transaction(
            conn,
            now,
            lambda txn, count=count: txn.receive("orders", max_messages=count, visibility_ms=10),
        )
        answers.append((Deliveries(taken), [Delivery(m, r) for m, r in taken]))
    conn.close()
    # Then each answer is the general path's, byte for byte
    for from_rows, general in answers:
        assert received(from_rows) == _expected(general) == received(general)
    first, again = (orjson.loads(received(d))["messages"] for d, _ in answers)
    assert len(first) == 3 and len(again) == 8
    assert [m["delivery_count"] for m in again] == [2, 2, 2, 1, 1, 1, 1, 1]
    assert [m["redelivered"] for m in again] == [True] * 3 + [False] * 5
    assert {m["correlation_id"] for m in again} == {None, "c\n1", "c-2"}


def test_an_answer_from_rows_whose_messages_were_read_is_the_same() -> None:
    """Once a listener read the messages (the journal), the answer is still from the rows."""
    row = released_row("orders", 5, ("01JABCDEFGHJKMNPQRSTVWXYZ0", b"hi", 1, 2, 7, None, None))
    deliveries = Deliveries(ReceivedRows([row], ["01JRECEIVE.1"], 9))
    untouched = received(deliveries)
    (message,) = deliveries.taken.messages
    assert (message.delivery_count, message.updated_at_ms, message.state.value) == (
        1,
        9,
        "delivered",
    )
    assert received(deliveries) == untouched == _expected(list(deliveries))
