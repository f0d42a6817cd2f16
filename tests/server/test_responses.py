"""A receive's response encoded without a dict per message (``server.responses.received``) is
byte for byte what ``orjson`` makes of ``Delivery.to_public``, whatever the message holds."""

from __future__ import annotations

from dataclasses import replace

import orjson
from hypothesis import given
from hypothesis import strategies as st

from tarry.engine.types import Deliveries, Delivery
from tarry.model.message import Death, DeathReason, plain_message
from tarry.queues.row_messages import ReceivedRows
from tarry.server.responses import received
from tarry.store.sqlite.rows import released_row

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


def test_an_answer_from_rows_whose_messages_were_read_is_the_same() -> None:
    """Once a listener read the messages (the journal), the answer is still from the rows."""
    row = released_row(
        "orders", 5, ("01JABCDEFGHJKMNPQRSTVWXYZ0", b"hi", 1, 2, 7, None, None, None, None, None)
    )
    deliveries = Deliveries(ReceivedRows([row], ["01JRECEIVE.1"], 9))
    untouched = received(deliveries)
    (message,) = deliveries.taken.messages
    assert (message.delivery_count, message.updated_at_ms, message.state.value) == (
        1,
        9,
        "delivered",
    )
    assert received(deliveries) == untouched == _expected(list(deliveries))
