"""JSON responses rendered with orjson (the send paths return thousands of results at once), and
a receive's response encoded from its deliveries without a dict per message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from starlette.responses import JSONResponse, Response

from tarry.engine.types import Deliveries, Delivery
from tarry.store.sqlite.rows import COLUMNS

__all__ = ["JSON", "Encoded", "received"]


# A JSONResponse, so the OpenAPI document says JSON of the routes' declared models.
class JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class Encoded(Response):
    """A body already encoded as JSON."""

    media_type = "application/json"


#: ``Delivery.to_public`` of a message without headers or deaths whose body is UTF-8 text, as
#: ``orjson`` writes that dict: keys in the same order, the strings through ``orjson``.
_PLAIN = (
    b'{"id":%s,"receipt":%s,"body":%s,"headers":{},"deliver_at":%d,"expires_at":%s,'
    b'"sent_at":%d,"message_id":%s,"correlation_id":%s,"redelivered":%s,"delivery_count":%d,'
    b'"deaths":[]}'
)
_NULL = b"null"


def received(deliveries: Sequence[Delivery]) -> bytes:
    """``{"messages": [...]}`` of ``Delivery.to_public`` of each (and what came of the receipts
    a receive acked, ``Deliveries.settled``, when it was given any), byte for byte what
    ``orjson.dumps`` makes of it. A receive answers a few dozen messages at a time and a dict
    per message cost more than the rest of the answer: a message with nothing but the
    common fields (nearly every one) fills a template; any other is written from its dict.
    A receive's own answer (``Deliveries``) is written from its rows, with no object per
    message but for those that are not plain."""
    if isinstance(deliveries, Deliveries):
        return _received_rows(deliveries)
    dumps = orjson.dumps
    parts: list[bytes] = []
    for delivery in deliveries:
        m = delivery.message
        text = m.body_text if not m.headers and not m.deaths else None
        if text is None:  # headers, deaths, or a body that is not text (body_base64)
            parts.append(dumps(delivery.to_public()))
            continue
        parts.append(
            _plain(
                m.id,
                delivery.receipt,
                text,
                m.deliver_at_ms,
                m.expires_at_ms,
                m.sent_at_ms,
                m.message_id,
                m.correlation_id,
                m.redelivered,
                m.delivery_count,
            )
        )
    return b'{"messages":[' + b",".join(parts) + b"]}"


def _plain(
    id: str,
    receipt: str,
    text: str,
    deliver_at_ms: int,
    expires_at_ms: int | None,
    sent_at_ms: int,
    message_id: str | None,
    correlation_id: str | None,
    redelivered: bool,
    delivery_count: int,
) -> bytes:
    """``_PLAIN`` filled in: the answer of one message with the common fields alone."""
    dumps = orjson.dumps
    return _PLAIN % (
        dumps(id),
        dumps(receipt),
        dumps(text),
        deliver_at_ms,
        _NULL if expires_at_ms is None else b"%d" % expires_at_ms,
        sent_at_ms,
        _NULL if message_id is None else dumps(message_id),
        _NULL if correlation_id is None else dumps(correlation_id),
        b"true" if redelivered else b"false",
        delivery_count,
    )


_ID, _BODY, _HEADERS, _DEATHS = map(COLUMNS.index, ("id", "body", "headers", "deaths"))
_SENT, _DUE, _EXPIRES = map(COLUMNS.index, ("sent_at_ms", "deliver_at_ms", "expires_at_ms"))
_MESSAGE_ID, _CORRELATION_ID = map(COLUMNS.index, ("message_id", "correlation_id"))
_REDELIVERED, _COUNT = COLUMNS.index("redelivered"), COLUMNS.index("delivery_count")


def _received_rows(deliveries: Deliveries) -> bytes:
    """``received`` of a receive's rows, each as the receive left it (``from_row`` with
    ``delivered_at_ms``: delivered once more, redelivered if it was delivered before)."""
    taken = deliveries.taken
    dumps = orjson.dumps
    parts: list[bytes] = []
    for k, (row, receipt) in enumerate(zip(taken.rows, taken.receipts, strict=True)):
        text = None
        if row[_HEADERS] == "{}" and not row[_DEATHS]:
            try:
                text = (row[_BODY] or b"").decode("utf-8")
            except UnicodeDecodeError:
                pass
        if text is None:  # headers, deaths, or a body that is not text: from its message
            parts.append(dumps(deliveries[k].to_public()))
            continue
        count = row[_COUNT]  # as the receive left it: delivered once more
        parts.append(
            _plain(
                row[_ID],
                receipt,
                text,
                row[_DUE],
                row[_EXPIRES],
                row[_SENT],
                row[_MESSAGE_ID],
                row[_CORRELATION_ID],
                bool(row[_REDELIVERED]) or count > 0,
                count + 1,
            )
        )
    # The receipts it was given to ack: ``"acked"`` and ``"unknown"`` as an ack answers them.
    settled = b"" if deliveries.settled is None else b"," + orjson.dumps(deliveries.settled)[1:-1]
    return b'{"messages":[' + b",".join(parts) + b"]" + settled + b"}"
