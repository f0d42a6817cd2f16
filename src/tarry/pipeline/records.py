"""From an input row to a send as the HTTP API takes it, and back to JSON for the wire.

This is input decoding, not validation: it turns what a data lake holds (CSV strings, Parquet
maps, binary bodies, JSON-text headers) into the JSON shapes ``parse_send`` reads, and leaves every
rule to ``tarry.model``. A value it cannot decode becomes the same ``invalid_argument`` the API
would give for it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import orjson

from tarry.client._base import body_fields
from tarry.errors import InvalidArgument
from tarry.model.time import whole_number

__all__ = ["DERIVED_PREFIX", "decode_row", "derived_message_id", "record_json"]

#: How every derived message_id begins (a given one may begin so too).
DERIVED_PREFIX = "imp-"

_INT_FIELDS = ("delay_ms", "ttl_ms")
_BOOL_FIELDS = ("retain", "persistent")
_TRUE = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _whole(value: Any) -> Any:
    """CSV gives strings and pandas gives floats for whole numbers: read those as int; leave
    anything else for the rules to refuse."""
    if isinstance(value, str) and (number := whole_number(value)) is not None:
        return number
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _headers(value: Any) -> Any:
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            raise InvalidArgument(
                'headers is not valid JSON; write an object of strings, e.g. {"k": "v"}'
            ) from None
    elif isinstance(value, list):  # an Arrow map reads back as key/value pairs
        value = dict(value)
    return value


def decode_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """One input row (already renamed to send fields) as a send dict: nulls left out, CSV
    strings of numbers and booleans read, a binary body as ``body`` or ``body_base64``."""
    data = {k: v for k, v in row.items() if v is not None}
    for key in _INT_FIELDS:
        if key in data:
            data[key] = _whole(data[key])
    if "deliver_at" in data:
        data["deliver_at"] = _whole(data["deliver_at"])
    for key in _BOOL_FIELDS:
        value = data.get(key)
        if isinstance(value, str) and value.strip().lower() in _TRUE:
            data[key] = _TRUE[value.strip().lower()]
    if "headers" in data:
        data["headers"] = _headers(data["headers"])
    body = data.get("body")
    if isinstance(body, bytes | bytearray):
        del data["body"]
        data.update(body_fields(bytes(body)))
    return data


def derived_message_id(data: Mapping[str, Any]) -> str:
    """A message_id for a row that has none: a hash of the row's content, so that running the
    same import again finds the messages the first run stored (the server de-duplicates on
    (destination, message_id))."""
    content = record_json({k: v for k, v in data.items() if k != "message_id"})
    return DERIVED_PREFIX + hashlib.blake2b(content, digest_size=16).hexdigest()


def _default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return body_fields(bytes(value)).popitem()[1]
    return str(value)


def record_json(data: Mapping[str, Any]) -> bytes:
    """The send as canonical JSON (sorted keys): what the online sink posts and rejects keep."""
    return orjson.dumps(data, option=orjson.OPT_SORT_KEYS, default=_default)
