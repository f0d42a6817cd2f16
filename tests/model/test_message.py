"""``plain_message`` builds, by position, the message the keywords build."""

from __future__ import annotations

from dataclasses import fields

from tarry.model.message import Message, plain_message


def test_plain_message_equals_the_message_built_with_keywords() -> None:
    # Given the fields a plain log record holds
    args = {
        "id": "01ARZ3NDEKTSV4RRFFQ69G5FAV",
        "destination": "q",
        "body": b"x",
        "sent_at_ms": 5,
        "deliver_at_ms": 9,
        "expires_at_ms": 20,
    }
    # Then the positional build equals the keyword one, field for field (a field added to
    # Message, or moved, makes them differ)
    built = plain_message(**args)
    expected = Message(**args, headers={}, updated_at_ms=5)
    assert built == expected
    assert [getattr(built, f.name) for f in fields(Message)] == [
        getattr(expected, f.name) for f in fields(Message)
    ]
    # And its mutable defaults are its own
    assert built.deaths is not plain_message(**args).deaths
