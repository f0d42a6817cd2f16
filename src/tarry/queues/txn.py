"""Local-queue semantics inside one database transaction (RabbitMQ's TTL, dead-lettering and
length rules; IBM MQ's dead-letter-with-reason and reports).

A ``QueueTxn`` runs on the database thread inside a write; everything it does commits or rolls
back together, which is what makes a release into a local queue exactly-once. It records the
state changes it made in ``events`` so the engine can tell its listeners after the commit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import orjson

from tarry.errors import DeliveryFailed
from tarry.model.deaths import record_death, would_cycle
from tarry.model.due import DueColumns, ReadyColumns
from tarry.model.events import Event, EventRun
from tarry.model.expiry import is_expired, queue_expiries_ms, queue_expiry_ms
from tarry.model.ids import IdGenerator
from tarry.model.message import DeathReason, Message, Report, Undeliverable
from tarry.model.queue_args import Overflow
from tarry.model.reports import report_message
from tarry.model.state import MessageState
from tarry.queues.catalog import Catalog
from tarry.queues.ready_rows import takeable_rows
from tarry.queues.receipts import hand_out, settled_by_receipt, write_acked
from tarry.queues.release_columns import plain_release
from tarry.queues.release_writes import (
    Gathered,
    Plain,
    keys_held_elsewhere,
    left_out_why,
    remember,
    seqs_of,
    unkeyed,
    without,
    write_gathered,
    write_plain_rows,
    write_row,
)
from tarry.queues.row_messages import ReceivedRows
from tarry.queues.sequence import Sequencer
from tarry.store.sql import (
    QueueConnection,
    id_column,
    id_key,
    in_list,
    received_sql,
    row_key,
    row_lock,
)
from tarry.store.sqlite.pending_receives import MIN_VISIBILITY_MS
from tarry.store.sqlite.rows import COLUMNS, SELECT_SQL, dedupe_key, from_row, is_plain, to_insert

__all__ = ["HANDOFF_MS", "QUEUED_STATES", "QueueTxn"]

#: A message that expires on arrival (TTL 0) while a consumer is waiting gets this long to be
#: taken by that consumer (RabbitMQ: "expire unless a consumer can take it at once").
HANDOFF_MS = 200

#: The states of a message in a queue: ready, and delivered (in flight until acked, or until
#: its visibility timeout ends, when it may be taken again in its old place). Each has an index
#: of its own on ``queue`` (``messages_ready``, ``messages_held``): a statement about a queue's
#: messages runs once per state, with the state written out, so that each finds its index.
QUEUED_STATES = ("ready", "delivered")
_SEQ = COLUMNS.index("seq")
_STATE = COLUMNS.index("state")
#: Claimed rows a receive steps over at most; past this their claims are written first.
_MAX_STEPPED_OVER = 2_000
#: Every column, as ``SELECT_SQL`` reads them (for RETURNING).
_ALL = ", ".join(COLUMNS)


def _takeable_in(state: str, *, unexpired: bool) -> str:
    """The condition on a queue's messages in ``state`` that a consumer may take now; its
    parameters are ``QueueTxn._takeable_args``. ``unexpired`` leaves out those whose queue
    expiry has come (the sweep dead-letters them)."""
    expiry = " AND (queue_expires_at_ms IS NULL OR queue_expires_at_ms > ?)" if unexpired else ""
    return f"queue = ? AND state = '{state}' AND visible_at_ms <= ?{expiry}"


class QueueTxn:
    def __init__(
        self,
        conn: QueueConnection,
        *,
        now_ms: int,
        catalog: Catalog,
        ids: IdGenerator,
        seq: Sequencer,
        waiting: Mapping[str, int],
        error_queue: str,
    ) -> None:
        self.conn = conn
        self.now_ms = now_ms
        self.catalog = catalog
        self.ids = ids
        self.seq = seq
        self.waiting = waiting
        self.error_queue = error_queue
        self.events: list[Event] = []
        #: Rows ``enqueue(insert=True)`` gathered for ``flush``: (message, seq, insert); each is
        #: visible from ``now_ms``.
        self._rows: Gathered = []
        #: Plain rows ``enqueue_many`` and ``enqueue_columns`` gathered for ``flush``, by queue.
        self._plain: Plain = {}
        #: Changes of many messages told as one run each, after ``events`` (a release by
        #: columns, a receive, an ack): their messages made only for a listener that reads them.
        self.runs: list[EventRun] = []
        #: Queues that received ready messages: their waiting consumers are woken after commit.
        self.filled: set[str] = set()

    def emit(
        self, event: str, message: Message, queue: str | None, reason: str | None = None
    ) -> None:
        self.events.append((event, message, self.now_ms, queue, reason))

    # --- arrival ----------------------------------------------------------------------------------
    def enqueue(self, message: Message, queue: str, *, insert: bool = False) -> None:
        """Move a scheduled message (already a row) into ``queue``; with ``insert`` the row does
        not exist yet (a separate queue database taking in a released message, see
        ``tarry.store.base``) and is written once, in its final state. Raises
        ``DeliveryFailed`` (permanent) when the queue is missing, put-disabled, or full under
        reject_publish; nothing is written then."""
        now = self.now_ms
        args = self.catalog.effective(queue)
        if args is None:
            raise DeliveryFailed(
                f"queue {queue!r} does not exist", reason="unknown_destination", permanent=True
            )
        if not args.put_enabled:
            raise DeliveryFailed(
                f"queue {queue!r} is put-disabled", reason="put_disabled", permanent=True
            )
        expires = queue_expiry_ms(
            message.expires_at_ms, enqueued_at_ms=now, queue_ttl_ms=args.message_ttl_ms
        )
        if is_expired(expires, now):
            if not self.waiting.get(queue):
                if insert:
                    self._insert(message)
                self.dead_letter(message, from_queue=queue, reason=DeathReason.EXPIRED)
                return
            expires = now + HANDOFF_MS
        if args.max_length is not None:
            # Several nodes may fill this queue: take its row lock so the count stays true.
            if lock := row_lock(self.conn):
                self.conn.execute(f"SELECT 1 FROM queues WHERE name = ?{lock}", (queue,))
            ready = self.ready_count(queue)
            if ready >= args.max_length:
                if args.overflow is Overflow.REJECT_PUBLISH:
                    raise DeliveryFailed(
                        f"queue {queue!r} is full (max_length {args.max_length})",
                        reason="destination_full",
                        permanent=True,
                    )
                if args.max_length == 0:
                    if insert:
                        self._insert(message)
                    self.dead_letter(message, from_queue=queue, reason=DeathReason.MAXLEN)
                    return
                self._drop_head(queue, ready - args.max_length + 1)
        self._ready(message, queue, expires)
        if insert:
            # Gathered and written together (``flush``), before any read of the queue or any
            # other write of this transaction.
            seq = self.seq.next()
            self._rows.append((message, seq, to_insert(message, seq=seq, visible_at_ms=now)))
            changed = 1
        else:
            changed = self.conn.execute(
                "UPDATE messages SET state = 'ready', queue = ?, seq = ?, enqueued_at_ms = ?, "
                "queue_expires_at_ms = ?, visible_at_ms = ?, updated_at_ms = ? "
                f"WHERE {id_column(self.conn)} = ? AND state = 'scheduled'",
                (queue, self.seq.next(), now, expires, now, now, id_key(self.conn, message.id)),
            ).rowcount
        if changed:
            self.filled.add(queue)
            self.emit("released", message, queue)

    def enqueue_many(
        self, messages: Sequence[Message], queue: str
    ) -> list[tuple[Message, DeliveryFailed]]:
        """Separate queue database: take in released messages, each keyed by its tarry id, as
        ``enqueue(message, queue, insert=True)`` of each in order would; one whose id is here
        already (released before a crash that came ahead of the store's marker) is left as it
        is, and told no event. Returns the ones refused, each with why.

        The queue's rules are looked up once for all; a message that expires on arrival, or
        sets more columns than a plain one (``is_plain``), and every message of a queue with a
        length limit (which counts the queue as it fills) go through ``enqueue``, once looked
        up (``released_before``); the others are written column-wise (``insert_released``),
        and an id already here is found by that insert itself (``flush``): a release does not
        look up the ids of plain messages first."""
        args = self.catalog.effective(queue)
        refused: list[tuple[Message, DeliveryFailed]] = []
        if args is None or not args.put_enabled or args.max_length is not None:
            before = self.released_before([m.id for m in messages])
            for message in messages:
                if message.id in before:
                    continue
                try:
                    self.enqueue(message, queue, insert=True)
                except DeliveryFailed as exc:
                    refused.append((message, exc))
            return refused
        now = self.now_ms
        expiries = queue_expiries_ms(
            [m.expires_at_ms for m in messages],
            enqueued_at_ms=now,
            queue_ttl_ms=args.message_ttl_ms,
        )
        one_by_one = [
            is_expired(expires, now) or not is_plain(message)
            for message, expires in zip(messages, expiries, strict=True)
        ]
        looked_up = [m.id for m, one in zip(messages, one_by_one, strict=True) if one]
        before = self.released_before(looked_up) if looked_up else set()
        plain = self._plain.setdefault(queue, [])
        for message, expires, one in zip(messages, expiries, one_by_one, strict=True):
            if one:
                if message.id not in before:
                    self.enqueue(message, queue, insert=True)  # the queue takes it: cannot refuse
                # Dead-lettering flushes what was gathered: gather anew from here on.
                plain = self._plain.setdefault(queue, [])
                continue
            self.filled.add(queue)
            seq = self.seq.next()
            self._ready(message, queue, expires)
            plain.append(
                (
                    message.id,
                    message.body,
                    message.sent_at_ms,
                    message.deliver_at_ms,
                    seq,
                    message.expires_at_ms,
                    expires,
                    message.message_id,
                    dedupe_key(message),
                    message.correlation_id,
                )
            )
            self.emit("released", message, queue)
        return refused

    def enqueue_columns(self, due: DueColumns) -> bool:
        """``enqueue_many`` of plain due messages, each into the queue it is for, written from
        the columns (``plain_release``) and told as runs (``runs``): no ``Message`` is made.
        False, with nothing done, when some queue needs the general path (``enqueue_many``
        of the messages): one missing, put-disabled or with a length limit, or a message that
        expires on arrival."""
        released = plain_release(due, self.catalog, now_ms=self.now_ms, seq=self.seq)
        if released is None:
            return False
        for ready, rows in released:
            self._plain.setdefault(ready.queue, []).extend(rows)
            self.filled.add(ready.queue)
            self.runs.append(EventRun("released", ready, ready.now_ms, ready.queue))
        return True

    def _ready(self, message: Message, queue: str, expires: int | None) -> None:
        """What entering ``queue`` now sets on a message (``enqueue``, ``enqueue_many``)."""
        message.state = MessageState.READY
        message.queue = queue
        message.enqueued_at_ms = message.updated_at_ms = self.now_ms
        message.queue_expires_at_ms = expires

    def released_before(self, message_ids: Sequence[str]) -> set[str]:
        """Separate queue database: which of these ids are already here (released before a
        crash that came ahead of the store's marker)? Releasing those again must do nothing."""
        self.flush()
        return {message_id for message_id, _ in seqs_of(self.conn, message_ids)}

    def flush(self) -> None:
        """Write the rows ``enqueue(insert=True)`` and ``enqueue_many`` gathered. A plain row
        whose id is here already is not written by its INSERT (rare: only after a crash, so a
        release looks nothing up first); those messages are then left out, with their events.
        Plain rows alone need no savepoint: what the INSERT left out is found by ``seq``."""
        if not self._rows and not self._plain:
            return
        rows, self._rows = self._rows, []
        plain, self._plain = self._plain, {}
        conn, now = self.conn, self.now_ms
        if not rows:
            plain, before = write_plain_rows(conn, plain, now)
            remember(conn, self._left_out(plain, before) if before else plain, now)
            return
        conn.execute("SAVEPOINT flush")
        try:
            # Again while some id is found taken: on PostgreSQL another node may have written
            # one since the look-up (each round leaves out at least one message, or writes
            # one without its key).
            while not write_gathered(conn, rows, plain, now):
                conn.execute("ROLLBACK TO flush")
                before = self.released_before([r[0] for p in plain.values() for r in p])
                held = keys_held_elsewhere(conn, plain)
                left_out_why(before, held)
                plain = self._left_out(unkeyed(plain, held), before)
        finally:
            conn.execute("RELEASE flush")
        remember(conn, plain, now)

    def _left_out(self, plain: Plain, before: set[str]) -> Plain:
        """``plain`` without the messages released before (and without their events)."""
        self.events = [e for e in self.events if e[0] != "released" or e[1].id not in before]
        self.runs = [
            EventRun(run.event, run.messages.without(before), run.time_ms, run.queue)
            if isinstance(run.messages, ReadyColumns)
            else run
            for run in self.runs
        ]
        return without(plain, before)

    def adopt(self, message: Message) -> bool:
        """Separate queue database: take in a scheduled message as a row keyed by its tarry id
        (to end it here, e.g. dead-letter it). False when that id is already here."""
        if self.released_before([message.id]):
            return False
        self._insert(message)
        return True

    def _insert(
        self, message: Message, *, seq: int | None = None, visible_at_ms: int | None = None
    ) -> None:
        self.flush()
        insert = to_insert(message, seq=seq, visible_at_ms=visible_at_ms)
        write_row(self.conn, message, insert, seq=seq, visible_at_ms=visible_at_ms)

    def insert_and_enqueue(self, message: Message, queue: str) -> None:
        """A message tarry makes itself (dead-letter copy, report) enters ``queue``."""
        self.flush()
        self.conn.execute(*to_insert(message, dedupe=False))
        self.enqueue(message, queue)

    def ready_count(self, queue: str) -> int:
        self.flush()
        self._claims_written()
        args = self._takeable_args(queue, unexpired=False)
        return sum(
            int(
                self.conn.execute(
                    f"SELECT count(*) FROM messages WHERE {_takeable_in(state, unexpired=False)}",
                    args,
                ).fetchone()[0]
            )
            for state in QUEUED_STATES
        )

    def _takeable_args(self, queue: str, *, unexpired: bool) -> tuple[str | int, ...]:
        return (queue, self.now_ms, self.now_ms) if unexpired else (queue, self.now_ms)

    def _takeable(self, queue: str, limit: int, *, unexpired: bool) -> tuple[list[Any], bool]:
        """The first ``limit`` rows (``SELECT_SQL``'s columns, then the row key) of ``queue`` a
        consumer may take now, in queue order, rows locked: ready ones and in-flight ones whose
        visibility timeout ended (usually none: that condition finds nothing in the in-flight
        index's range); and whether more may be takeable (``takeable_rows``)."""
        self.flush()
        # A receive steps over rows claimed (``pending_receives``), unless they are many;
        # dropping a queue's head must not take a row a consumer holds.
        claims = self.conn.pending_receives
        claimed = claims.claimed_in(queue) if claims and unexpired else set()
        if claims and (not unexpired or len(claimed) > _MAX_STEPPED_OVER):
            self._claims_written()
            claimed = set()
        return takeable_rows(
            self.conn,
            _takeable_in("ready", unexpired=unexpired),
            _takeable_in("delivered", unexpired=unexpired),
            self._takeable_args(queue, unexpired=unexpired),
            limit,
            skip=claimed,
        )

    def _claims_written(self) -> None:
        """Write the receives' unwritten claims (``pending_receives``) before reading the
        state of queued rows."""
        claims = self.conn.pending_receives
        if claims:
            claims.write_all(self.conn)

    def _drop_head(self, queue: str, count: int) -> None:
        for row in self._takeable(queue, count, unexpired=False)[0]:
            self.dead_letter(from_row(row[:-1]), from_queue=queue, reason=DeathReason.MAXLEN)

    # --- leaving ----------------------------------------------------------------------------------
    def dead_letter(
        self,
        message: Message,
        *,
        from_queue: str | None,
        reason: DeathReason,
        error: str | None = None,
    ) -> None:
        """End ``message`` here: move a copy to the dead-letter target (the queue's
        ``dead_letter_to``, or the error queue for delivery failures) or, with no target, drop it;
        send the reports it asked for."""
        self.flush()
        now = self.now_ms
        if reason is DeathReason.DELIVERY_FAILED:
            target = None if message.on_undeliverable is Undeliverable.DISCARD else self.error_queue
        else:
            args = self.catalog.effective(from_queue) if from_queue else None
            target = args.dead_letter_to if args else None
        died_in = from_queue or message.destination
        deaths = record_death(
            message.deaths,
            reason=reason,
            queue=died_in,
            now_ms=now,
            destination=message.destination,
        )
        copied = False
        if target is not None and target in self.catalog.queues and not would_cycle(deaths, target):
            headers = dict(message.headers)
            headers.setdefault("tarry-original-id", message.id)
            headers["tarry-death-reason"] = reason.value
            if error:
                headers["tarry-failure"] = error[:1000]
            copy = replace(
                message,
                id=self.ids.new(now),
                destination=target,
                headers=headers,
                state=MessageState.SCHEDULED,
                deliver_at_ms=now,
                # RabbitMQ removes the per-message expiration on dead-lettering.
                expires_at_ms=None,
                deaths=deaths,
                topic=None,
                queue=None,
                enqueued_at_ms=None,
                queue_expires_at_ms=None,
                redelivered=False,
                delivery_count=0,
                failures=0,
                report=frozenset(),
                updated_at_ms=now,
            )
            self.insert_and_enqueue(copy, target)
            copied = True
        final = (
            MessageState.EXPIRED
            if reason is DeathReason.EXPIRED and not copied
            else MessageState.DEAD_LETTERED
        )
        self.conn.execute(
            "UPDATE messages SET state = ?, body = NULL, receipt = NULL, deaths = ?, "
            "last_error = coalesce(?, last_error), updated_at_ms = ? "
            f"WHERE {id_column(self.conn)} = ?",
            (
                final.value,
                orjson.dumps([d.to_dict() for d in deaths]).decode(),
                error,
                now,
                id_key(self.conn, message.id),
            ),
        )
        message.state, message.deaths, message.updated_at_ms = final, deaths, now
        self.emit(final.value, message, from_queue, reason.value)
        if reason is DeathReason.EXPIRED and Report.EXPIRATION in message.report:
            self._report(message, "expiration", reason.value)
        if reason is DeathReason.DELIVERY_FAILED and Report.EXCEPTION in message.report:
            self._report(message, "exception", error or reason.value)

    def _report(self, original: Message, kind: str, detail: str) -> None:
        """A report to ``reply_to``, when that is a queue (``model.reports``)."""
        if original.reply_to is None or original.reply_to not in self.catalog.queues:
            return
        report = report_message(
            original, kind, detail, id=self.ids.new(self.now_ms), now_ms=self.now_ms
        )
        self.insert_and_enqueue(report, original.reply_to)

    # --- consumers --------------------------------------------------------------------------------
    def has_ready(self, queue: str) -> bool:
        """Whether ``receive`` would find anything (a read: no commit for an empty poll)."""
        self.flush()
        args = self._takeable_args(queue, unexpired=True)
        return any(
            self.conn.execute(
                f"SELECT 1 FROM messages WHERE {_takeable_in(state, unexpired=True)} LIMIT 1",
                args,
            ).fetchone()
            is not None
            for state in QUEUED_STATES
        )

    def has_expired(self) -> bool:
        self.flush()
        now = self.now_ms
        return (
            self.conn.execute(
                "SELECT 1 FROM messages WHERE state IN ('ready', 'delivered') "
                "AND queue_expires_at_ms <= ? AND visible_at_ms <= ? LIMIT 1",
                (now, now),
            ).fetchone()
            is not None
        )

    def receive(self, queue: str, *, max_messages: int, visibility_ms: int) -> ReceivedRows:
        """Take up to ``max_messages`` of ``queue`` for a consumer, in queue order: one read of
        the rows, then one UPDATE of them all by row key. A row's receipt is this call's id and
        the row's key (``queues.receipts``), so no id is made per row. Whether it left any
        takeable is ``ReceivedRows.more``: a receive that took exactly what it asked for may
        have emptied the queue."""
        now = self.now_ms
        rows, more = self._takeable(queue, max_messages, unexpired=True)
        if not rows:
            return ReceivedRows([], [], now)
        prefix = self.ids.new(now)
        keys = [row[-1] for row in rows]
        claims = self.conn.pending_receives
        # Kept as a claim (written later, or never: an ack soon writes the rows acked in one
        # go) where every row is ready in the table; a row taken again after its visibility
        # timeout (in flight there) is written at once.
        if visibility_ms < MIN_VISIBILITY_MS or any(row[_STATE] != "ready" for row in rows):
            claims = None
        if claims is None:
            where, args = in_list(self.conn, row_key(self.conn), keys)
            self.conn.execute(
                received_sql(row_key(self.conn), where), [prefix, now + visibility_ms, now, *args]
            )
        taken = hand_out(self.conn, rows, prefix, now)
        taken.more = more
        if claims is not None:
            claims.claim(prefix, queue, keys, visible_at_ms=now + visibility_ms, received_at_ms=now)
        self.runs.append(EventRun("received", taken.messages, now, queue))
        return taken

    def settle(
        self, queue: str, receipts: Sequence[str], *, ack: bool, requeue: bool
    ) -> tuple[int, list[str]]:
        """Ack, requeue, or reject (dead-letter ``rejected``) in-flight messages by receipt.
        Acks are written together: one UPDATE per chunk of rows, found by their row key."""
        self.flush()
        now = self.now_ms
        in_order, settled, unknown = settled_by_receipt(
            self.conn, queue, receipts, ack=ack, now_ms=now
        )
        if ack:
            write_acked(self.conn, list(settled), now)
            self.runs.append(EventRun("acked", in_order, now, queue))
            return len(in_order), unknown
        key = row_key(self.conn)
        for row, message in settled.items():
            if requeue:
                # Back to its old place; it keeps its original expiry.
                self.conn.execute(
                    "UPDATE messages SET state = 'ready', receipt = NULL, visible_at_ms = ?, "
                    f"redelivered = 1, updated_at_ms = ? WHERE {key} = ?",
                    (now, now, row),
                )
                message.state = MessageState.READY
                self.filled.add(queue)
                self.emit("nacked", message, queue, "requeued")
            else:
                self.dead_letter(message, from_queue=queue, reason=DeathReason.REJECTED)
        return len(settled), unknown

    def sweep_expired(self, *, limit: int = 1000) -> int:
        """Dead-letter (or drop) messages whose queue expiry has come and that no consumer holds."""
        self.flush()
        now = self.now_ms
        rows = self.conn.execute(
            f"{SELECT_SQL} WHERE state IN ('ready', 'delivered') AND queue_expires_at_ms <= ? "
            "AND visible_at_ms <= ? ORDER BY queue_expires_at_ms LIMIT ?"
            + row_lock(self.conn, skip_locked=True),
            (now, now, limit),
        ).fetchall()
        for row in rows:
            message = from_row(row)
            self.dead_letter(message, from_queue=message.queue, reason=DeathReason.EXPIRED)
        return len(rows)

    def expire_queue_contents(self, queue: str) -> int:
        """A deleted queue's messages are dropped, not dead-lettered (RabbitMQ)."""
        self.flush()
        rows = []
        for state in QUEUED_STATES:
            rows += self.conn.execute(
                f"{SELECT_SQL} WHERE queue = ? AND state = '{state}'{row_lock(self.conn)}",
                (queue,),
            ).fetchall()
            self.conn.execute(
                "UPDATE messages SET state = 'expired', body = NULL, receipt = NULL, "
                f"updated_at_ms = ? WHERE queue = ? AND state = '{state}'",
                (self.now_ms, queue),
            )
        for row in rows:
            message = from_row(row)
            message.state = MessageState.EXPIRED
            self.emit("expired", message, queue, "queue_deleted")
        return len(rows)
