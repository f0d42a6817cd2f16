"""What a route's address and its webhook secrets must look like, checked once here for the
routes of ``tarry.toml`` and those put at run time (``PUT /v1/routes/{name}``) alike.

Secrets follow the Standard Webhooks specification: ``whsec_`` then the key in base64, 24 to 64
bytes of it. Error messages never repeat a secret or a URL's credentials.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

from tarry.errors import InvalidArgument

__all__ = [
    "MAX_SECRETS",
    "SECRET_PREFIX",
    "check_route_headers",
    "check_route_url",
    "check_secrets",
    "secret_fingerprint",
    "webhook_key",
]

#: The URL schemes each transport speaks.
URL_SCHEMES: dict[str, tuple[str, ...]] = {"http": ("http", "https"), "rabbitmq": ("amqp", "amqps")}
SECRET_PREFIX = "whsec_"
#: The specification's bounds for a key (it recommends 24 to 64 bytes).
MIN_KEY_BYTES, MAX_KEY_BYTES = 24, 64
#: Secrets signing at once: rotation needs two; a few more leave room, hundreds would make every
#: delivery pay for them.
MAX_SECRETS = 5


def check_route_url(transport: str, url: str) -> str:
    """``url`` if ``transport`` can reach it: a scheme it speaks and a host. Raises
    ``invalid_argument`` saying what to write instead."""
    schemes = URL_SCHEMES.get(transport, ())
    shown = " or ".join(f"{s}://" for s in schemes)
    if any(c.isspace() or ord(c) < 0x20 for c in url):
        raise InvalidArgument(f"route url must not contain spaces or control characters; {shown}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise InvalidArgument(f"route url is not a valid URL ({exc}); write {shown}host") from None
    if parts.scheme.lower() not in schemes:
        raise InvalidArgument(
            f"route url must start with {shown} for transport {transport!r} "
            f"(got {parts.scheme + '://' if parts.scheme else 'no scheme'})"
        )
    if not parts.hostname:
        raise InvalidArgument(f"route url has no host; write {schemes[0]}://host[:port]/...")
    return url


#: An HTTP header name (RFC 9110 ``token``).
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def check_route_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers an HTTP route may add to each delivery: names that are tokens, values without
    line breaks or NUL (httpx would refuse them at every delivery instead). The error names the
    header, never its value (it may be a credential)."""
    for name, value in headers.items():
        if not _HEADER_NAME.fullmatch(name):
            raise InvalidArgument(
                f"route header name {name!r} is not valid; use letters, digits and -"
            )
        if any(c in value for c in "\r\n\0"):
            raise InvalidArgument(
                f"route header {name!r} has a line break or NUL in its value; remove it"
            )
    return dict(headers)


def webhook_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_…`` secret; raises ``invalid_argument`` for anything else."""
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise InvalidArgument(
            f"each route secret must start with {SECRET_PREFIX} followed by base64 "
            "(tarry route secret prints a new one)"
        )
    encoded = secret[len(SECRET_PREFIX) :]
    try:
        # Unpadded base64 is accepted, as the Standard Webhooks libraries accept it.
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument(
            f"a route secret is not {SECRET_PREFIX} followed by base64 "
            "(tarry route secret prints a new one)"
        ) from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise InvalidArgument(
            f"a route secret holds {len(key)} bytes; use {MIN_KEY_BYTES} to {MAX_KEY_BYTES} "
            "random bytes (tarry route secret prints a new one)"
        )
    return key


def check_secrets(secrets: Sequence[str]) -> list[str]:
    """Each secret valid, none twice, at most ``MAX_SECRETS``."""
    if len(secrets) > MAX_SECRETS:
        raise InvalidArgument(
            f"a route has at most {MAX_SECRETS} secrets ({len(secrets)} given); two are enough "
            "to rotate: the new one and the one being retired"
        )
    keys = [webhook_key(s) for s in secrets]
    if len(set(keys)) != len(keys):
        raise InvalidArgument("a route secret is given twice; list each secret once")
    return list(secrets)


def secret_fingerprint(secret: str) -> str:
    """What ``GET /v1/routes`` and the logs show for a secret: its prefix and the first 8 hex
    digits of its SHA-256 (enough to tell two apart while rotating; nothing to sign with)."""
    return f"{SECRET_PREFIX}…redacted (sha256 {hashlib.sha256(secret.encode()).hexdigest()[:8]})"
