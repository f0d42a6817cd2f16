"""The transport for a route, by its ``transport`` setting: what ``tarry.toml`` declares at start
and what ``PUT /v1/routes/{name}`` puts at run time go through here alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tarry.config import RouteConfig
from tarry.errors import InvalidArgument
from tarry.model.egress import ALLOW_ALL, EgressPolicy
from tarry.model.time import Clock
from tarry.transports.base import Transport

__all__ = ["build_transport", "check_reachable", "rabbitmq_module"]


def rabbitmq_module() -> Any:
    """The RabbitMQ transports, or a clear error when the optional dependency is missing."""
    try:
        from tarry.transports import rabbitmq_topology
    except ImportError as exc:
        raise InvalidArgument(
            f"RabbitMQ is configured but its client library is missing ({exc}); "
            "install it with pip install 'tarry[rabbitmq]'"
        ) from None
    return rabbitmq_topology


async def check_reachable(transport: Transport) -> None:
    """Before a route put through the API is saved: refuse (``forbidden_address``) one whose
    host already resolves to an address the egress guard refuses, rather than fail its
    deliveries later. Only HTTP routes have such a guard; a name that does not resolve yet
    passes, as each connection checks it again."""
    from tarry.transports.http import HttpTransport

    if isinstance(transport, HttpTransport):
        await transport.check_address()


def build_transport(
    name: str, route: RouteConfig, *, clock: Clock | None = None, egress: EgressPolicy = ALLOW_ALL
) -> Transport:
    """A new transport for route ``name`` (it connects on first use). Raises
    ``invalid_argument`` when this build cannot speak the route's transport, and
    ``forbidden_address`` when ``egress`` refuses an HTTP route's address (the default: the
    operator's own routes, unchecked)."""
    if route.transport == "http":
        from tarry.transports.http import HttpTransport

        return HttpTransport(route, clock=clock, egress=egress)
    if route.transport == "rabbitmq":
        transport: Transport = rabbitmq_module().rabbitmq_transport(name, route, clock=clock)
        return transport
    raise InvalidArgument(
        f"route {name!r}: transport {route.transport!r} is not available in this build"
    )


def build_transports(
    routes: Mapping[str, RouteConfig], *, clock: Clock | None = None
) -> dict[str, Transport]:
    """``build_transport`` of each configured route, by name."""
    return {name: build_transport(name, route, clock=clock) for name, route in routes.items()}
