"""Signed webhook deliveries (Standard Webhooks) from a real ``tarry serve`` to a real receiver
on a loopback port, verified with the specification's reference library (``standardwebhooks``),
as a receiver would."""

from __future__ import annotations

import base64
import hashlib
import hmac

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tarry import Client
from tests.e2e.receiver import Attempt, Receiver, new_secret, wait_until


def verifies(secret: str, attempt: Attempt) -> bool:
    try:
        Webhook(secret).verify(attempt.body, attempt.headers, json_parse=False)
    except WebhookVerificationError:
        return False
    return True


def test_a_delivery_verifies_with_the_reference_library_and_carries_the_message_id(
    server, receiver
) -> None:
    # Given a route with a secret
    secret = new_secret()
    with Client(server.url) as client:
        client.put_route("hooks.signed", transport="http", url=receiver.url, secrets=[secret])
        # When a JSON message is delivered to it
        sent = client.send("hooks.signed", '{"order": 42}', delay="200ms")
        wait_until(lambda: receiver.accepted)
    [attempt] = receiver.accepted
    # Then the reference library verifies it, and webhook-id is the message's id
    assert Webhook(secret).verify(attempt.body, attempt.headers) == {"order": 42}
    assert attempt.headers["webhook-id"] == sent.id
    assert abs(int(attempt.headers["webhook-timestamp"]) * 1000 - attempt.at_ms) < 5_000
    # And a receiver with another secret, or a changed body, does not
    assert not verifies(new_secret(), attempt)
    tampered = Attempt(attempt.at_ms, attempt.path, attempt.headers, b'{"order": 43}', 200)
    assert not verifies(secret, tampered)


def test_an_unsigned_route_sends_no_signature(server, receiver) -> None:
    with Client(server.url) as client:
        client.put_route("hooks.plain", transport="http", url=receiver.url)
        client.send("hooks.plain", "x")
        wait_until(lambda: receiver.accepted)
    assert "webhook-signature" not in receiver.accepted[0].headers


def test_rotation_old_and_new_secrets_both_verify_until_the_old_one_is_dropped(
    server, receiver
) -> None:
    old, new = new_secret(), new_secret()
    with Client(server.url) as client:
        # Given receivers that still hold the old secret, and some that hold the new one
        client.put_route("hooks.rot", transport="http", url=receiver.url, secrets=[old])
        client.send("hooks.rot", "before")
        wait_until(lambda: len(receiver.accepted) == 1)
        # When the new secret is added beside the old one (the rotation window)
        client.put_route("hooks.rot", transport="http", url=receiver.url, secrets=[new, old])
        client.send("hooks.rot", "during")
        wait_until(lambda: len(receiver.accepted) == 2)
        # And then the old one is dropped
        client.put_route("hooks.rot", transport="http", url=receiver.url, secrets=[new])
        client.send("hooks.rot", "after")
        wait_until(lambda: len(receiver.accepted) == 3)
    before, during, after = receiver.accepted
    # Then during the window both verify, each with its own signature in the header
    assert verifies(old, before) and not verifies(new, before)
    assert verifies(old, during) and verifies(new, during)
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    assert verifies(new, after) and not verifies(old, after)


def test_redelivery_after_a_receiver_outage_keeps_the_same_webhook_id(make_server) -> None:
    # Given a receiver that fails the first attempt with 503 and then goes away altogether
    first = Receiver(statuses=[503])
    port = first.port
    secret = new_secret()
    server = make_server(
        "[dispatch]\nnumber_of_retries = 50\nretry_backoff_ms = 100\nretry_backoff_max_ms = 300\n"
    )
    with Client(server.url) as client:
        client.put_route("hooks.out", transport="http", url=first.url, secrets=[secret])
        sent = client.send("hooks.out", "survives")
        wait_until(lambda: first.attempts)
        first.close()
        # While nothing listens, attempts fail to connect and the message waits
        wait_until(lambda: client.get(sent.id).raw["failures"] >= 3)
        assert client.get(sent.id).state == "scheduled"
        # When the receiver comes back on the same port
        second = Receiver(port=port)
        try:
            wait_until(lambda: second.accepted)
            wait_until(lambda: client.get(sent.id).state == "delivered")
        finally:
            second.close()
    # Then every attempt it saw carried the same webhook-id (a receiver de-duplicates on it),
    # each signed afresh (its own timestamp) and each verifying
    seen = first.attempts + second.accepted
    assert {a.headers["webhook-id"] for a in seen} == {sent.id}
    assert all(verifies(secret, a) for a in seen)
    assert [a.body for a in second.accepted] == [b"survives"]


def test_a_body_that_is_not_utf8_is_signed_over_its_bytes(server, receiver) -> None:
    secret = new_secret()
    body = bytes(range(256))
    with Client(server.url) as client:
        client.put_route("hooks.bin", transport="http", url=receiver.url, secrets=[secret])
        client.send("hooks.bin", body)
        wait_until(lambda: receiver.accepted)
    [attempt] = receiver.accepted
    assert attempt.body == body
    # The specification's construction, computed here independently of tarry and the library
    # (whose verify takes text only)
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{attempt.headers['webhook-id']}.{attempt.headers['webhook-timestamp']}.".encode()
    expected = base64.b64encode(hmac.new(key, signed + body, hashlib.sha256).digest()).decode()
    assert attempt.headers["webhook-signature"] == f"v1,{expected}"
