"""Routes at run time: the destinations outside tarry (HTTP endpoints, RabbitMQ).

Two sources, one set of transports:

- ``tarry.toml`` declares routes at start (``[routes.NAME]``); they are fixed for the process's
  life.
- ``PUT /v1/routes/{name}`` puts a route at run time. It is kept in the catalog (``queues.db``
  beside the log store, the SQLite file, or PostgreSQL, where every node shares it and reloads it
  when any node changes it) and comes back after a restart.

Each route's transport lives in the engine's ``transports``, which the dispatcher and the send
path look up per round and per send: a route put, replaced or deleted here takes effect at once,
without a restart. A replaced transport is closed once deliveries already under way on it had
their time (its ``timeout_ms``).

A name clash between the two sources: **the file wins**. PUT and DELETE of a name ``tarry.toml``
declares are refused (``precondition_failed``: change it in the file), and a stored route whose
name the file declares later (put, then added to the file, then restarted) is not in force while
the file declares it (said in the log at every start).

A route cannot be deleted while messages wait for it (``in_use``) unless ``force``: then each of
them is dead-lettered (reason ``delivery_failed``, failure ``route_deleted: ...``), to the
route's ``dead_letter_to`` if it has one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from tarry.config import RouteConfig
from tarry.errors import DeliveryFailed, InUse, NotFound, PreconditionFailed, TarryError
from tarry.model.message import Message
from tarry.model.query import MessageQuery
from tarry.model.route_policy import RoutePolicy
from tarry.model.state import MessageState
from tarry.model.validate import check_name
from tarry.queues.catalog import Catalog, save_route
from tarry.store.base import QueueDatabase
from tarry.transports.base import Transport
from tarry.transports.build import check_reachable

__all__ = ["RouteBook", "RouteEntry"]

log = logging.getLogger(__name__)

#: Messages read per page when a forced delete dead-letters what waits for the route.
_PAGE = 1000


@dataclass(frozen=True, slots=True)
class RouteEntry:
    name: str
    route: RouteConfig
    #: ``config``: declared in ``tarry.toml``; ``api``: put at run time.
    source: Literal["config", "api"]

    def to_public(self) -> dict[str, Any]:
        """As ``GET /v1/routes`` shows it: no secrets, credentials or header values."""
        return {"name": self.name, **self.route.redacted(), "source": self.source}


@dataclass(frozen=True, slots=True)
class RouteHooks:
    """What the book needs from the engine around it (no more)."""

    qdb: QueueDatabase
    #: The catalog in force (a PostgreSQL node swaps it for a fresh one when another node
    #: changed it).
    catalog: Callable[[], Catalog]
    now_ms: Callable[[], int]
    build: Callable[[str, RouteConfig], Transport]
    #: Scheduled messages waiting for a destination.
    count_waiting: Callable[[str], Awaitable[int]]
    find: Callable[[MessageQuery], Awaitable[tuple[list[Message], str | None]]]
    #: Dead-letters one message (the engine's give-up path).
    give_up: Callable[[Message, DeliveryFailed], Awaitable[None]]


class RouteBook:
    def __init__(
        self,
        *,
        configured: Mapping[str, RouteConfig],
        transports: dict[str, Transport],
        hooks: RouteHooks,
    ) -> None:
        self._configured = dict(configured)
        #: The engine's own dict: changed in place, so every reader sees a change at once.
        self._transports = transports
        self._hooks = hooks
        #: Routes in force from the catalog: name → (stored JSON, parsed).
        self._stored: dict[str, tuple[str, RouteConfig]] = {}
        #: Deleted routes whose waiting messages are being dead-lettered (``force``): their
        #: policy still says where (``dead_letter_to``).
        self._leaving: dict[str, RoutePolicy] = {}
        self._retiring: set[asyncio.Task[None]] = set()

    # --- reading ------------------------------------------------------------------------------
    def entries(self) -> list[RouteEntry]:
        found = [RouteEntry(n, r, "config") for n, r in self._configured.items()]
        found += [RouteEntry(n, r, "api") for n, (_, r) in self._stored.items()]
        return sorted(found, key=lambda e: e.name)

    def find(self, name: str) -> RouteConfig | None:
        """The route in force under ``name`` (the file's first), or None."""
        if name in self._configured:
            return self._configured[name]
        stored = self._stored.get(name)
        return stored[1] if stored is not None else None

    def policy_for(self, name: str) -> RoutePolicy | None:
        """The delivery policy of the route ``name`` (None: not a route); a route put at run
        time has its policy too."""
        route = self.find(name)
        return route.policy if route is not None else self._leaving.get(name)

    def get(self, name: str) -> RouteEntry:
        if name in self._configured:
            return RouteEntry(name, self._configured[name], "config")
        if name in self._stored:
            return RouteEntry(name, self._stored[name][1], "api")
        raise NotFound(f"no route named {name!r}; GET /v1/routes lists them")

    # --- changing -----------------------------------------------------------------------------
    async def put(self, name: str, data: Any) -> tuple[RouteEntry, bool]:
        """Create or replace a run-time route (validated by ``RouteConfig``); True when created.
        Raises ``invalid_argument``, ``precondition_failed`` (a name of ``tarry.toml``, a
        queue or a topic)."""
        check_name(name, field="route name")
        route = RouteConfig.parse(name, data)
        self._refuse_configured(name, "replace")
        catalog = self._hooks.catalog()
        kind = catalog.kind(name)
        if kind is not None:
            raise PreconditionFailed(f"{name!r} is already a {kind}; choose another route name")
        definition = route.model_dump_json()
        known = self._stored.get(name)
        if known is not None and known[0] == definition:
            return self.get(name), False  # the same route again: nothing changes
        # Built first: a route this build cannot serve is refused here, not at its first delivery.
        transport = self._hooks.build(name, route)
        now = self._hooks.now_ms()
        try:
            await check_reachable(transport)  # a name already resolving inside: refused now
            await self._hooks.qdb.write(
                lambda conn: save_route(conn, name, definition, now), durable=True
            )
        except BaseException:
            await transport.close()
            raise
        catalog = self._hooks.catalog()
        created = name not in catalog.routes
        catalog.routes[name] = definition
        self._install(name, definition, route, transport)
        log.info("route %s %s: %s", name, "put" if created else "replaced", route.redacted())
        return self.get(name), created

    async def delete(self, name: str, *, force: bool = False) -> int:
        """Delete a run-time route; returns how many waiting messages were dead-lettered.
        Raises ``not_found``, ``precondition_failed`` (declared in ``tarry.toml``), ``in_use``
        (messages wait for it and not ``force``)."""
        policy = self.get(name).route.policy
        self._refuse_configured(name, "delete")
        waiting = await self._hooks.count_waiting(name)
        if waiting and not force:
            raise InUse(
                f"route {name!r} has {waiting} message(s) waiting for it; let them be "
                "delivered, cancel them, or delete with ?force=true (tarry route delete "
                "--force), which dead-letters them"
            )
        now = self._hooks.now_ms()
        await self._hooks.qdb.write(lambda conn: save_route(conn, name, None, now), durable=True)
        catalog = self._hooks.catalog()
        catalog.routes.pop(name, None)
        self.apply(catalog.routes)
        log.info("route %s deleted", name)
        # After the transport is gone: a message sent meanwhile finds no route and is refused,
        # so what is listed now is all that can still wait for it.
        if not force:
            return 0
        self._leaving[name] = policy
        try:
            return await self._dead_letter_waiting(name)
        finally:
            del self._leaving[name]

    def apply(self, stored: Mapping[str, str]) -> None:
        """Make the transports match the stored routes: at start, after a change here, and
        after another node changed them. A stored route that cannot be used (written by a
        version with other rules, a transport this build lacks) is logged and left out."""
        for name in [n for n in self._stored if n not in stored]:
            del self._stored[name]
            self._retire(name, self._transports.pop(name, None))
        for name, definition in stored.items():
            if name in self._configured:
                log.warning(
                    "route %r is declared in tarry.toml and was also put at run time: the file's "
                    "route is in force (DELETE is refused; remove it from the file to use the "
                    "stored one)",
                    name,
                )
                continue
            known = self._stored.get(name)
            if known is not None and known[0] == definition:
                continue
            try:
                # parse's errors name fields, never their values (a secret would be one).
                route = RouteConfig.parse(name, orjson.loads(definition))
                transport = self._hooks.build(name, route)
            except (orjson.JSONDecodeError, TarryError) as exc:
                log.error("stored route %r is not in force: %s; put it again", name, exc)
                continue
            self._install(name, definition, route, transport)

    async def close(self) -> None:
        """Close the transports being retired now (at shutdown)."""
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)

    # --- helpers ------------------------------------------------------------------------------
    def _install(
        self, name: str, definition: str, route: RouteConfig, transport: Transport
    ) -> None:
        self._stored[name] = (definition, route)
        old = self._transports.get(name)
        self._transports[name] = transport
        self._retire(name, old)

    def _refuse_configured(self, name: str, action: str) -> None:
        if name in self._configured:
            raise PreconditionFailed(
                f"route {name!r} is declared in tarry.toml, which wins over the API; "
                f"{action} it there and restart"
            )

    def _retire(self, name: str, transport: Transport | None) -> None:
        """Close a transport no longer in force once deliveries under way on it had their time."""
        if transport is None:
            return
        grace_s = getattr(getattr(transport, "route", None), "timeout_ms", 5_000) / 1000 + 1

        async def later() -> None:
            try:
                await asyncio.sleep(grace_s)
            finally:
                try:
                    await transport.close()
                except Exception:  # closing a dead connection must not surface anywhere
                    log.warning("closing the old transport of route %s failed", name, exc_info=True)

        task = asyncio.get_running_loop().create_task(later())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _dead_letter_waiting(self, name: str) -> int:
        waiting: list[Message] = []
        cursor: str | None = None
        while True:
            query = MessageQuery(
                destination=name, state=MessageState.SCHEDULED.value, limit=_PAGE, cursor=cursor
            )
            page, cursor = await self._hooks.find(query)
            waiting += page
            if cursor is None or not page:
                break
        error = DeliveryFailed(
            f"route {name!r} was deleted (force=true) while the message waited for it",
            reason="route_deleted",
            permanent=True,
        )
        for message in waiting:
            await self._hooks.give_up(message, error)
        if waiting:
            log.info("route %s: dead-lettered %d waiting message(s)", name, len(waiting))
        return len(waiting)
