"""Bearer tokens with per-name permissions, checked at send time (as IBM MQ checks authority at
put time) and never again at delivery. With no tokens configured everything is allowed, and the
server may then bind only to loopback."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from fnmatch import fnmatchcase

from fastapi import Request

from tarry.config import AuthConfig, TarryConfig, TokenConfig
from tarry.errors import InvalidArgument, NotAuthorized, Unauthenticated

__all__ = ["Principal", "check_bind_safety", "principal_for"]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling; ``token`` None means auth is off (loopback only)."""

    token: TokenConfig | None

    def _allows(self, patterns: list[str], name: str) -> bool:
        return self.token is None or any(fnmatchcase(name, p) for p in patterns)

    def may_send(self, name: str) -> bool:
        return self._allows(self.token.send if self.token else [], name)

    def may_receive(self, name: str) -> bool:
        return self._allows(self.token.receive if self.token else [], name)

    def may_admin(self, name: str) -> bool:
        return self._allows(self.token.admin if self.token else [], name)

    def require(self, allowed: bool, action: str, name: str) -> None:
        if not allowed:
            who = self.token.name or "this token" if self.token else "this token"
            raise NotAuthorized(
                f"{who} may not {action} {name!r}; ask for a token with {action} permission on it"
            )


def principal_for(request: Request, auth: AuthConfig) -> Principal:
    """The caller of ``request``: its bearer token must be one of the configured ones."""
    if not auth.tokens:
        return Principal(None)
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value:
        raise Unauthenticated(
            "this server requires a bearer token: send 'Authorization: Bearer <token>' "
            "(tarry --token or TARRY_TOKEN)"
        )
    for token in auth.tokens:
        if token.token == value.strip():
            return Principal(token)
    raise Unauthenticated("the bearer token is not one this server knows; check --token")


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
