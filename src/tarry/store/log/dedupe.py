"""De-duplication of a stored batch: a message sent with a ``message_id`` whose (destination,
message_id) key the store holds already (pending, or being written by this or a concurrent
batch) is not stored again; the outcome names the message kept."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from tarry.model.message import Message
from tarry.store.base import StoreOutcome
from tarry.store.log.locate import Located

__all__ = ["Admitted", "admit"]


@dataclass
class Admitted:
    outcomes: list[StoreOutcome] = field(default_factory=list)
    #: The messages to write, with their de-duplication hashes.
    accepted: list[Message] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    #: The keyed ones among them (now in ``unwritten``).
    keyed: list[tuple[int, Message]] = field(default_factory=list)


async def admit(
    messages: Sequence[Message],
    keys: list[int],
    *,
    dedupe: dict[int, str],
    unwritten: dict[int, Message],
    locate_many: Callable[[list[str]], Awaitable[dict[str, Located]]],
    get: Callable[[str], Awaitable[Message | None]],
) -> Admitted:
    """De-duplication of a batch with keys (``keys``: each message's hash, 0 for none)."""
    out = Admitted()
    kept_ids = [dedupe[key] for key in keys if key in dedupe]
    # Repeats of pending messages are read back in one pass over each partition they name,
    # before the loop: a rerun of an import repeats a whole batch.
    kept = await locate_many(kept_ids) if kept_ids else {}
    looked = set(kept_ids)
    for message, key in zip(messages, keys, strict=True):
        if key:
            writing = unwritten.get(key)
            if writing is not None:  # the same key earlier in this or a concurrent batch
                out.outcomes.append(StoreOutcome(replace(writing), False))
                continue
            if key in dedupe:
                kept_id = dedupe[key]
                if kept_id in kept:
                    found: Message | None = kept[kept_id].message
                else:  # gone since, or named by a batch written while we looked
                    found = None if kept_id in looked else await get(kept_id)
                if found is not None:
                    out.outcomes.append(StoreOutcome(found, False))
                    continue
            unwritten[key] = message
            out.keyed.append((key, message))
        out.accepted.append(message)
        out.hashes.append(key)
        out.outcomes.append(StoreOutcome(message, True))
    return out
