"""The transports of the routes ``tarry.toml`` declares (destinations outside tarry)."""

from __future__ import annotations

from typing import Any

from tarry.config import TarryConfig
from tarry.errors import InvalidArgument
from tarry.model.time import Clock
from tarry.transports.base import Transport

__all__ = ["build_transports", "rabbitmq"]


def rabbitmq() -> Any:
    """The RabbitMQ transports, or a clear error when the optional dependency is missing."""
    try:
        from tarry.transports import rabbitmq_topology
    except ImportError as exc:
        raise InvalidArgument(
            f"RabbitMQ is configured but its client library is missing ({exc}); "
            "install it with pip install 'tarry[rabbitmq]'"
        ) from None
    return rabbitmq_topology


def build_transports(config: TarryConfig, *, clock: Clock | None) -> dict[str, Transport]:
    """One transport per configured route, by route name."""
    transports: dict[str, Transport] = {}
    for name, route in config.routes.items():
        if route.transport == "http":
            from tarry.transports.http import HttpTransport

            transports[name] = HttpTransport(route)
        elif route.transport == "rabbitmq":
            transports[name] = rabbitmq().rabbitmq_transport(name, route, clock=clock)
        else:
            raise InvalidArgument(
                f"route {name!r}: transport {route.transport!r} is not available in this build"
            )
    return transports
