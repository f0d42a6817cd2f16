"""Receives not yet written: a queue database of its own keeps a receive's claim on its rows in
memory and writes it later, and most claims are never written.

A consumer that acks within moments (the usual one) changes each row twice, in flight at the
receive and acked at the ack, and the first change is gone by the second. So here a receive
leaves its rows as they are in the table and keeps its claim (its id, the rows, the end of the
visibility timeout, its time) in this memory; an ack of claimed rows writes each row as the
receive and the ack together would have left it, in one statement. A claim is written as the
receive would have written it:
- once it is ``WRITE_AFTER_S`` old (a consumer holding its messages a while), by the next
  transaction, or by a write the event loop asks for when none comes (``Database``);
- before any write or read of the database other than a receive, an ack or a release
  (``Database``): everything else sees the table as if each receive had written its rows;
- before a receive or a release reads the queue in a way that must not step over claimed rows
  (a length limit's count, ``QueueTxn``), or when a receive would step over too many.

A receive whose visibility timeout is shorter than ``MIN_VISIBILITY_MS`` writes its rows at
once: its claim could outlive the timeout.

Claims are the writing connection's alone (as ``row_memory``'s rows) and follow its
transactions: what a rolled-back savepoint or transaction changed here is undone with it.

What a crash costs: claims not yet written are lost, so those messages are ready again after
a restart, delivered again at once rather than after their visibility timeout, their delivery
count not raised. They were not acked, so delivery stays at-least-once; an ack is written
before it is answered, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from tarry.store.sql import ACKED, COUNT_DELIVERY, SqlConnection, in_list, received_sql

__all__ = ["MIN_VISIBILITY_MS", "WRITE_AFTER_S", "Claim", "PendingReceives"]

#: How long a claim may stay unwritten.
WRITE_AFTER_S = 0.2
#: The shortest visibility timeout a receive may keep as a claim: several times
#: ``WRITE_AFTER_S``, so that a claim is written well before its rows may be taken again.
MIN_VISIBILITY_MS = 1_000

_ACK = (
    f"UPDATE messages SET {ACKED}, visible_at_ms = ?, {COUNT_DELIVERY}, updated_at_ms = ? "
    "WHERE {where} AND +queue = ? AND +state = 'ready'"
)


@dataclass(slots=True)
class Claim:
    """One receive's rows not yet written, by ``rowid``."""

    receive_id: str
    queue: str
    visible_at_ms: int
    received_at_ms: int
    #: When it was made (``time.monotonic``).
    since: float
    keys: set[int]


class PendingReceives:
    def __init__(self, *, write_after_s: float = WRITE_AFTER_S) -> None:
        self.write_after_s = write_after_s
        #: By receive id, oldest first.
        self._claims: dict[str, Claim] = {}
        self._by_key: dict[int, Claim] = {}
        #: What undoes each change since the transaction began, in order.
        self._undo: list[Callable[[], None]] = []

    def __len__(self) -> int:
        return len(self._by_key)

    def claimed_in(self, queue: str) -> set[int]:
        """The rows of ``queue`` claimed and not written (a receive steps over them)."""
        keys: set[int] = set()
        for claim in self._claims.values():
            if claim.queue == queue:
                keys |= claim.keys
        return keys

    def holds(self, key: int, receipt: str) -> bool:
        """Whether the row of ``key`` is claimed under ``receipt`` (``receipt_of``'s form)."""
        claim = self._by_key.get(key)
        return claim is not None and receipt == f"{claim.receive_id}.{key}"

    def claim(
        self,
        receive_id: str,
        queue: str,
        keys: Sequence[int],
        *,
        visible_at_ms: int,
        received_at_ms: int,
    ) -> None:
        """Keep a receive's claim on the rows of ``keys`` instead of writing them."""
        claim = Claim(receive_id, queue, visible_at_ms, received_at_ms, time.monotonic(), set(keys))
        self._claims[receive_id] = claim
        for key in keys:
            self._by_key[key] = claim
        self._undo.append(lambda: self._drop(claim, claim.keys))

    def ack(self, conn: SqlConnection, queue: str, keys: Collection[int], *, now_ms: int) -> int:
        """Write the claimed rows of ``keys`` (of ``queue``) acked, as their receive and an ack
        would have left them; the rows changed. The claims let go of them."""
        by_claim: dict[str, list[int]] = {}
        for key in keys:
            by_claim.setdefault(self._by_key[key].receive_id, []).append(key)
        changed = 0
        for receive_id, claimed in by_claim.items():
            claim = self._claims[receive_id]
            where, args = in_list(conn, "rowid", claimed)
            changed += conn.execute(
                _ACK.format(where=where), [claim.visible_at_ms, now_ms, *args, queue]
            ).rowcount
            self._let_go(claim, claimed)
        return changed

    def write_all(self, conn: SqlConnection) -> None:
        """Write every claim as its receive would have."""
        for claim in list(self._claims.values()):
            self._write(conn, claim)

    def write_older(self, conn: SqlConnection, *, now: float | None = None) -> None:
        """Write the claims ``write_after_s`` old or older (``now``: ``time.monotonic``)."""
        before = (time.monotonic() if now is None else now) - self.write_after_s
        for claim in list(self._claims.values()):
            if claim.since > before:
                break  # oldest first: the rest are younger
            self._write(conn, claim)

    def oldest_since(self) -> float | None:
        """When the oldest claim was made (``time.monotonic``), or None without claims."""
        return next(iter(self._claims.values())).since if self._claims else None

    # --- following the transaction ---------------------------------------------------------------
    def mark(self) -> int:
        """A point to undo back to (a savepoint)."""
        return len(self._undo)

    def undo_to(self, mark: int) -> None:
        """Undo what changed since ``mark`` (its savepoint or transaction was rolled back)."""
        while len(self._undo) > mark:
            self._undo.pop()()

    def commit(self) -> None:
        """The transaction committed: what changed stays."""
        self._undo.clear()

    # --- inside --------------------------------------------------------------------------------
    def _write(self, conn: SqlConnection, claim: Claim) -> None:
        keys = sorted(claim.keys)
        where, args = in_list(conn, "rowid", keys)
        conn.execute(
            received_sql("rowid", f"{where} AND state = 'ready'"),
            [claim.receive_id, claim.visible_at_ms, claim.received_at_ms, *args],
        )
        self._let_go(claim, keys)

    def _let_go(self, claim: Claim, keys: Collection[int]) -> None:
        gone = set(keys)
        self._drop(claim, gone)
        self._undo.append(lambda: self._restore(claim, gone))

    def _drop(self, claim: Claim, keys: Collection[int]) -> None:
        gone = set(keys)  # ``keys`` may be ``claim.keys`` itself
        claim.keys -= gone
        for key in gone:
            if self._by_key.get(key) is claim:
                del self._by_key[key]
        if not claim.keys:
            self._claims.pop(claim.receive_id, None)

    def _restore(self, claim: Claim, keys: Collection[int]) -> None:
        claim.keys |= set(keys)
        for key in keys:
            self._by_key[key] = claim
        if claim.receive_id not in self._claims:
            # Back in its place by age: a claim written out of order is rare (an ack).
            self._claims[claim.receive_id] = claim
            ordered = sorted(self._claims.values(), key=lambda c: c.since)
            self._claims = {c.receive_id: c for c in ordered}
