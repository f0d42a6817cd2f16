"""Bearer tokens with per-name permissions, checked at send time (as IBM MQ checks authority at
put time) and never again at delivery. With no tokens configured everything is allowed, and the
server may then bind only to loopback.

Every name an operation touches is checked, not only the one in its path: a subscription's queue,
a queue's or a policy's ``dead_letter_to`` (send on it), a send's ``reply_to`` when it asks for
reports (send on it, per message, through ``may_send`` in the send rules), a route's
``on_failure_report_to`` (send on it, ``require_route_policy``), and a policy's pattern
(``may_set_pattern``). Reading metadata needs ``read`` (or ``receive``/``admin``) on the
name."""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass
from fnmatch import fnmatchcase

from fastapi import Request

from tarry.config import AuthConfig, TarryConfig, TokenConfig, token_sha256
from tarry.errors import InvalidArgument, NotAuthorized, Unauthenticated
from tarry.model.message import Message
from tarry.model.pattern_scope import literal_prefix
from tarry.model.queue_args import Policy, QueueArgs
from tarry.model.route_policy import RoutePolicy

__all__ = ["Principal", "check_bind_safety", "principal_for"]

_GLOB_SPECIALS = frozenset("*?[")


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

    def may_read(self, name: str) -> bool:
        """Metadata, details and listings: ``read``, or ``receive``/``admin`` on the name (who
        consumes or manages a queue sees what is in it); ``send`` alone does not read."""
        return self.token is None or any(
            fnmatchcase(name, p) for p in (*self.token.read, *self.token.receive, *self.token.admin)
        )

    def may_describe(self, name: str) -> bool:
        """A destination's declaration and counts (queue and topic details, the route list):
        who may send there sees what it accepts (a pipeline checks its rows against it);
        messages and their metadata still need ``read``."""
        return self.may_read(name) or self.may_send(name)

    def may_read_message(self, message: Message) -> bool:
        """A message is readable on its queue and, for a topic's copy, on its topic."""
        return self.may_read(message.destination) or (
            message.topic is not None and self.may_read(message.topic)
        )

    @property
    def reads_all(self) -> bool:
        """May read every name: no auth, or ``"*"`` among its read/receive/admin globs."""
        if self.token is None:
            return True
        return "*" in (*self.token.read, *self.token.receive, *self.token.admin)

    @property
    def admin_of_all(self) -> bool:
        return self.token is None or "*" in self.token.admin

    def may_set_pattern(self, pattern: str) -> bool:
        """True when every queue name ``pattern`` can match lies inside this token's admin
        globs: the pattern's proven literal prefix starts with the fixed text of an admin glob
        ``text*``. Only an admin-of-all token (admin ``"*"``) may set any other pattern."""
        if self.admin_of_all:
            return True
        prefix = literal_prefix(pattern)
        if prefix is None or self.token is None:
            return False
        for glob in self.token.admin:
            fixed = glob[:-1]
            if glob.endswith("*") and not _GLOB_SPECIALS & set(fixed) and prefix.startswith(fixed):
                return True
        return False

    @property
    def _who(self) -> str:
        return (self.token.name if self.token else "") or "this token"

    def require(self, allowed: bool, action: str, name: str, *, scope: str | None = None) -> None:
        """Refuse ``action`` on ``name`` unless ``allowed``; ``scope``: the permission to ask
        for, when it is not named by ``action`` itself."""
        if not allowed:
            raise NotAuthorized(
                f"{self._who} may not {action} {name!r}; ask for a token with "
                f"{scope or action} permission on it"
            )

    def require_read(self, name: str) -> None:
        self.require(self.may_read(name), "read", name, scope="read (or receive or admin)")

    def require_describe(self, name: str) -> None:
        self.require(
            self.may_describe(name), "inspect", name, scope="send or read (or receive or admin)"
        )

    def require_reads_all(self, what: str) -> None:
        if not self.reads_all:
            raise NotAuthorized(
                f"{self._who} may not read {what}, which covers every tenant; ask for a token "
                'with read = ["*"]'
            )

    def require_dead_letter_to(self, args: QueueArgs) -> None:
        """Dead-lettering writes into ``dead_letter_to``: the token must be able to send there."""
        target = args.dead_letter_to
        if target is not None:
            self.require(self.may_send(target), "dead-letter into", target, scope="send")

    def require_route_policy(self, policy: RoutePolicy) -> None:
        """A route's failure reports write into ``on_failure_report_to`` (like ``reply_to``):
        the token that sets the route must be able to send there."""
        for target in policy.names():
            self.require(self.may_send(target), "report route failures to", target, scope="send")

    def require_policy(self, policy: Policy, *, action: str) -> None:
        """Set or delete ``policy``: admin on its name, a pattern inside the token's admin globs
        (``may_set_pattern``), and send on its ``dead_letter_to``."""
        self.require(self.may_admin(policy.name), f"{action} policy", policy.name, scope="admin")
        if not self.may_set_pattern(policy.pattern):
            globs = ", ".join(self.token.admin) if self.token else ""
            raise NotAuthorized(
                f"policy pattern {policy.pattern!r} may match queues outside this token's admin "
                f"globs ({globs or 'none'}); a scoped token may {action} only a pattern that "
                "starts with ^ and the fixed text of one of its globs (e.g. ^billing\\. for "
                'billing.*), any other needs a token with admin = ["*"]'
            )
        self.require_dead_letter_to(policy.definition)


def _digest(token: TokenConfig) -> bytes:
    return bytes.fromhex(token.token_sha256 or token_sha256(token.token or ""))


def principal_for(request: Request, auth: AuthConfig) -> Principal:
    """The caller of ``request``: its bearer token must be one of the configured ones. The
    scheme word is case-insensitive (RFC 7235: ``bearer`` works as ``Bearer``)."""
    if not auth.tokens:
        return Principal(None)
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
