"""The AMQP ingress acts as a token (``rabbitmq.ingress_token``): its messages go through the
same send rules as ``POST /v1/messages`` with that token, so a tenant's ingress cannot reach
another tenant's names. The broker's side (refused messages on the dead-letter exchange) is in
tests/transports/test_amqp_ingress.py."""

from __future__ import annotations

from typing import Any

import pytest

from tarry.config import load_config
from tarry.engine.lifecycle import ingress_sends
from tarry.engine.types import SendResult
from tarry.errors import InvalidArgument, NotAuthorized


@pytest.fixture
def engine_store() -> str:
    return "sqlite"  # the rule is the send path's, the same on every store


TOKENS = {
    "tokens": [
        {"token": "ingress-secret", "name": "billing-ingress", "send": ["billing.*"]},
        {"token": "root-secret", "name": "root", "send": ["*"], "admin": ["*"]},
    ]
}


async def test_the_ingress_sends_only_where_its_token_may(make_engine: Any) -> None:
    engine = await make_engine(
        {
            "auth": TOKENS,
            "rabbitmq": {"ingress_token": "billing-ingress"},
            "queues": {"billing.q": {}, "orders.q": {}},
        }
    )
    send = ingress_sends(engine.config, engine.send_batch)
    results = await send(
        [
            {"destination": "billing.q", "body": "mine"},
            {"destination": "orders.q", "body": "theirs"},
            # reply_to is checked too, as for the HTTP API
            {
                "destination": "billing.q",
                "body": "report to them",
                "reply_to": "orders.q",
                "report": ["expiration"],
                "ttl_ms": 1000,
            },
        ]
    )
    assert isinstance(results[0], SendResult)
    assert isinstance(results[1], NotAuthorized)
    assert "may not send to 'orders.q'" in results[1].message
    assert isinstance(results[2], NotAuthorized) and "orders.q" in results[2].message
    # Nothing reached the other tenant's queue
    assert (await engine.receive("orders.q", wait_ms=0)) == []


async def test_without_tokens_the_ingress_is_unchecked(make_engine: Any) -> None:
    engine = await make_engine({"queues": {"billing.q": {}, "orders.q": {}}})
    send = ingress_sends(engine.config, engine.send_batch)
    results = await send([{"destination": "orders.q", "body": "x"}])
    assert isinstance(results[0], SendResult)


@pytest.mark.parametrize(
    ("rabbitmq", "says"),
    [
        ({"ingress": True}, "needs rabbitmq.ingress_token"),
        ({"ingress": True, "ingress_token": "nobody"}, "'nobody' must name exactly one"),
        ({"ingress_token": "nobody"}, "token names: 'billing-ingress', 'root'"),
    ],
)
def test_an_ingress_on_a_token_server_must_name_one_token(rabbitmq, says) -> None:
    with pytest.raises(InvalidArgument, match=says):
        load_config(overrides={"auth": TOKENS, "rabbitmq": rabbitmq})


def test_a_token_name_given_twice_cannot_be_the_ingress() -> None:
    tokens = {"tokens": [{"token": "a", "name": "x"}, {"token": "b", "name": "x"}]}
    with pytest.raises(InvalidArgument, match=r"\(2 do"):
        load_config(overrides={"auth": tokens, "rabbitmq": {"ingress_token": "x"}})
    with pytest.raises(InvalidArgument, match=r"\(0 do; token names: none\)"):
        load_config(overrides={"rabbitmq": {"ingress_token": "x"}})
