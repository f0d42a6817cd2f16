"""The consumer's routes (receive, ack, nack) served ahead of FastAPI's route search.

A consumer makes two requests for each batch it takes, and with a batch of a few dozen
messages what every request costs before its route runs (the search through every mounted
route, the exception and exit-stack layers around it) comes to more than what the route does
with its messages. ``FastLane`` is a middleware that recognises these paths with a string split
and calls the same route functions (``tarry.server.routes.queues``) directly; everything else
goes on to the app. What a client sees is the same either way: the route's own response, and
for a ``TarryError`` the app's own handler's response (``tarry.server.errors``); anything
else propagates to the server-error layer outside, as it would from the router.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from tarry.errors import TarryError

__all__ = ["FastLane", "QueueRoute"]

#: A route function of ``/v1/queues/{name}/<action>``: the request and the queue's name.
QueueRoute = Callable[[Request, str], Awaitable[Response]]

_PREFIX = "/v1/queues/"


class FastLane:
    def __init__(self, app: ASGIApp, *, routes: Mapping[tuple[str, str], QueueRoute]) -> None:
        """``routes``: by (method, action), the route function of ``/v1/queues/{name}/<action>``
        (the same function the app mounts for that path)."""
        self.app = app
        self._routes = dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._match(scope)
        if route is None:
            await self.app(scope, receive, send)
            return
        handler, name = route
        request = Request(scope, receive)
        try:
            response = await handler(request, name)
        except TarryError as exc:
            # The app's own handler: the same body, status and headers as from the router.
            on_error = scope["app"].exception_handlers[TarryError]
            response = await on_error(request, exc)
        await response(scope, receive, send)

    def _match(self, scope: Scope) -> tuple[QueueRoute, str] | None:
        if scope["type"] != "http" or scope.get("root_path"):
            return None
        path: str = scope["path"]
        if not path.startswith(_PREFIX):
            return None
        # A path parameter matches one non-empty segment, as the router's ``{name}`` does.
        name, slash, action = path[len(_PREFIX) :].partition("/")
        if not name or not slash or "/" in action:
            return None
        handler = self._routes.get((scope["method"], action))
        return None if handler is None else (handler, name)
