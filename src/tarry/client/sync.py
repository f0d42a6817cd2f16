"""``Client``: the blocking Python client (httpx)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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

__all__ = ["Client"]

P = ParamSpec("P")
R = TypeVar("R")


def _method(
    spec: Callable[P, tuple[Call, Callable[[Any], R]]],
) -> Callable[Concatenate[Client, P], R]:
    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> R:
        call, read = spec(*args, **kwargs)
        return read(self._send(call))

    method.__name__, method.__doc__ = spec.__name__, spec.__doc__
    return method


class Client:
    """``Client("http://127.0.0.1:7420", token=None)``: every method mirrors the HTTP API and
    raises the ``TarryError`` subclass of the server's error code."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        ca: str | Path | None = None,
    ):
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url, headers=auth_headers(token), timeout=timeout, verify=tls_verify(ca)
        )

    def _send(self, call: Call) -> Any:
        try:
            response = self._http.request(
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

    def iter_messages(self, **filters: Any) -> Iterator[MessageInfo]:
        """Every message matching ``filters``, page after page."""
        cursor = None
        while True:
            page = self.list(**filters, cursor=cursor)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()
