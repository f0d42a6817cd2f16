"""``AsyncClient``: the asyncio Python client (httpx), the same surface as ``Client``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from tarry.client import _calls
from tarry.client._base import (
    DEFAULT_URL,
    Call,
    auth_headers,
    raise_for_error,
    tls_verify,
    unreachable,
)
from tarry.client._types import MessageInfo

__all__ = ["AsyncClient"]

P = ParamSpec("P")
R = TypeVar("R")


def _method(
    spec: Callable[P, tuple[Call, Callable[[Any], R]]],
) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, R]]:
    async def method(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        call, read = spec(*args, **kwargs)
        return read(await self._send(call))

    method.__name__, method.__doc__ = spec.__name__, spec.__doc__
    return method


class AsyncClient:
    """``AsyncClient(url, token=None)``: awaitable twins of ``Client``'s methods."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        ca: str | Path | None = None,
    ):
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=auth_headers(token),
            timeout=timeout,
            verify=tls_verify(ca),
        )

    async def _send(self, call: Call) -> Any:
        try:
            response = await self._http.request(
                call.method, call.path, json=call.json, params=call.params
            )
        except httpx.TransportError as exc:
            raise unreachable(self.url, exc) from exc
        raise_for_error(response)
        return response.json()

    send = _method(_calls.send)
    send_batch = _method(_calls.send_batch)
    get = _method(_calls.get)
    cancel = _method(_calls.cancel)
    reschedule = _method(_calls.reschedule)
    list = _method(_calls.list)
    declare_queue = _method(_calls.declare_queue)
    get_queue = _method(_calls.get_queue)
    list_queues = _method(_calls.list_queues)
    delete_queue = _method(_calls.delete_queue)
    receive = _method(_calls.receive)
    ack = _method(_calls.ack)
    nack = _method(_calls.nack)
    redrive = _method(_calls.redrive)
    declare_topic = _method(_calls.declare_topic)
    get_topic = _method(_calls.get_topic)
    subscribe = _method(_calls.subscribe)
    unsubscribe = _method(_calls.unsubscribe)
    put_policy = _method(_calls.put_policy)
    list_policies = _method(_calls.list_policies)
    delete_policy = _method(_calls.delete_policy)
    list_routes = _method(_calls.list_routes)
    get_route = _method(_calls.get_route)
    health = _method(_calls.health)
    stats = _method(_calls.stats)

    async def iter_messages(self, **filters: Any) -> AsyncIterator[MessageInfo]:
        cursor = None
        while True:
            page = await self.list(**filters, cursor=cursor)
            for item in page.items:
                yield item
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, *exc: type[BaseException] | BaseException | TracebackType | None
    ) -> None:
        await self.aclose()
