"""Small value types and codes of the log store: ``Held`` (a pending message outside its
partition's index), ``Failure`` (a message's failed attempts and when it may be tried again),
the numeric codes of end states in RELEASED markers, and the de-duplication hash."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import NamedTuple

from tarry.model.message import Message
from tarry.model.state import MessageState
from tarry.store.sqlite.rows import dedupe_key

__all__ = ["STATE_CODES", "Failure", "Held", "dedupe_hash", "key_hash", "state_of_code"]

#: End state → the number a RELEASED marker stores (stable: append new states at the end).
STATE_CODES = {s: i for i, s in enumerate(MessageState)}
_CODE_STATES = {i: s for s, i in STATE_CODES.items()}


def state_of_code(code: int) -> MessageState:
    return _CODE_STATES.get(code, MessageState.DELIVERED)


def dedupe_hash(message: Message) -> int:
    """64-bit hash of the (destination, message_id) key (0: the message has none)."""
    return key_hash(dedupe_key(message))


def key_hash(key: str | None) -> int:
    """64-bit hash of a de-duplication key (``dedupe_key``; 0 for none), never 0 for a key."""
    if key is None:
        return 0
    value = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return (value & ((1 << 63) - 1)) or 1


class Failure(NamedTuple):
    """What a FAILED marker records: kept in the state and the snapshot's manifest, so a
    restart neither forgets the count nor retries before the back-off ends."""

    attempts: int
    error: str
    #: 0 in manifests written before the retry time was kept: try again at once, as then.
    retry_at_ms: int = 0


@dataclass(slots=True)
class Held:
    """A pending message out of its partition's index: claimed, waiting to retry, or leaving."""

    number: int
    pos: int
    due: int
    destination: str
    until: int = 0
