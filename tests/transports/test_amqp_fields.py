"""Field tables with typed integers, byte for byte (no broker: the wire test beside it checks the
same through RabbitMQ)."""

from __future__ import annotations

import struct

import aio_pika
import pytest
from aiormq import spec
from pamqp import decode, encode

from tarry.transports.amqp_fields import FieldType, TypedMessage, encode_table


def tags(table: bytes) -> dict[str, str]:
    """Field name → type tag of an encoded field table."""
    (length,) = struct.unpack_from(">I", table)
    offset, found = 4, {}
    while offset < 4 + length:
        used, key = decode.short_str(table[offset:])
        offset += used
        found[key] = chr(table[offset])
        offset += decode.embedded_value(table[offset:])[0]
    return found


def test_named_integers_take_their_type_and_the_rest_is_pamqps() -> None:
    table = {"ttl": 1000, "delay": 5, "name": "x", "small": 7}
    typed = encode_table(table, {"ttl": FieldType.INT64, "delay": FieldType.INT32})
    assert tags(typed) == {"delay": "I", "name": "S", "small": "b", "ttl": "l"}
    assert decode.field_table(typed)[1] == table
    assert encode_table(table, {}) == encode.field_table(table)
    assert encode_table({}, {"ttl": FieldType.INT64}) == encode.field_table({})


def test_a_named_entry_that_is_not_an_int_or_does_not_fit_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="must be an int"):
        encode_table({"d": "5"}, {"d": FieldType.INT32})
    with pytest.raises(TypeError, match="must be an int"):
        encode_table({"d": True}, {"d": FieldType.INT32})
    with pytest.raises(TypeError, match="does not fit INT32"):
        encode_table({"d": 1 << 31}, {"d": FieldType.INT32})


def test_a_typed_message_keeps_every_property_and_types_its_headers() -> None:
    plain = aio_pika.Message(
        b"body",
        headers={"d": 5},
        content_type="text/plain",
        message_id="m",
        correlation_id="c",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        expiration=3,
        timestamp=1_700_000_000,
        type="T",
        app_id="a",
    )
    typed = TypedMessage.from_message(plain, headers={"d": 5}, field_types={"d": FieldType.INT32})
    marshalled = typed.properties.marshal()
    decoded = spec.Basic.Properties()
    decoded.unmarshal(struct.unpack_from(">H", marshalled)[0], marshalled[2:])
    assert dict(decoded) == dict(plain.properties)
    assert marshalled != plain.properties.marshal()  # 'I' instead of 'b' for the header
