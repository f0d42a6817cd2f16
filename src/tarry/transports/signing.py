"""Signed webhook deliveries per the Standard Webhooks specification, with its reference
library (``standardwebhooks``).

Each delivery carries ``webhook-id`` (the message's ``id``: the same on every attempt, so a
receiver de-duplicates retries), ``webhook-timestamp`` (seconds, the attempt's time: receivers
refuse one more than 5 minutes off) and ``webhook-signature``: ``v1,<base64 HMAC-SHA256 of
"id.timestamp.body">`` once per secret, space-separated. Several secrets are how a secret is
rotated: while both are listed a receiver holding either verifies every delivery.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook, hmac_data

from tarry.model.route_rules import check_secrets, webhook_key

__all__ = ["Signer"]


class Signer:
    """Signs for one route's secrets (each parsed once, not per delivery)."""

    def __init__(self, secrets: Sequence[str]) -> None:
        check_secrets(secrets)
        self._hooks = [Webhook(secret) for secret in secrets]
        self._keys = [webhook_key(secret) for secret in secrets]

    def headers(self, message_id: str, timestamp_s: int, body: bytes) -> dict[str, str]:
        """The three headers for one attempt at delivering ``body``."""
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            signatures = [_sign_bytes(key, message_id, timestamp_s, body) for key in self._keys]
        else:
            at = datetime.fromtimestamp(timestamp_s, tz=UTC)
            signatures = [hook.sign(message_id, at, text) for hook in self._hooks]
        return {
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp_s),
            "webhook-signature": " ".join(signatures),
        }


def _sign_bytes(key: bytes, message_id: str, timestamp_s: int, body: bytes) -> str:
    # The reference library signs text; the specification signs the body's bytes, which for a
    # body that is not UTF-8 (sent as body_base64) only this form can.
    digest = hmac_data(key, f"{message_id}.{timestamp_s}.".encode() + body)
    return f"v1,{base64.b64encode(digest).decode()}"
