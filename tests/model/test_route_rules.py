"""What a route's URL and webhook secrets must look like (the one place both are checked)."""

from __future__ import annotations

import base64

import pytest

from tarry.config import RouteConfig
from tarry.errors import InvalidArgument
from tarry.model.route_rules import (
    check_route_url,
    check_secrets,
    secret_fingerprint,
    webhook_key,
)

KEY = bytes(range(32))
SECRET = "whsec_" + base64.b64encode(KEY).decode()


@pytest.mark.parametrize(
    ("transport", "url"),
    [
        ("http", "http://127.0.0.1:8080/hook"),
        ("http", "HTTPS://example.com/hooks?x=1"),
        ("http", "http://[::1]:9000/"),
        ("rabbitmq", "amqp://guest:guest@127.0.0.1:5672/"),
        ("rabbitmq", "amqps://broker.internal/vhost"),
    ],
)
def test_a_url_with_the_transports_scheme_and_a_host_is_accepted(transport, url) -> None:
    assert check_route_url(transport, url) == url


@pytest.mark.parametrize(
    ("transport", "url", "says"),
    [
        ("http", "example.com/hook", "no scheme"),
        ("http", "ftp://example.com/", "http:// or https://"),
        ("http", "amqp://h/", "http:// or https://"),
        ("rabbitmq", "https://h/", "amqp:// or amqps://"),
        ("http", "http://", "no host"),
        ("http", "http://user:pw@:80/", "no host"),
        ("http", "http://h:70000/", "not a valid URL"),
        ("http", "http://[::1/", "not a valid URL"),
        ("http", "http://h/a b", "spaces"),
    ],
)
def test_a_url_the_transport_cannot_reach_is_refused_saying_why(transport, url, says) -> None:
    with pytest.raises(InvalidArgument, match=says) as refused:
        check_route_url(transport, url)
    assert "pw" not in refused.value.message  # credentials are never repeated


def test_a_secret_is_whsec_and_base64_of_24_to_64_bytes_padded_or_not() -> None:
    assert webhook_key(SECRET) == KEY
    assert webhook_key(SECRET.rstrip("=")) == KEY
    for bad, says in [
        ("c2VjcmV0", "start with whsec_"),
        ("whsec_***", "base64"),
        ("whsec_" + base64.b64encode(b"x" * 23).decode(), "23 bytes"),
        ("whsec_" + base64.b64encode(b"x" * 65).decode(), "65 bytes"),
    ]:
        with pytest.raises(InvalidArgument, match=says) as refused:
            webhook_key(bad)
        assert bad not in refused.value.message


def test_a_route_takes_a_few_distinct_secrets() -> None:
    other = "whsec_" + base64.b64encode(bytes(range(1, 33))).decode()
    assert check_secrets([SECRET, other]) == [SECRET, other]
    with pytest.raises(InvalidArgument, match="twice"):
        check_secrets([SECRET, SECRET.rstrip("=")])
    with pytest.raises(InvalidArgument, match="at most 5"):
        check_secrets([SECRET] * 6)


def test_a_route_shows_secrets_as_fingerprints_and_hides_credentials() -> None:
    route = RouteConfig(
        transport="http",
        url="https://u:pw@example.com/h",
        secrets=[SECRET],
        headers={"authorization": "Bearer t"},
    )
    shown = route.redacted()
    assert shown["secrets"] == [secret_fingerprint(SECRET)]
    assert SECRET not in repr(shown) and "pw" not in shown["url"] and "Bearer" not in repr(shown)
    assert secret_fingerprint(SECRET) != secret_fingerprint(SECRET[:-2] + "A=")


def test_a_route_body_is_refused_with_every_problem_named() -> None:
    with pytest.raises(InvalidArgument) as refused:
        RouteConfig.parse("r", {"transport": "http", "url": "ftp://h/", "timeout_ms": -1})
    assert "timeout_ms" in refused.value.message and "http://" in refused.value.message
    with pytest.raises(InvalidArgument, match="JSON object"):
        RouteConfig.parse("r", ["http"])
