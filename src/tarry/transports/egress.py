"""The connection-time half of the route guard (``tarry.model.egress``): an httpx transport whose
every TCP connection resolves the host itself, checks each address against the policy, and then
connects to a checked address, never to a name.

Connecting to the checked address (and not letting the resolver run again) is what stops DNS
rebinding: a name that answered with a public address when checked and with ``127.0.0.1`` a
moment later never gets the second lookup. TLS still verifies the route's host name (httpcore
sends it as SNI and checks the certificate against it, not against the address). Every
connection goes through the check, so a redirect, were one followed, would be checked as well;
tarry does not follow redirects (a 3xx is a failed delivery). The guarded client connects
directly: ``HTTP_PROXY``/``HTTPS_PROXY`` from the environment are not used, as a proxy would
reach the addresses the guard refuses.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import typing

import httpcore
import httpx

from tarry.model.egress import EgressPolicy

__all__ = ["GuardedTransport", "checked_addresses"]


async def checked_addresses(
    policy: EgressPolicy, host: str, port: int, timeout: float | None
) -> list[str]:
    """``host``'s addresses, each checked (``forbidden_address`` for the first refused one: a
    name with one refused address among public ones is refused, whichever a connection would
    have used). Raises ``OSError`` or ``TimeoutError`` when it does not resolve."""
    async with asyncio.timeout(timeout):
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    for address in addresses:
        policy.check_address(host, ipaddress.ip_address(address.split("%")[0]))
    return addresses


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, policy: EgressPolicy) -> None:
        self._policy = policy
        self._backend = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await checked_addresses(self._policy, host, port, timeout)
        except (OSError, TimeoutError) as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        last: Exception = httpcore.ConnectError(f"{host} resolved to no address")
        for address in addresses:
            try:
                return await self._backend.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        raise last

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("routes put through the API do not reach Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


class GuardedTransport(httpx.AsyncHTTPTransport):
    """``httpx.AsyncHTTPTransport`` over a connection pool that checks every connection.

    httpx takes no network backend, so this builds the pool itself (with the arguments httpx
    would pass) instead of calling the parent's constructor; requests, responses and the
    translation of httpcore's errors stay httpx's."""

    def __init__(self, policy: EgressPolicy, *, limits: httpx.Limits) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_GuardedBackend(policy),
        )
