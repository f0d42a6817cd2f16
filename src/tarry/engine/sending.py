"""Accepting sends: one or a batch checked column-wise (``BatchCheck``), fanned out to their
queues, handed to RabbitMQ where a route does the waiting, kept durably, released at once when
not delayed, and answered one result per send. ``Engine.send`` and ``Engine.send_batch`` call
``Sender.send_many``: the HTTP API and the AMQP ingress go through them (the pipeline's HTTP
sink over HTTP; its offline sink writes the log store's segment files with the same rules,
``pipeline/sink_log``).

Two paths after the syntax check: a batch of plain sends to local queues, all delayed, is kept
as columns where the store takes them (``ColumnStore``, the log store) and answered from the
columns (``_keep_plain``: no request, plan, message, outcome or result object per send, the
answers a ``ColumnResults``); everything else goes the general way, a ``Message`` per copy
(fan-out, hand-over to routes, de-duplication, immediate release).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from tarry.dispatch.breaker import Breakers
from tarry.dispatch.lag import ReleaseLag
from tarry.engine import queue_admin, release
from tarry.engine.context import EngineContext
from tarry.engine.handover import hand_over
from tarry.engine.release_path import ReleasePath
from tarry.engine.types import ColumnResults, MayAccess, SendResult
from tarry.errors import TarryError, Unavailable
from tarry.model.accepted import AcceptedColumns
from tarry.model.batch import BatchCheck
from tarry.model.events import EventRun
from tarry.model.fanout import fan_out_many
from tarry.model.ids import IdGenerator
from tarry.model.message import Message, SendPlan
from tarry.model.query import MessageQuery
from tarry.model.queue_args import Overflow
from tarry.model.rules import due_soon
from tarry.model.state import MessageState
from tarry.model.validate import DestinationView, SendLimits, TargetView
from tarry.queues.lag import refusal_limit_ms
from tarry.store.base import ColumnStore, StoreOutcome
from tarry.store.sqlite.rows import kept_by_dedupe_key, queue_dedupe_key

__all__ = ["Sender"]


#: Longest a send waits for the dispatcher's round while due messages wait (releases first).
YIELD_MAX_MS = 50
#: A send batch this big or bigger lets the event loop run between its steps (``_pause``).
PAUSE_MIN = 100
#: Each state's text: an enum's ``.value`` is a Python-level descriptor call, once per send.
_STATE_TEXT = {state: state.value for state in MessageState}


async def _pause(items: int) -> None:
    """Between the CPU-heavy steps of a big send batch (a few ms each at 500 sends), let what
    fell due meanwhile run first: the dispatcher's timer, finished database work, consumers.
    A timer, not ``sleep(0)``: a task that sleeps 0 is queued again ahead of the timers and
    I/O callbacks the loop collects next, so it would run its next step before them."""
    if items >= PAUSE_MIN:
        await asyncio.sleep(1e-6)


@dataclass(slots=True)
class Sender:
    """What a send needs besides the engine's context: its release path (``keep_sends``), the
    ids, the dispatcher's release lag, the store's breaker and probe, and the message listing
    (``hand_over`` looks in it for a route's duplicates)."""

    ctx: EngineContext
    path: ReleasePath
    ids: IdGenerator
    lag: ReleaseLag
    breakers: Breakers
    probe: Callable[[], Awaitable[bool]]
    find: Callable[[MessageQuery], Awaitable[tuple[list[Message], str | None]]]
    limits: SendLimits = field(init=False)
    #: The store, where it keeps plain sends as columns (picked once: ``_keep_plain``).
    _columns: ColumnStore | None = field(init=False)

    def __post_init__(self) -> None:
        self.limits = SendLimits(max_message_bytes=self.ctx.config.server.max_message_bytes)
        store = self.ctx.store
        # A store sharing the queue database keeps sends in the engine's queue transaction.
        self._columns = store if isinstance(store, ColumnStore) and not self.ctx.shared else None

    async def send_one(
        self, data: Mapping[str, Any], may_send: MayAccess | None, *, internal: bool = False
    ) -> SendResult:
        """One send (``send_many``), its refusal raised."""
        result = (await self.send_many([data], may_send, internal=internal))[0]
        if isinstance(result, TarryError):
            raise result
        return result

    async def report_failure(self, request: dict[str, Any]) -> None:
        """A route's failure report, sent as tarry itself (the route's settings were authorised
        to name its destination when they were given)."""
        await self.send_one(request, None, internal=True)

    async def check_many(
        self, items: Sequence[Mapping[str, Any]], may_send: MayAccess | None
    ) -> list[SendPlan | TarryError]:
        """Every send rule applied to ``items`` as ``send_many`` would for tarry's own sends
        (no overload refusal), storing nothing: a schedule checks the message its occurrences
        will be before it is kept."""
        return (await self._plan(items, may_send, self.ctx.clock.now_ms(), internal=True))[0]

    async def _plan(
        self,
        items: Sequence[Mapping[str, Any]],
        may_send: MayAccess | None,
        now: int,
        *,
        internal: bool = False,
    ) -> tuple[list[SendPlan | TarryError], dict[str, DestinationView]]:
        checking, views, failed, may = await self._look_up(items, may_send, internal=internal)
        return self._validate(checking, views, failed, may, now), views

    async def _look_up(
        self, items: Sequence[Mapping[str, Any]], may_send: MayAccess | None, *, internal: bool
    ) -> tuple[BatchCheck, dict[str, DestinationView], dict[str, TarryError], MayAccess]:
        """The syntax of ``items`` checked, and what the other rules need of each destination
        they name (declared first where ``auto_declare`` says so); the destinations whose
        look-up failed, with why (their sends are refused with it); and the token's check,
        asking it once a name."""
        checking = BatchCheck(items)
        may = _asked_once(may_send)
        views: dict[str, DestinationView] = {}
        failed: dict[str, TarryError] = {}  # an auto-declare that failed refuses its sends
        for name in checking.destinations():
            try:
                if (
                    may(name)
                    and self.ctx.catalog.kind(name) is None
                    and name not in self.ctx.transports
                    and self.ctx.config.server.auto_declare
                ):
                    await queue_admin.declare_queue(self.ctx, name, {})
                views[name] = await self._view(name, lag=not internal)
            except TarryError as exc:
                failed[name] = exc
        return checking, views, failed, may

    def _validate(
        self,
        checking: BatchCheck,
        views: dict[str, DestinationView],
        failed: dict[str, TarryError],
        may: MayAccess,
        now: int,
    ) -> list[SendPlan | TarryError]:
        planned = checking.validate(now_ms=now, views=views, may_send=may, limits=self.limits)
        if failed:
            for index, named in enumerate(checking.row_destinations()):
                if named is not None and named in failed:
                    planned[index] = failed[named]
        return planned

    async def send_many(
        self,
        items: Sequence[Mapping[str, Any]],
        may_send: MayAccess | None,
        *,
        internal: bool = False,
    ) -> Sequence[SendResult | TarryError]:
        """``internal``: tarry's own sends (a schedule's occurrences, a route's failure report),
        which no overload refuses: they are work already taken on, not new intake."""
        # Releases first: refuse new work while releases are too far behind (nothing stored),
        # and let the dispatcher's next round go ahead of this send while due messages wait.
        lag = self.lag
        if not internal:
            lag.refuse_if_behind(self.ctx.config.dispatch.overload_lag_ms)
            # Sends whose queues' consumers are behind are refused (a send rule); a request of
            # nothing else is refused whole here, before the work of checking it.
            self.ctx.waiters.lag.refuse_if_all_behind(
                (_soon_destination(item) for item in items),
                refusal_limit_ms(self.ctx.config.dispatch.overload_lag_ms),
                queues_of=lambda name: self.ctx.catalog.topics.get(name) or (name,),
                may_send=may_send,
            )
        await lag.yield_to_releases(at_most_ms=YIELD_MAX_MS)
        now = self.ctx.clock.now_ms()
        checking, views, failed, may = await self._look_up(items, may_send, internal=internal)
        plain, store = None, self._columns
        if store is not None and not failed and not self.breakers.store.is_open:
            plain = self._plain(checking, views, may, now)
        await _pause(len(items))
        if plain is not None and store is not None:
            answered = await self._keep_plain(store, *plain, now)
            if answered is not None:
                return answered
            # A message_id of the batch names a message kept already: the general path
            # answers which sends repeat one.
        planned = self._validate(checking, views, failed, may, now)
        results: list[SendResult | TarryError | None] = [
            p if isinstance(p, TarryError) else None for p in planned
        ]
        plans = [(index, plan) for index, plan in enumerate(planned) if isinstance(plan, SendPlan)]
        copies = fan_out_many([(p, views[p.request.destination]) for _, p in plans], self.ids)
        accepted: list[tuple[int, SendPlan, list[Message]]] = [
            (index, plan, messages) for (index, plan), messages in zip(plans, copies, strict=True)
        ]
        await _pause(len(items))
        if accepted:
            if self.breakers.store.is_open and not await self.probe():
                why = self.breakers.store.last_error or "it failed to write"
                error = Unavailable(
                    f"the store cannot take writes now ({why}); nothing was stored, retry later"
                )
                for index, _, _ in accepted:
                    results[index] = error
                return [r for r in results if r is not None]
            # Routes where RabbitMQ does the waiting get the message now (engine/handover.py).
            accepted = await hand_over(
                accepted, results, transports=self.ctx.transports, find=self.find
            )
        if accepted:
            try:
                txn, kept = await self.path.keep_sends(accepted, now)
            except TarryError as exc:
                self.breakers.store.failure(exc)
                for index, _, _ in accepted:
                    results[index] = exc
                return [r for r in results if r is not None]
            self.breakers.store.success()
            scheduled, earliest = self._answer(accepted, kept, results, views, now)
            self.ctx.emit(EventRun("scheduled", scheduled, now))
            self.ctx.waiters.lag.accepted(scheduled, now)
            if txn is not None:
                self.ctx.after(txn)
            if earliest is not None:
                self.ctx.due(earliest, now)  # this dispatcher's, and the other nodes'
        return [r for r in results if r is not None]

    def _plain(
        self,
        checking: BatchCheck,
        views: Mapping[str, DestinationView],
        may: MayAccess,
        now: int,
    ) -> tuple[list[TarryError | None], AcceptedColumns] | None:
        """The batch's verdicts as columns when every send is plain and goes to a local queue
        (``BatchCheck.plain``); None: the general path answers it."""
        if not all(view.kind == "queue" for view in views.values()):
            return None  # a topic's copies, a route's hand-over, an unknown name's refusal
        return checking.plain(
            now_ms=now, views=views, ids=self.ids, may_send=may, limits=self.limits
        )

    async def _keep_plain(
        self,
        store: ColumnStore,
        errors: list[TarryError | None],
        accepted: AcceptedColumns,
        now: int,
    ) -> Sequence[SendResult | TarryError] | None:
        """Keep plain sends as columns and answer them from the columns: each is one message
        to its queue, created, scheduled (delayed: nothing is released at once), so the
        general path's steps after validation come down to these. None, with nothing kept,
        when a ``message_id`` names a message kept already (released into its queue, or in
        the store)."""
        if not len(accepted):
            return cast(list[SendResult | TarryError], errors)
        try:
            if accepted.message_id is not None and await self._released_keys(accepted):
                return None
            if not await store.store_columns(accepted):
                return None
        except TarryError as exc:
            self.breakers.store.failure(exc)
            for row in accepted.rows:
                errors[row] = exc
            return cast(list[SendResult | TarryError], errors)
        self.breakers.store.success()
        self.ctx.emit(EventRun("scheduled", accepted.messages(), now))
        self.ctx.waiters.lag.accepted_due(accepted.destination, accepted.deliver_at_ms, now)
        self.ctx.due(int(accepted.deliver_at_ms.min()), now)
        return ColumnResults(errors, accepted, _STATE_TEXT[MessageState.SCHEDULED])

    async def _released_keys(self, accepted: AcceptedColumns) -> bool:
        """Whether a ``message_id`` of ``accepted`` names a message released into its queue
        (the queue database holds its key)."""
        assert accepted.message_id is not None
        keys = {
            key
            for key in map(queue_dedupe_key, accepted.destination, accepted.message_id)
            if key is not None
        }
        # Rows kept in memory carry no key (plain sends only): no write-out barrier.
        return bool(await self.ctx.queue_db.read(lambda conn: kept_by_dedupe_key(conn, keys)))

    def _answer(
        self,
        accepted: list[tuple[int, SendPlan, list[Message]]],
        everything: list[StoreOutcome],
        results: list[SendResult | TarryError | None],
        views: Mapping[str, DestinationView],
        now: int,
    ) -> tuple[list[Message], int | None]:
        """Each accepted send's result, from the outcomes of all its messages, into ``results``;
        returns the messages it created and the earliest due time the dispatcher must hear of
        (a delayed one, or one a route's transport takes), in one pass over the sends."""
        scheduled: list[Message] = []
        earliest: int | None = None
        transports = self.ctx.transports
        per_send = release.per_send(accepted, everything)
        for (index, plan, messages), stored in zip(accepted, per_send, strict=True):
            if len(stored) == 1:  # a queue's one message (no generator for the common case)
                first: Message | None = stored[0].message
                created = stored[0].created
            else:
                first = stored[0].message if stored else None
                created = all(o.created for o in stored) if stored else True
            destination = plan.request.destination
            if first is None:
                results[index] = SendResult(
                    id=self.ids.new(now),
                    state="no_subscribers",
                    deliver_at_ms=plan.deliver_at_ms,
                    expires_at_ms=plan.expires_at_ms,
                    destination=destination,
                )
            else:  # positional, in field order: a batch makes thousands
                results[index] = SendResult(
                    first.id,
                    _STATE_TEXT[first.state],
                    first.deliver_at_ms,
                    first.expires_at_ms,
                    created,
                    destination,
                    tuple((o.message.id, o.message.destination) for o in stored)
                    if views[destination].kind == "topic"
                    else (),
                )
            if created:
                scheduled += messages
                due = plan.deliver_at_ms
                if (earliest is None or due < earliest) and (
                    due > now or (transports and any(m.destination in transports for m in messages))
                ):
                    earliest = due
        return scheduled, earliest

    async def _view(self, name: str, *, lag: bool) -> DestinationView:
        if name in self.ctx.transports:
            return DestinationView(name, "route")
        kind = self.ctx.catalog.kind(name)
        if kind == "queue":
            return DestinationView(name, kind, (await self._target(name, lag=lag),))
        if kind == "topic":
            queues = sorted(self.ctx.catalog.topics[name])
            targets = [await self._target(q, lag=lag) for q in queues]
            return DestinationView(name, kind, tuple(targets))
        return DestinationView(name, None)

    async def _target(self, queue: str, *, lag: bool) -> TargetView:
        args = self.ctx.catalog.queues[queue].effective
        full = False
        if args.max_length is not None and args.overflow is Overflow.REJECT_PUBLISH:
            now = self.ctx.clock.now_ms()
            # A queue with a length limit has no rows in memory: no write-out barrier.
            ready = await self.ctx.queue_db.read(
                lambda conn: self.ctx.txn(conn, now).ready_count(queue)
            )
            full = ready >= args.max_length
        return TargetView(
            queue,
            put_enabled=args.put_enabled,
            max_message_bytes=args.max_message_bytes,
            full=full,
            lag_ms=self.ctx.waiters.lag.lag_ms(queue),
            lag_limit_ms=refusal_limit_ms(self.ctx.config.dispatch.overload_lag_ms) if lag else 0,
        )


def _asked_once(may_send: MayAccess | None) -> Callable[[str], bool]:
    """The token's answer per name (destinations and ``reply_to``s), asked once each."""
    allowed: dict[str, bool] = {}

    def may(name: str) -> bool:
        ok = allowed.get(name)
        if ok is None:
            ok = allowed[name] = may_send(name) if may_send else True
        return ok

    return may


def _soon_destination(item: object) -> object:
    """A send's destination when it is plainly due soon (a whole ``delay_ms`` that ``due_soon``
    holds within ``BEHIND_HORIZON_MS``), else None: the whole-request refusal leaves anything
    else to the send rules, which refuse only sends due soon."""
    if not isinstance(item, Mapping):
        return None
    delay = item.get("delay_ms", 0) if "deliver_at" not in item else None
    if type(delay) is not int or delay < 0 or not due_soon(delay):
        return None
    return item.get("destination")
