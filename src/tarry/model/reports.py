"""IBM MQ-style reports: the message sent to ``reply_to`` when a message asked for one
(``report``: ``expiration``, ``exception``) and expired or could not be delivered."""

from __future__ import annotations

import orjson

from tarry.model.message import Message

__all__ = ["report_message"]


def report_message(original: Message, kind: str, detail: str, *, id: str, now_ms: int) -> Message:
    """The report of ``kind`` about ``original`` (to its ``reply_to``, due at once): correlation
    id = the original's correlation id, else its message_id, else its tarry id
    (MQRO_COPY_MSG_ID_TO_CORREL_ID)."""
    assert original.reply_to is not None
    body = orjson.dumps(
        {
            "report": kind,
            "id": original.id,
            "destination": original.destination,
            "message_id": original.message_id,
            "correlation_id": original.correlation_id,
            "deliver_at": original.deliver_at_ms,
            "expires_at": original.expires_at_ms,
            "detail": detail,
            "time": now_ms,
        }
    )
    return Message(
        id=id,
        destination=original.reply_to,
        body=body,
        headers={
            "tarry-report": kind,
            "tarry-original-id": original.id,
            "content-type": "application/json",
        },
        sent_at_ms=now_ms,
        deliver_at_ms=now_ms,
        expires_at_ms=None,
        correlation_id=original.correlation_id or original.message_id or original.id,
        updated_at_ms=now_ms,
    )
