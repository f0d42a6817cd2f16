"""The routes a consumer and a producer call for every batch or message (receive, ack, nack;
a send, a batch send), served ahead of everything FastAPI runs for a request.

A consumer makes two requests for each batch it takes, and with a batch of a few dozen
messages what every request costs before its route runs (FastAPI's telemetry check, its
server-error, telemetry and body-limit layers, the search through every mounted route, the
exception and exit-stack layers around it) comes to more than what the route does with its
messages; a producer sending one message at a time pays it for each message.
``LaneFirstAPI`` is the FastAPI app with a ``FastLane`` in front: the lane recognises these
paths with a string split and calls the same route functions directly; everything else goes
through the app as before.

What a client sees is the same either way: the route's own response; for a ``TarryError`` the
app's own handler's response (``tarry.server.errors``); for anything else the app's handler for
unexpected errors, then the error goes on to the server (which logs it and closes the
connection), as FastAPI's ``ServerErrorMiddleware`` does. The lane stays closed, and every
request takes the whole app, until the app has started (``open_lane``), and for good when
the app has middleware of its own or FastAPI's OpenTelemetry instrumentation is configured:
their spans and metrics see every request only through the whole app.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tarry.errors import TarryError

__all__ = ["FastLane", "LaneFirstAPI", "QueueRoute", "Route"]

#: A route function of ``/v1/queues/{name}/<action>``: the request and the queue's name.
QueueRoute = Callable[[Request, str], Awaitable[Response]]
#: A route function of a path without parameters: the request alone.
Route = Callable[[Request], Awaitable[Response]]
#: What an exception handler of the app is called as.
_Handler = Callable[[Request, Exception], Awaitable[Response]]

_QUEUES = "/v1/queues/"


class FastLane:
    """Which requests the lane takes, and answering them as the app would."""

    def __init__(
        self,
        *,
        queue_routes: Mapping[tuple[str, str], QueueRoute],
        routes: Mapping[tuple[str, str], Route] | None = None,
    ) -> None:
        """``queue_routes``: by (method, action), the route function of
        ``/v1/queues/{name}/<action>``; ``routes``: by (method, path), the route function of
        that literal path (each the same function the app mounts for it)."""
        self._queue_routes = dict(queue_routes)
        self._routes = dict(routes or {})

    def match(self, scope: Scope) -> Callable[[Request], Awaitable[Response]] | None:
        """The route that answers this request, its path parameter bound; None if it is not
        one of the lane's (then the app's router decides)."""
        if scope["type"] != "http" or scope.get("root_path"):
            return None
        path: str = scope["path"]
        route = self._routes.get((scope["method"], path))
        if route is not None:
            return route
        if not path.startswith(_QUEUES):
            return None
        # A path parameter matches one non-empty segment, as the router's ``{name}`` does.
        name, slash, action = path[len(_QUEUES) :].partition("/")
        if not name or not slash or "/" in action:
            return None
        queue_route = self._queue_routes.get((scope["method"], action))
        if queue_route is None:
            return None
        return lambda request: queue_route(request, name)

    async def serve(
        self,
        route: Callable[[Request], Awaitable[Response]],
        handlers: Mapping[Any, Any],
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Answer with ``route``; an error is answered by ``handlers`` (the app's exception
        handlers), as the app answers it."""
        request = Request(scope, receive)
        started = False
        try:
            try:
                response = await route(request)
            except TarryError as exc:
                response = await cast(_Handler, handlers[TarryError])(request, exc)
            started = True
            await response(scope, receive, send)
        except Exception as exc:
            # What ServerErrorMiddleware does: the app's handler answers unless the answer has
            # begun, and the error goes on to the server.
            fallback = await cast(_Handler, handlers[Exception])(request, exc)
            if not started:
                await fallback(scope, receive, send)
            raise


class LaneFirstAPI(FastAPI):
    """A FastAPI app whose ``lane`` answers its requests before anything else runs."""

    def __init__(self, *, lane: FastLane, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lane = lane
        self._lane_open = False

    def open_lane(self) -> None:
        """Let the lane take its requests (from app start-up: FastAPI's telemetry is configured
        by then), unless something must see every request through the whole app."""
        self._lane_open = not self.user_middleware and not self._telemetry_on()

    def _telemetry_on(self) -> bool:
        telemetry = getattr(self, "_native_telemetry", None)
        return telemetry is not None and bool(telemetry.enabled())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._lane_open:
            route = self.lane.match(scope)
            if route is not None:
                scope["app"] = self  # as Starlette sets it: routes reach the app by it
                await self.lane.serve(route, self.exception_handlers, scope, receive, send)
                return
        await super().__call__(scope, receive, send)
