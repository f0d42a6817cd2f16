"""tarry: durable delayed-message delivery. A message is kept safely and delivered at its time,
never early; or expired, dead-lettered, retried, cancelled or inspected.

The public surface is the client, its value types and the error types; everything else lives in
subpackages."""

from tarry.client import AsyncClient, Client, MessageInfo, Page, QueueInfo, Received, Scheduled
from tarry.errors import (
    DeliveryFailed,
    DestinationFull,
    ExpiryError,
    ForbiddenAddress,
    InvalidArgument,
    MessageTooLarge,
    NotAuthorized,
    NotCancellable,
    NotFound,
    OptionsError,
    Overloaded,
    PreconditionFailed,
    PutDisabled,
    TarryError,
    Unauthenticated,
    Unavailable,
    UnknownDestination,
)

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "Client",
    "DeliveryFailed",
    "DestinationFull",
    "ExpiryError",
    "ForbiddenAddress",
    "InvalidArgument",
    "MessageInfo",
    "MessageTooLarge",
    "NotAuthorized",
    "NotCancellable",
    "NotFound",
    "OptionsError",
    "Overloaded",
    "Page",
    "PreconditionFailed",
    "PutDisabled",
    "QueueInfo",
    "Received",
    "Scheduled",
    "TarryError",
    "Unauthenticated",
    "Unavailable",
    "UnknownDestination",
    "__version__",
]
