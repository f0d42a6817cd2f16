"""Bearer tokens at the HTTP edge: which configured token a request carries (``principal_for``),
what ``/healthz`` shows without one, and refusing to expose an unauthenticated server. What a
token may do, name by name, is ``tarry.engine.principal.Principal`` (the AMQP ingress acts as
one too), re-exported here. With no tokens configured everything is allowed, and the server may
then bind only to loopback.
"""

from __future__ import annotations

import hmac
import ipaddress
from functools import cache
from typing import Any

from fastapi import Request

from tarry.config import AuthConfig, TarryConfig, TokenConfig, token_sha256
from tarry.engine.principal import HIDDEN, Principal
from tarry.errors import InvalidArgument, Unauthenticated

__all__ = ["HIDDEN", "Principal", "check_bind_safety", "principal_for", "visible_health"]

#: ``/healthz`` reasons that quote a delivery's failure (a destination's name and URL).
_DELIVERY_REASONS = frozenset({"dispatch", "failure_handling"})


#: The caller when no tokens are configured (a ``Principal`` is immutable: one serves all).
_ANYONE = Principal(None)


def _digest(token: TokenConfig) -> bytes:
    return _digest_of(token.token_sha256, token.token)


@cache
def _digest_of(digest_hex: str | None, secret: str | None) -> bytes:
    """A configured token's SHA-256, hashed once rather than on every request (keyed by the
    configured values only, never by what a request presents)."""
    return bytes.fromhex(digest_hex or token_sha256(secret or ""))


def principal_for(request: Request, auth: AuthConfig) -> Principal:
    """The caller of ``request``: its bearer token must be one of the configured ones. The
    scheme word is case-insensitive (RFC 7235: ``bearer`` works as ``Bearer``)."""
    if not auth.tokens:
        return _ANYONE
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthenticated(
            "this server requires a bearer token: send 'Authorization: Bearer <token>' "
            "(tarry --token or TARRY_TOKEN)"
        )
    # Digests of equal length compared in constant time, every configured token each time, so
    # neither a secret's bytes nor which token matched shows in the time taken.
    presented = bytes.fromhex(token_sha256(value))
    found: TokenConfig | None = None
    for token in auth.tokens:
        if hmac.compare_digest(_digest(token), presented) and found is None:
            found = token
    if found is None:
        raise Unauthenticated("the bearer token is not one this server knows; check --token")
    return Principal(found)


def visible_health(health: dict[str, Any], request: Request, auth: AuthConfig) -> dict[str, Any]:
    """``/healthz`` as its caller may see it. It answers without a token (load balancers), so
    a reason quoting a delivery's failure (another tenant's destination and URL) is replaced by
    what kind of failure it is, unless the caller reads every name."""
    try:
        if principal_for(request, auth).reads_all:
            return health
    except Unauthenticated:
        pass
    reasons = {
        name: 'deliveries are failing (a token with read = ["*"] sees why)'
        if name in _DELIVERY_REASONS
        else reason
        for name, reason in health["reasons"].items()
    }
    return {**health, "reasons": reasons}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind_safety(config: TarryConfig) -> None:
    """Refuse to expose an unauthenticated server, or its tokens in plain text, beyond this
    machine."""
    server = config.server
    if is_loopback(server.host):
        return
    if not config.auth.tokens:
        raise InvalidArgument(
            f"refusing to bind {server.host} without authentication: add [[auth.tokens]] "
            "to the config, or bind 127.0.0.1"
        )
    if not server.tls and not server.allow_plaintext:
        raise InvalidArgument(
            f"refusing to bind {server.host} without TLS, as bearer tokens would cross the "
            "network in plain text: set server.tls_cert and server.tls_key, or "
            "server.allow_plaintext = true behind a TLS-terminating proxy"
        )
