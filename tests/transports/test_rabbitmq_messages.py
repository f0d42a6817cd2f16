"""The AMQP form of a tarry message and the one translation of aio-pika's errors (pure; the
same paths run against the real broker in test_rabbitmq_route.py)."""

from __future__ import annotations

import aio_pika
import aiormq
import pytest

from tarry.errors import DeliveryFailed
from tarry.model.message import Message
from tarry.transports.rabbitmq import amqp_message, check_not_expired, delivery_failed

NOW = 1_700_000_000_000


def message(**fields: object) -> Message:
    base: dict[str, object] = {
        "id": "01ABC",
        "destination": "bus",
        "body": b"b",
        "headers": {"tenant": "acme", "content-type": "application/json"},
        "sent_at_ms": NOW - 5_000,
        "deliver_at_ms": NOW,
        "expires_at_ms": None,
    }
    return Message(**{**base, **fields})  # type: ignore[arg-type]


def test_the_time_left_before_expiry_becomes_the_expiration() -> None:
    amqp = amqp_message(message(expires_at_ms=NOW + 55_000), now_ms=NOW)
    assert amqp.expiration == 55.0
    assert amqp.info()["expiration"] == 55.0  # "55000" on the wire
    assert amqp_message(message(), now_ms=NOW).expiration is None
    # never 0 or negative (0 means "only to a waiting consumer"); check_not_expired refuses
    # an expired message before it gets here
    assert amqp_message(message(expires_at_ms=NOW), now_ms=NOW).expiration == 0.001


def test_properties_and_headers_are_kept() -> None:
    amqp = amqp_message(
        message(message_id="m-1", correlation_id="c-1", persistent=False),
        now_ms=NOW,
        extra_headers={"route": "x"},
    )
    assert amqp.content_type == "application/json"
    assert amqp.message_id == "m-1" and amqp.correlation_id == "c-1"
    assert amqp.delivery_mode == aio_pika.DeliveryMode.NOT_PERSISTENT
    assert amqp.headers is not None
    assert amqp.headers["tenant"] == "acme" and amqp.headers["route"] == "x"
    assert amqp.headers["tarry-id"] == "01ABC" and "content-type" not in amqp.headers
    assert amqp_message(message(), now_ms=NOW).message_id == "01ABC"


def test_an_expired_message_is_never_published() -> None:
    with pytest.raises(DeliveryFailed) as caught:
        check_not_expired(message(expires_at_ms=NOW), NOW)
    assert caught.value.reason == "expired" and caught.value.details["permanent"]


@pytest.mark.parametrize(
    ("error", "reason", "outage"),
    [
        (ConnectionRefusedError(111, "refused"), "connect", True),
        (aiormq.exceptions.AMQPConnectionError("gone"), "connect", True),
        (TimeoutError(), "timeout", True),
        (aiormq.exceptions.ChannelNotFoundEntity("no exchange"), "not_found", False),
        (aiormq.exceptions.ChannelPreconditionFailed("bad"), "refused", False),
        (aiormq.exceptions.ChannelAccessRefused("no"), "channel_closed", False),
        (aiormq.exceptions.ChannelInvalidStateError("closed"), "connection_lost", True),
    ],
)
def test_library_errors_are_translated_once(error: Exception, reason: str, outage: bool) -> None:
    failure = delivery_failed("exchange 'x'", error)
    assert failure.reason == reason
    assert bool(failure.details.get("outage")) is outage
