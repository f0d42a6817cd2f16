"""tarry's error types: one registry of stable codes shared by the server, the client and the CLI.

Hierarchy::

    TarryError
    ├── InvalidArgument        invalid_argument      400
    ├── ExpiryError            expiry_error          400
    ├── OptionsError           options_error         400
    ├── Unauthenticated        unauthenticated       401
    ├── NotAuthorized          not_authorized        403
    │   └── ForbiddenAddress   forbidden_address     403 (a route's address; ``[egress]``)
    ├── NotFound               not_found             404
    ├── UnknownDestination     unknown_destination   404
    ├── PutDisabled            put_disabled          409
    ├── NotCancellable         not_cancellable       409
    ├── PreconditionFailed     precondition_failed   409
    ├── InUse                  in_use                409
    ├── MessageTooLarge        message_too_large     413
    ├── DestinationFull        destination_full      429
    ├── Overloaded             overloaded            429 (+ Retry-After: releases, consumers late)
    ├── Unavailable            unavailable           503
    │   └── StorageFault       (unavailable, 503: the disk refused a write; the store breaker
    │                          opens at once)
    └── DeliveryFailed         delivery_failed       502 (raised by transports, never to producers)

Each subclass registers itself under its ``code`` so that a code read off the wire (an HTTP
error body, an AMQP header, a Spark rejects row) turns back into the same class.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

__all__ = [
    "DeliveryFailed",
    "DestinationFull",
    "ExpiryError",
    "ForbiddenAddress",
    "InUse",
    "InvalidArgument",
    "MessageTooLarge",
    "NotAuthorized",
    "NotCancellable",
    "NotFound",
    "OptionsError",
    "Overloaded",
    "PreconditionFailed",
    "PutDisabled",
    "StorageFault",
    "TarryError",
    "Unauthenticated",
    "Unavailable",
    "UnknownDestination",
    "error_class_for",
    "registered_codes",
]

_REGISTRY: dict[str, type[TarryError]] = {}


class TarryError(Exception):
    """Base of every error tarry reports; carries a stable ``code`` and an HTTP status."""

    code: ClassVar[str] = "internal"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            _REGISTRY[cls.code] = cls

    def to_dict(self) -> dict[str, Any]:
        """The error body: code, message, and any details (fields a client can act on, such as
        the ``max_batch`` a refused batch exceeded)."""
        return {**self.details, "code": self.code, "message": self.message}

    @classmethod
    def from_dict(cls, error: dict[str, Any]) -> TarryError:
        """The error an error body (``to_dict``) describes, as its registered class."""
        details = {k: v for k, v in error.items() if k not in ("code", "message")}
        return error_class_for(str(error["code"]))(str(error["message"]), **details)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidArgument(TarryError):
    """Raised when a request field is missing, malformed or out of range."""

    code = "invalid_argument"
    http_status = 400


class ExpiryError(TarryError):
    """Raised when a message's time-to-live ends before its delivery time (IBM MQ 2013)."""

    code = "expiry_error"
    http_status = 400


class OptionsError(TarryError):
    """Raised when options cannot be combined, e.g. a group or retained message with a delay."""

    code = "options_error"
    http_status = 400


class Unauthenticated(TarryError):
    """Raised when a request carries no bearer token, or an unknown one, and tokens are required."""

    code = "unauthenticated"
    http_status = 401


class NotAuthorized(TarryError):
    """Raised when the token lacks the permission for this destination and action."""

    code = "not_authorized"
    http_status = 403


class ForbiddenAddress(NotAuthorized):
    """Raised when a route put through the API points at an address this server does not
    deliver to (loopback, link-local and cloud metadata, private, multicast, ...), unless
    ``[egress] allow`` lists it; a subclass of ``NotAuthorized``, so code that catches that
    still catches it."""

    code = "forbidden_address"
    http_status = 403


class NotFound(TarryError):
    """Raised when a message, queue, topic or policy of that name or id does not exist."""

    code = "not_found"
    http_status = 404


class UnknownDestination(TarryError):
    """Raised when a message is sent to a destination that was never declared."""

    code = "unknown_destination"
    http_status = 404


class PutDisabled(TarryError):
    """Raised when the destination queue is put-disabled (IBM MQ 2051)."""

    code = "put_disabled"
    http_status = 409


class NotCancellable(TarryError):
    """Raised when a message has left the ``scheduled`` state and can no longer be changed."""

    code = "not_cancellable"
    http_status = 409


class PreconditionFailed(TarryError):
    """Raised when a queue or topic is re-declared with different arguments."""

    code = "precondition_failed"
    http_status = 409


class InUse(TarryError):
    """Raised when a route is deleted while messages still wait for it (``?force=true``
    dead-letters them instead)."""

    code = "in_use"
    http_status = 409


class MessageTooLarge(TarryError):
    """Raised when the body is larger than the destination's ``max_message_bytes``, or a request
    body larger than its route allows (``max_request_bytes`` then says how large)."""

    code = "message_too_large"
    http_status = 413


class DestinationFull(TarryError):
    """Raised when the destination queue is at ``max_length`` with ``overflow = reject_publish``."""

    code = "destination_full"
    http_status = 429


class Overloaded(TarryError):
    """Raised when the server is further behind on releasing due messages than
    ``[dispatch] overload_lag_ms`` allows, or a send's queue is that far behind with its
    consumers (its delivery lag): it refuses new work rather than deliver it late.
    Nothing of the refused send was stored; retry after ``retry_after_s`` seconds (the
    ``Retry-After`` header says the same)."""

    code = "overloaded"
    http_status = 429

    @property
    def retry_after_s(self) -> int:
        """Whole seconds to wait before sending again (at least 1)."""
        return max(1, int(self.details.get("retry_after_s", 1)))

    @staticmethod
    def retry_after_for(lag_ms: int, limit_ms: int) -> int:
        """Whole seconds to wait when ``lag_ms`` is over ``limit_ms``: the time the excess
        takes to pass, at least 1."""
        return max(1, math.ceil((lag_ms - limit_ms) / 1000))

    @classmethod
    def consumers_behind(cls, queue: str, lag_ms: int, limit_ms: int) -> Overloaded:
        """The refusal of a send to ``queue``, whose delivery lag ``lag_ms`` is over
        ``limit_ms`` (half of ``[dispatch] overload_lag_ms``)."""
        after_s = cls.retry_after_for(lag_ms, limit_ms)
        return cls(
            f"queue {queue!r}'s consumers are {lag_ms} ms behind (more than {limit_ms} ms, "
            "half of [dispatch] overload_lag_ms: the other half is kept for what was accepted "
            f"already); nothing was stored: retry after {after_s} s, or consume faster",
            retry_after_s=after_s,
            delivery_lag_ms=lag_ms,
            queue=queue,
        )


class Unavailable(TarryError):
    """Raised when the store cannot accept writes now; nothing of the request was stored."""

    code = "unavailable"
    http_status = 503


class StorageFault(Unavailable):
    """Raised when the disk refused a write (full, read-only, failing): nothing was stored.
    Same code as ``Unavailable`` (a client retries either alike); the server opens its store
    breaker at once instead of after ``time_to_trigger_store_ms``, since waiting will not
    clear it, and keeps probing until a write succeeds again."""

    def __init__(self, message: str, *, cause: str = "write failed", **details: Any) -> None:
        super().__init__(message, **details)
        #: Why, in a few words for ``/healthz`` ("disk full", "I/O error", ...).
        self.cause = cause


class DeliveryFailed(TarryError):
    """Raised when a destination outside tarry did not accept a message (from a transport)."""

    code = "delivery_failed"
    http_status = 502

    def __init__(self, message: str, *, reason: str = "delivery_failed", **details: Any) -> None:
        super().__init__(message, **details)
        self.reason = reason


def error_class_for(code: str) -> type[TarryError]:
    """The registered class for ``code``; unknown codes map to the base ``TarryError``."""
    return _REGISTRY.get(code, TarryError)


def registered_codes() -> frozenset[str]:
    return frozenset(_REGISTRY)
