"""Tokens and the names they reach, below the HTTP server (the server runs in
``tests/e2e/test_tenant_isolation.py``)."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest
from starlette.requests import Request

from tarry.config import AuthConfig, TokenConfig
from tarry.errors import Unauthenticated
from tarry.server.auth import Principal, principal_for


def test_finding_02_scoped_admin_may_set_only_patterns_inside_its_globs() -> None:
    scoped = Principal(TokenConfig(token="t", admin=["billing.*", "x?.*", "[ab]*"]))
    assert scoped.may_set_pattern(r"^billing\.")
    assert scoped.may_set_pattern(r"^billing\.eu\.(a+)$")
    assert not scoped.may_set_pattern(r"^billing")  # "billingfoo" is outside billing.*
    assert not scoped.may_set_pattern(r"^x1\.")  # globs with wildcards before the end: no proof
    assert not scoped.may_set_pattern(r"^a")
    assert not scoped.may_set_pattern(r".*")
    assert Principal(TokenConfig(token="t", admin=["*"])).may_set_pattern(r".*")
    assert Principal(None).may_set_pattern(r".*")


def test_finding_11_tokens_compared_with_compare_digest_over_every_token(monkeypatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    tokens = AuthConfig(
        tokens=[TokenConfig(token=f"secret-{i}", name=f"t{i}") for i in range(3)]
        + [TokenConfig(token_sha256=hashlib.sha256(b"hashed").hexdigest(), name="h")]
    )

    def request(value: str) -> Request:
        header = [(b"authorization", f"Bearer {value}".encode())]
        return Request({"type": "http", "headers": header, "method": "GET", "path": "/"})

    # The first token matches: the other three are still compared (no early exit).
    assert principal_for(request("secret-0"), tokens).token.name == "t0"  # type: ignore[union-attr]
    assert len(calls) == 4
    assert all(isinstance(a, bytes) and len(a) == len(b) == 32 for a, b in calls)
    calls.clear()
    assert principal_for(request("hashed"), tokens).token.name == "h"  # type: ignore[union-attr]
    assert len(calls) == 4
    calls.clear()
    with pytest.raises(Unauthenticated):
        principal_for(request("secret-"), tokens)
    assert len(calls) == 4


def test_a_route_may_report_its_failures_only_where_the_token_may_send() -> None:
    from tarry.errors import NotAuthorized
    from tarry.model.route_policy import RoutePolicy

    billing = Principal(TokenConfig(token="t", send=["billing.*"], admin=["billing.*"]))
    billing.require_route_policy(RoutePolicy(on_failure_report_to="billing.failures"))
    billing.require_route_policy(RoutePolicy())
    with pytest.raises(NotAuthorized, match="may not report route failures to 'ops.failures'"):
        billing.require_route_policy(RoutePolicy(on_failure_report_to="ops.failures"))


def test_configured_tokens_are_hashed_once_and_presented_ones_never_kept() -> None:
    from tarry.server.auth import _digest_of

    tokens = AuthConfig(tokens=[TokenConfig(token="kept-secret", name="k")])

    def request(value: str) -> Request:
        header = [(b"authorization", f"Bearer {value}".encode())]
        return Request({"type": "http", "headers": header, "method": "GET", "path": "/"})

    _digest_of.cache_clear()
    assert principal_for(request("kept-secret"), tokens).token.name == "k"  # type: ignore[union-attr]
    for guess in range(20):
        with pytest.raises(Unauthenticated):
            principal_for(request(f"guess-{guess}"), tokens)
    # Only the configured token's digest is kept, whatever was presented.
    assert _digest_of.cache_info().currsize == 1
    # Another configuration's token is its own: the old secret no longer passes.
    rotated = AuthConfig(tokens=[TokenConfig(token="new-secret", name="k")])
    with pytest.raises(Unauthenticated):
        principal_for(request("kept-secret"), rotated)
    assert principal_for(request("new-secret"), rotated).token.name == "k"  # type: ignore[union-attr]
    assert principal_for(request("anything"), AuthConfig()) == Principal(None)
