"""tarry's Python client: ``Client`` (blocking) and ``AsyncClient`` share one core (``_calls``,
``_base``) and only send. May import ``errors`` and ``model`` value helpers, never ``server``."""

from tarry.client._types import (
    MessageInfo,
    Page,
    QueueInfo,
    Received,
    ReceivedBatch,
    Scheduled,
)
from tarry.client.async_ import AsyncClient
from tarry.client.sync import Client

__all__ = [
    "AsyncClient",
    "Client",
    "MessageInfo",
    "Page",
    "QueueInfo",
    "Received",
    "ReceivedBatch",
    "Scheduled",
]
