"""Recurring schedules at run time: kept in the catalog database (``queues.schedule_rows``),
their occurrences stored ahead as ordinary scheduled messages through the send path, so cancel,
list, TTL and dead-lettering apply to each.

Exactly once. Each occurrence is sent with ``message_id`` ``sched:{name}:{epoch ms}``, and the
store keeps one message per (destination, ``message_id``): while it waits, while it sits in its
queue, and for ``server.retention_ms`` after it finished. A top-up is: take the schedule's lease
(one node at a time; another node takes over when it lapses), send the occurrences, then record
how far they are stored (``planned_through_ms``), naming the lease and the revision. A node that
dies between the send and the record leaves occurrences stored but not recorded; whoever tops up
next (the restarted node, or another after ``lease_ms``) sends them again and the store answers
with the kept message: nothing twice, nothing lost, as long as ``retention_ms`` outlasts
``lease_ms`` (a day against 30 s by default). Two nodes that still overlap (a stalled node
waking after its lease lapsed) cannot both insert: the de-duplication key is unique, and the
loser's batch fails and is retried.

A schedule replaced or deleted cancels the occurrences it had stored. Their ``message_id``s stay
taken (a cancelled message keeps its key for ``retention_ms``), so an occurrence of the new
revision at the same time and destination is sent as ``sched:{name}:{epoch ms}:{revision}``.

Catch-up. When a node starts, occurrences stored ahead that are more than ``late_after_ms``
overdue fell while no node ran: ``skip`` cancels them, ``once`` keeps the latest. Occurrences
that were never stored that long after their time (the store was down longer than the horizon)
are dropped by ``skip``; ``once`` stores the latest of them, due now (``model.schedule``).
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from tarry.config import ScheduleConfig
from tarry.engine.types import MayAccess, SendResult
from tarry.errors import NotCancellable, NotFound, TarryError
from tarry.model.ids import id_time_ms
from tarry.model.message import Message, SendPlan
from tarry.model.query import MessageQuery
from tarry.model.schedule import (
    CatchUp,
    Occurrence,
    Schedule,
    TopUp,
    check_has_future,
    correlation_id,
    occurrence_message_id,
    parse_schedule,
    plan_top_up,
)
from tarry.model.time import Clock
from tarry.queues.schedule_rows import (
    ScheduleRow,
    advance,
    delete_schedule,
    read_schedule,
    read_schedules,
    save_schedule,
    take_lease,
)
from tarry.store.base import QueueDatabase

__all__ = ["Schedules"]

log = logging.getLogger(__name__)

SendMany = Callable[[Sequence[Mapping[str, Any]]], Awaitable[Sequence[SendResult | TarryError]]]
CheckMany = Callable[
    [Sequence[Mapping[str, Any]], MayAccess | None], Awaitable[list[SendPlan | TarryError]]
]
ListMessages = Callable[[MessageQuery], Awaitable[tuple[list[Message], str | None]]]
Cancel = Callable[[str], Awaitable[Message]]

#: How many occurrences a schedule's answer lists.
SHOWN_NEXT = 5


class Schedules:
    """The schedules of one node. It needs only the send path, listing and cancelling of
    messages, and the catalog database."""

    def __init__(
        self,
        *,
        config: ScheduleConfig,
        clock: Clock,
        qdb: QueueDatabase,
        node: str,
        send_many: SendMany,
        check_many: CheckMany,
        list_messages: ListMessages,
        cancel: Cancel,
    ) -> None:
        self.config = config
        self.clock = clock
        self.qdb = qdb
        self.node = node
        self._send_many = send_many
        self._check_many = check_many
        self._list = list_messages
        self._cancel = cancel

    # --- the API ------------------------------------------------------------------------------
    async def put(
        self, name: str, data: Mapping[str, Any], *, may_send: MayAccess | None = None
    ) -> tuple[dict[str, Any], bool]:
        """Create or replace schedule ``name`` (True when created); an equal definition changes
        nothing. Raises ``invalid_argument`` (cron, zone, fields) and whatever the send rules
        refuse for its message (``unknown_destination``, ``not_authorized``, ...)."""
        schedule = parse_schedule(name, data)
        now = self.clock.now_ms()
        check_has_future(schedule, now_ms=now)
        first = next(schedule.occurrences_after(now))
        sample = schedule.occurrence_send(Occurrence(first, first), now_ms=now)
        [checked] = await self._check_many([sample], may_send)
        if isinstance(checked, TarryError):
            raise checked
        definition = schedule.to_dict()
        before, row = await self.qdb.write(
            lambda conn: save_schedule(conn, name, definition, now_ms=now), durable=True
        )
        if before is not None and before.revision_ms != row.revision_ms:
            await self._cancel_stored(before, made_before_ms=row.revision_ms)
        if before is None or before.revision_ms != row.revision_ms:
            await self._top_up(row)
        return await self.get(name), before is None

    async def get(self, name: str) -> dict[str, Any]:
        row = await self.qdb.read(lambda conn: read_schedule(conn, name))
        if row is None:
            raise NotFound(f"no schedule named {name!r}; GET /v1/schedules lists them")
        return self._public(row)

    async def list(self) -> builtins.list[dict[str, Any]]:
        rows = await self.qdb.read(read_schedules)
        return [self._public(row) for row in rows]

    async def delete(self, name: str) -> dict[str, Any]:
        """Delete schedule ``name`` and cancel the occurrences it had stored."""
        row = await self.qdb.write(lambda conn: delete_schedule(conn, name), durable=True)
        if row is None:
            raise NotFound(f"no schedule named {name!r}; GET /v1/schedules lists them")
        cancelled = await self._cancel_stored(row, made_before_ms=None)
        return {"name": name, "deleted": True, "cancelled": cancelled}

    def _public(self, row: ScheduleRow) -> dict[str, Any]:
        schedule = parse_schedule(row.name, row.definition)
        now = self.clock.now_ms()
        upcoming = schedule.next_occurrences(now, SHOWN_NEXT) if not row.finished else []
        return {
            "name": row.name,
            **row.definition,
            "created_at": row.created_at_ms,
            "revision": row.revision_ms,
            "planned_through": row.planned_through_ms,
            "finished": row.finished,
            "last_error": row.last_error,
            "next": [
                {
                    "at": at,
                    "local": schedule.local_time(at),
                    "message_id": occurrence_message_id(row.name, at),
                }
                for at in upcoming
            ],
        }

    # --- topping up ---------------------------------------------------------------------------
    async def start(self) -> None:
        """At node start, before the dispatcher runs: apply each schedule's catch-up policy to
        occurrences stored ahead that are long overdue (they fell while no node ran), then top
        up at once (what fell due during a short stop is stored before it counts as missed)."""
        now = self.clock.now_ms()
        for row in await self.qdb.read(read_schedules):
            if row.finished:
                continue
            try:
                schedule = parse_schedule(row.name, row.definition)
                await self._settle_overdue(schedule, self._plan(schedule, row, now), now)
            except TarryError as exc:
                log.warning("schedule %s: catch-up after start failed: %s", row.name, exc)
        try:
            await self.top_up_due()
        except TarryError as exc:
            log.warning("schedules: top-up at start failed (retrying): %s", exc)

    async def run(self) -> None:
        """Top up every schedule that needs it, every ``interval_ms``."""
        while True:
            await asyncio.sleep(self.config.interval_ms / 1000)
            try:
                await self.top_up_due()
            except TarryError as exc:
                log.warning("schedules: top-up failed (retrying): %s", exc)

    async def top_up_due(self) -> int:
        """One round: every schedule whose stored occurrences end within the horizon; returns
        how many were topped up by this node."""
        horizon = self.clock.now_ms() + self.config.horizon_ms
        rows = await self.qdb.read(lambda conn: read_schedules(conn, due_by_ms=horizon))
        done = 0
        for row in rows:
            try:
                done += await self._top_up(row)
            except TarryError as exc:  # one schedule's trouble does not hold up the others
                log.warning("schedule %s: top-up failed (retrying): %s", row.name, exc)
        return done

    def _plan(self, schedule: Schedule, row: ScheduleRow, now: int) -> TopUp:
        return plan_top_up(
            schedule,
            planned_through_ms=row.planned_through_ms,
            now_ms=now,
            horizon_ms=self.config.horizon_ms,
            max_ahead=self.config.max_ahead,
            late_after_ms=self.config.late_after_ms,
        )

    async def _top_up(self, row: ScheduleRow) -> bool:
        now = self.clock.now_ms()
        schedule = parse_schedule(row.name, row.definition)
        plan = self._plan(schedule, row, now)
        if not plan.occurrences and not plan.missed and not plan.finished:
            return False  # as much is stored ahead as may be
        until = now + self.config.lease_ms
        taken = await self.qdb.write(
            lambda conn: take_lease(conn, row, node=self.node, now_ms=now, until_ms=until)
        )
        if not taken:
            return False  # another node tops it up
        if plan.missed:
            await self._settle_overdue(schedule, plan, now)
        stored_through, error, created = await self._store(schedule, row, plan, now)
        through = plan.planned_through_ms if error is None else stored_through
        outcome = await self.qdb.write(
            lambda conn: advance(
                conn,
                row,
                node=self.node,
                planned_through_ms=through,
                finished=plan.finished and error is None,
                last_error=error,
            ),
            durable=True,
        )
        if outcome == "gone":  # deleted or replaced while we stored: take ours back
            for message_id in created:
                await self._cancel_quietly(message_id)
        if error is not None:
            log.warning("schedule %s: %s (retrying)", row.name, error)
        return True

    async def _store(
        self, schedule: Schedule, row: ScheduleRow, plan: TopUp, now: int
    ) -> tuple[int, str | None, builtins.list[str]]:
        """Send ``plan``'s occurrences; returns how far they are stored without a gap, the
        first refusal (None: all stored), and the ids of the messages made now."""
        through, created = row.planned_through_ms, builtins.list[str]()
        if not plan.occurrences:
            return through, None, created
        sends = [schedule.occurrence_send(o, now_ms=now) for o in plan.occurrences]
        results = await self._send_many(sends)
        for occurrence, send, result in zip(plan.occurrences, sends, results, strict=True):
            if (
                not isinstance(result, TarryError)
                and not result.created
                and result.state == "cancelled"
                and id_time_ms(result.id) < row.revision_ms
            ):
                # The key is held by an earlier revision's cancelled occurrence.
                key = f"{send['message_id']}:{row.revision_ms}"
                [result] = await self._send_many([{**send, "message_id": key}])
            if isinstance(result, TarryError):
                return through, f"{result.code}: {result.message}", created
            if result.created:
                created.append(result.id)
            through = max(through, occurrence.at_ms)
        return through, None, created

    async def _settle_overdue(self, schedule: Schedule, plan: TopUp, now: int) -> None:
        overdue = await self._stored(schedule.name, due_before_ms=now - self.config.late_after_ms)
        if not overdue:
            return
        keep: Message | None = None
        stores_one = plan.missed and schedule.catch_up is CatchUp.ONCE
        if schedule.catch_up is CatchUp.ONCE and not stores_one:
            keep = max(overdue, key=lambda m: (m.deliver_at_ms, m.id))
        for message in overdue:
            if keep is None or message.id != keep.id:
                await self._cancel_quietly(message.id)
        log.info(
            "schedule %s: %d occurrence(s) missed while tarry was down, catch_up=%s",
            schedule.name,
            len(overdue),
            schedule.catch_up.value,
        )

    async def _stored(
        self, name: str, *, due_before_ms: int | None = None
    ) -> builtins.list[Message]:
        """The occurrences of schedule ``name`` still waiting in the store."""
        found: builtins.list[Message] = []
        cursor = None
        while True:
            query = MessageQuery(
                correlation_id=correlation_id(name),
                state="scheduled",
                due_before_ms=due_before_ms,
                limit=1000,
                cursor=cursor,
            )
            page, cursor = await self._list(query)
            found += [m for m in page if (m.message_id or "").startswith(f"sched:{name}:")]
            if cursor is None:
                return found

    async def _cancel_stored(self, row: ScheduleRow, *, made_before_ms: int | None) -> int:
        """Cancel what ``row``'s revisions stored: nothing of it is due after its planned
        time, so the listing reads no further (the log store reads partitions in due order)."""
        cancelled = 0
        last = max(row.planned_through_ms, self.clock.now_ms()) + 1
        for message in await self._stored(row.name, due_before_ms=last):
            if made_before_ms is None or id_time_ms(message.id) < made_before_ms:
                cancelled += await self._cancel_quietly(message.id)
        return cancelled

    async def _cancel_quietly(self, message_id: str) -> int:
        """Cancel one stored occurrence; one already on its way (or gone) is left to go."""
        try:
            await self._cancel(message_id)
            return 1
        except (NotCancellable, NotFound):
            return 0
