"""``Signer`` against the Standard Webhooks reference library's ``Webhook.verify`` (the
integration test of the same path, through a real server and receiver, is
tests/e2e/test_webhook_signing.py)."""

from __future__ import annotations

import base64
import time

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tarry.transports.signing import Signer

OLD = "whsec_" + base64.b64encode(bytes(range(32))).decode()
NEW = "whsec_" + base64.b64encode(bytes(range(100, 140))).decode()


def test_each_secret_signs_and_either_verifies() -> None:
    now_s = int(time.time())
    headers = Signer([NEW, OLD]).headers("01MSGID", now_s, b'{"a": 1}')
    assert headers["webhook-id"] == "01MSGID" and headers["webhook-timestamp"] == str(now_s)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (NEW, OLD):
        assert Webhook(secret).verify(b'{"a": 1}', headers) == {"a": 1}


def test_a_signature_is_bound_to_the_id_the_time_and_the_body() -> None:
    now_s = int(time.time())
    headers = Signer([OLD]).headers("01MSGID", now_s, b"body")
    for changed in (
        {**headers, "webhook-id": "01OTHER"},
        {**headers, "webhook-timestamp": str(now_s + 1)},
    ):
        with pytest.raises(WebhookVerificationError):
            Webhook(OLD).verify(b"body", changed, json_parse=False)
    with pytest.raises(WebhookVerificationError):
        Webhook(OLD).verify(b"bodY", headers, json_parse=False)
    old = Signer([OLD]).headers("01MSGID", now_s - 600, b"body")
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(OLD).verify(b"body", old, json_parse=False)
