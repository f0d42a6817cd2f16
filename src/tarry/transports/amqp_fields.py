"""AMQP field tables whose integers carry the type a peer expects, not the smallest that fits.

pamqp (under aio-pika) encodes a Python ``int`` in a field table as the smallest type that holds
it (``b``, ``s``, ``I`` … ``l``), and offers no way to ask for another. Most peers do not care;
.NET ones do: NServiceBus.RabbitMQ unboxes the delay header with ``(int)value``, which throws
unless the value arrived as a 32-bit ``I``, and declares ``x-message-ttl`` as a 64-bit ``l``.
Here a caller names the type of chosen entries (``FieldTypes``); everything else is encoded by
pamqp as before.

- ``encode_table`` is the field-table encoder: pamqp's, except for the named entries.
- ``TypedMessage`` is an ``aio_pika.Message`` whose ``headers`` are encoded that way (aio-pika
  publishes any ``AbstractMessage`` through its ``properties``).
- ``declare_queue`` declares a queue whose ``arguments`` are encoded that way.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from enum import Enum
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel
from aiormq import spec
from pamqp import encode

__all__ = ["FieldType", "FieldTypes", "TypedMessage", "declare_queue", "encode_table"]


class FieldType(Enum):
    """An AMQP 0-9-1 integer field type, as RabbitMQ reads it (``rabbit_binary_parser``)."""

    #: ``I``: signed 32-bit (.NET ``int``).
    INT32 = (b"I", struct.Struct(">i"))
    #: ``l``: signed 64-bit (.NET ``long``).
    INT64 = (b"l", struct.Struct(">q"))

    def encode(self, value: int) -> bytes:
        tag, packer = self.value
        return bytes(tag) + bytes(packer.pack(value))


#: Field name → the type its integer value must have on the wire.
FieldTypes = Mapping[str, FieldType]

#: AMQP short strings (field names) hold at most this many bytes; pamqp truncates, so do we.
_MAX_FIELD_NAME_BYTES = 128


def encode_table(table: Mapping[str, Any] | None, types: FieldTypes) -> bytes:
    """The field table ``table`` as pamqp would encode it, with the integers named in ``types``
    in their given type. Raises ``TypeError`` (as pamqp does) for a named entry that is not an
    ``int`` or does not fit its type."""
    if not table:
        return encode.field_table({})
    parts: list[bytes] = []
    for key, value in sorted(table.items()):
        name = key.encode("utf-8")[:_MAX_FIELD_NAME_BYTES].decode("utf-8", "ignore")
        parts.append(encode.short_string(name))
        field_type = types.get(key)
        if field_type is None:
            parts.append(encode.encode_table_value(value))
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{key} must be an int to be sent as {field_type.name}, not {value!r}")
        try:
            parts.append(field_type.encode(value))
        except struct.error as exc:
            raise TypeError(f"{key} ({value}) does not fit {field_type.name}") from exc
    body = b"".join(parts)
    return struct.pack(">I", len(body)) + body


class _TypedProperties(spec.Basic.Properties):
    # No __slots__ of its own: pamqp marshals ``self.__slots__``, which must stay the parent's.
    field_types: FieldTypes

    def encode_property(self, name: str, value: Any) -> bytes:
        if name == "headers":
            return encode_table(value, self.field_types)
        return bytes(super().encode_property(name, value))


class TypedMessage(aio_pika.Message):
    """An ``aio_pika.Message`` whose headers named in ``field_types`` go out in that type."""

    __slots__ = ("field_types",)

    def __init__(self, body: bytes, *, field_types: FieldTypes, **kwargs: Any) -> None:
        super().__init__(body, **kwargs)
        self.field_types = dict(field_types)

    @classmethod
    def from_message(
        cls, message: aio_pika.Message, *, headers: Mapping[str, Any], field_types: FieldTypes
    ) -> TypedMessage:
        """A copy of ``message`` (every property) with ``headers`` instead of its own."""
        return cls(
            message.body,
            field_types=field_types,
            headers=dict(headers),
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            delivery_mode=message.delivery_mode,
            priority=message.priority,
            correlation_id=message.correlation_id,
            reply_to=message.reply_to,
            expiration=message.expiration,
            message_id=message.message_id,
            timestamp=message.timestamp,
            type=message.type,
            user_id=message.user_id,
            app_id=message.app_id,
        )

    @property
    def properties(self) -> spec.Basic.Properties:
        fields: dict[str, Any] = dict(super().properties)
        typed = _TypedProperties(**fields)
        typed.field_types = self.field_types
        return typed


class _TypedQueueDeclare(spec.Queue.Declare):
    field_types: FieldTypes

    def marshal(self) -> bytes:
        # ``arguments`` is queue.declare's last field (AMQP 0-9-1 §1.7.2.1): marshal the rest
        # with an empty table (4 zero bytes) and put the typed table in its place.
        arguments, self.arguments = self.arguments, {}
        try:
            head = bytes(super().marshal())
        finally:
            self.arguments = arguments
        return head[: -len(encode.field_table({}))] + encode_table(arguments, self.field_types)


async def declare_queue(
    channel: AbstractChannel,
    name: str,
    *,
    durable: bool,
    arguments: Mapping[str, Any],
    field_types: FieldTypes,
) -> None:
    """``queue.declare`` with ``arguments`` typed by ``field_types``; raises aiormq's errors
    (``ChannelPreconditionFailed`` when the queue exists with other arguments)."""
    frame = _TypedQueueDeclare(queue=name, durable=durable, arguments=dict(arguments))
    frame.field_types = field_types
    underlay = await channel.get_underlay_channel()
    if not isinstance(underlay, aiormq.Channel):  # aio-pika's channels are aiormq's
        raise TypeError(f"an aiormq channel is needed, not {underlay!r}")
    await underlay.rpc(frame)
