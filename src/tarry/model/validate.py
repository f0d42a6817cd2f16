"""The one place that knows the send-time rules. The HTTP API, the AMQP ingress, the Spark import
and the CLI (through the server) all end here.

Rules, in the order they are checked (the first that fails is reported):

1. syntax: field types, names, sizes of ids, ``delay_ms`` xor ``deliver_at``,
   ``report`` needs ``reply_to``                                          → ``invalid_argument``
2. ``group_id`` or ``retain`` together with a non-zero delay              → ``options_error``
3. the delay is at most 2^28 − 1 s                                        → ``invalid_argument``
4. ``ttl_ms < delay_ms`` (both non-zero)                                  → ``expiry_error``
5. the token may send to the destination                                  → ``not_authorized``
6. the destination exists                                                 → ``unknown_destination``
7. every target queue is put-enabled                                      → ``put_disabled``
8. the body fits the server's and every target queue's limit              → ``message_too_large``
9. no target queue is full under ``overflow = reject_publish``            → ``destination_full``
   no target queue's consumers are further behind than ``[dispatch] overload_lag_ms``
   (its delivery lag)                                                     → ``overloaded``
10. with a ``report``, the token may send to ``reply_to`` (the reports go there; checked per
    send, so in a batch only that send is refused)                         → ``not_authorized``

A topic's targets are its subscribed queues at send time (JMS: only subscriptions that exist at
send); the publish is refused as a whole when any copy would be.

The rules themselves are tables in ``tarry.model.rules``, shared with the column-wise form
(``tarry.model.columns``) that checks whole Arrow batches; this module applies them to one send.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tarry.errors import ExpiryError, InvalidArgument
from tarry.model.fields import field_names
from tarry.model.message import (
    MAX_DELAY_MS,
    NO_REPORT,
    Report,
    SendPlan,
    SendRequest,
    Undeliverable,
)
from tarry.model.rules import (
    BOTH_TIMES,
    DESTINATION_REQUIRED,
    MAX_ID_CHARS,
    REPLY_TO_ALLOWED,
    TIME_RULES,
    Rule,
    destination_rules,
    first_failure,
    id_rules,
    ms_rules,
)
from tarry.model.time import parse_instant_ms

__all__ = [
    "DestinationView",
    "SendLimits",
    "TargetView",
    "check_name",
    "parse_send",
    "validate_send",
]

#: Used with ``fullmatch``: ``$`` with ``match`` also matches before a trailing newline.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:@\-]{0,199}")
_MAX_ID_CHARS = MAX_ID_CHARS
#: Names already found valid (destinations repeat; the regex is the costly part).
_GOOD_NAMES: set[str] = set()
_MAX_HEADERS = 256
_MAX_HEADER_CHARS = 4096

#: Every field a send may carry (the table in ``tarry.model.fields``).
SEND_FIELDS = field_names()


@dataclass(frozen=True, slots=True)
class SendLimits:
    """Server-wide limits that apply to every send."""

    max_message_bytes: int = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class TargetView:
    """What the rules need to know of one queue a send would land in."""

    name: str
    put_enabled: bool = True
    max_message_bytes: int | None = None
    #: True when the queue is at ``max_length`` and its overflow is ``reject_publish``.
    full: bool = False
    #: Its delivery lag (``tarry.queues.lag``), and the limit above which sends to it are
    #: refused (``tarry.queues.lag.refusal_limit_ms``; 0: never).
    lag_ms: int = 0
    lag_limit_ms: int = 0


@dataclass(frozen=True, slots=True)
class DestinationView:
    """A destination as the rules see it: ``kind`` is None when it does not exist."""

    name: str
    kind: str | None
    targets: tuple[TargetView, ...] = ()


def check_name(name: object, *, field: str = "name") -> str:
    """A queue, topic or destination name: 1–200 of letters, digits and ``._:@-``."""
    if isinstance(name, str) and name in _GOOD_NAMES:
        return name
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgument(
            f"{field} {name!r} is not a valid name; use 1 to 200 letters, digits or . _ : @ -, "
            "not starting with a punctuation mark"
        )
    if len(_GOOD_NAMES) < 100_000:
        _GOOD_NAMES.add(name)
    return name


def _opt_str(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    text = isinstance(value, str)
    error = first_failure(
        id_rules(key), length=len(value) if text else -1, has_nul=text and "\x00" in value
    )
    if error is not None:
        raise error
    return value  # type: ignore[no-any-return]


def _opt_int(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    not_int = isinstance(value, bool) or not isinstance(value, int)
    error = first_failure(ms_rules(key), not_int=not_int, value=value)
    if error is not None:
        raise error
    return value  # type: ignore[no-any-return]


def _bool(data: Mapping[str, Any], key: str, default: bool) -> bool:
    value = data.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidArgument(f"{key} must be true or false, got {value!r}")
    return value


def _headers(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgument("headers must be an object of string keys to string values")
    if len(value) > _MAX_HEADERS:
        raise InvalidArgument(f"headers has {len(value)} entries; at most {_MAX_HEADERS} allowed")
    headers: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key or not isinstance(item, str):
            raise InvalidArgument(
                f"header {key!r} must map a non-empty string key to a string value"
            )
        if len(key) + len(item) > _MAX_HEADER_CHARS:
            raise InvalidArgument(f"header {key!r} is longer than {_MAX_HEADER_CHARS} characters")
        headers[key] = item
    return headers


def _body(data: Mapping[str, Any]) -> bytes:
    text, encoded = data.get("body"), data.get("body_base64")
    if text is not None and encoded is not None:
        raise InvalidArgument("give body or body_base64, not both")
    if encoded is not None:
        if not isinstance(encoded, str):
            raise InvalidArgument("body_base64 must be a base64 string")
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument("body_base64 is not valid base64") from None
    if text is None:
        return b""
    if isinstance(text, bytes):
        return text
    if not isinstance(text, str):
        raise InvalidArgument("body must be UTF-8 text; send binary data as body_base64")
    return text.encode("utf-8")


def _report(value: Any) -> frozenset[Report]:
    if value is None:
        return NO_REPORT
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple | set | frozenset):
        raise InvalidArgument("report must be a list of 'expiration' and/or 'exception'")
    try:
        return frozenset(Report(v) for v in value)
    except ValueError:
        raise InvalidArgument(
            f"report {value!r} names an unknown report; use 'expiration' and/or 'exception'"
        ) from None


def parse_send(data: Mapping[str, Any]) -> SendRequest:
    """Turn a JSON-shaped send (HTTP body, AMQP headers, a Spark row) into a ``SendRequest``.

    Checks only syntax; ``validate_send`` applies the rules. (Hot path: fields that are absent
    cost one dict lookup each.)"""
    if not isinstance(data, Mapping):
        raise InvalidArgument("a message must be a JSON object")
    if not SEND_FIELDS.issuperset(data):
        unknown = set(data) - SEND_FIELDS
        raise InvalidArgument(
            f"unknown message field(s) {', '.join(sorted(unknown))}; "
            f"allowed: {', '.join(sorted(SEND_FIELDS))}"
        )
    get = data.get
    destination = get("destination")
    if destination is None:
        raise DESTINATION_REQUIRED.refuse()
    check_name(destination, field="destination")
    delay_ms = None if get("delay_ms") is None else _opt_int(data, "delay_ms")
    deliver_at_raw = get("deliver_at")
    if delay_ms is not None and deliver_at_raw is not None:
        raise BOTH_TIMES.refuse()
    deliver_at_ms = (
        None if deliver_at_raw is None else parse_instant_ms(deliver_at_raw, field="deliver_at")
    )
    report = _report(get("report"))
    reply_to = None if get("reply_to") is None else _opt_str(data, "reply_to")
    if reply_to is not None:
        check_name(reply_to, field="reply_to")
    if report and reply_to is None:
        raise InvalidArgument("report needs reply_to: name the queue that receives the reports")
    undeliverable = get("on_undeliverable")
    if undeliverable is None:
        on_undeliverable = Undeliverable.DEAD_LETTER
    else:
        try:
            on_undeliverable = Undeliverable(undeliverable)
        except ValueError:
            raise InvalidArgument(
                f"on_undeliverable {undeliverable!r} is unknown; use 'dead_letter' or 'discard'"
            ) from None
    return SendRequest(
        destination=destination,
        body=_body(data),
        headers=_headers(get("headers")),
        delay_ms=delay_ms,
        deliver_at_ms=deliver_at_ms,
        ttl_ms=None if get("ttl_ms") is None else _opt_int(data, "ttl_ms"),
        message_id=None if get("message_id") is None else _opt_str(data, "message_id"),
        correlation_id=None if get("correlation_id") is None else _opt_str(data, "correlation_id"),
        reply_to=reply_to,
        report=report,
        on_undeliverable=on_undeliverable,
        group_id=None if get("group_id") is None else _opt_str(data, "group_id"),
        retain=False if get("retain") is None else _bool(data, "retain", False),
        persistent=True if get("persistent") is None else _bool(data, "persistent", True),
    )


def plan_times(request: SendRequest, *, now_ms: int) -> SendPlan:
    """Rules 2–4: when the message falls due and when it expires. No destination needed."""
    if request.delay_ms is not None and request.deliver_at_ms is not None:
        raise BOTH_TIMES.refuse()
    if request.deliver_at_ms is not None:
        delay_ms = max(0, request.deliver_at_ms - now_ms)  # a time in the past means "now"
    else:
        delay_ms = request.delay_ms or 0
    ttl_ms = request.ttl_ms
    error = first_failure(
        TIME_RULES,
        delay_ms=delay_ms,
        ttl_ms=-1 if ttl_ms is None else ttl_ms,
        grouped=request.group_id is not None,
        retain=request.retain,
    )
    if error is not None:
        raise error
    deliver_at_ms = now_ms + delay_ms
    if ttl_ms is None:
        expires_at_ms = None
    elif ttl_ms == 0:
        # TTL 0: expire on arrival unless a consumer is waiting (RabbitMQ), so it counts from
        # the moment the message reaches its queue, not from the send.
        expires_at_ms = deliver_at_ms
    else:
        expires_at_ms = now_ms + ttl_ms
    return SendPlan(
        request=request, sent_at_ms=now_ms, deliver_at_ms=deliver_at_ms, expires_at_ms=expires_at_ms
    )


def validate_send(
    request: SendRequest,
    *,
    now_ms: int,
    destination: DestinationView,
    may_send: bool = True,
    limits: SendLimits = SendLimits(),
    rules: Sequence[Rule] | None = None,
    may_send_to: Callable[[str], bool] | None = None,
) -> SendPlan:
    """Apply every send-time rule (see the module docstring) and return the plan, or raise.

    ``rules``: the destination's rules as ``destination_rules`` built them for this
    ``destination``, ``may_send`` and ``limits``; a batch builds them once per destination.
    ``may_send_to``: the token's send check for the other names the send writes to
    (``reply_to`` with reports); None: every name is allowed."""
    plan = plan_times(request, now_ms=now_ms)
    size = len(request.body)
    if rules is None:
        rules = tuple(destination_rules(destination, may_send=may_send, limits=limits))
    delay_ms = plan.deliver_at_ms - now_ms
    for rule in rules:
        if rule.fails(size=size, delay_ms=delay_ms):
            raise rule.refuse(size=size, delay_ms=delay_ms)
    reply_to = request.reply_to
    if request.report and reply_to is not None and may_send_to is not None:
        if REPLY_TO_ALLOWED.fails(refused=not may_send_to(reply_to)):
            raise REPLY_TO_ALLOWED.refuse(reply_to=reply_to)
    return plan


def check_batch_size(items: Sequence[Any], *, limit: int = 10_000) -> None:
    if not items:
        raise InvalidArgument("messages must hold at least one message")
    if len(items) > limit:
        raise InvalidArgument(
            f"a batch holds at most {limit} messages, got {len(items)}: send it in parts",
            max_batch=limit,
        )


def validate_reschedule(data: Mapping[str, Any], *, now_ms: int, expires_at_ms: int | None) -> int:
    """The new due time of a reschedule: ``{"delay_ms"}`` from now or ``{"deliver_at"}``. It must
    stay within the maximum delay and not pass the message's expiry (which still counts from
    the original send)."""
    if not isinstance(data, Mapping):
        raise InvalidArgument('send {"delay_ms": N} or {"deliver_at": TIME}')
    unknown = set(data) - {"delay_ms", "deliver_at"}
    if unknown:
        raise InvalidArgument(
            f"unknown field(s) {', '.join(sorted(unknown))}; use delay_ms or deliver_at"
        )
    delay_ms = _opt_int(data, "delay_ms")
    at = data.get("deliver_at")
    if delay_ms is not None and at is None:
        deliver_at_ms = now_ms + delay_ms
    elif at is not None and delay_ms is None:
        deliver_at_ms = max(now_ms, parse_instant_ms(at, field="deliver_at"))
    else:
        raise InvalidArgument("give exactly one of delay_ms or deliver_at")
    if deliver_at_ms - now_ms > MAX_DELAY_MS:
        raise InvalidArgument(
            f"the delay ({deliver_at_ms - now_ms} ms) is longer than the maximum of "
            f"{MAX_DELAY_MS} ms (2^28 - 1 s); shorten it"
        )
    if expires_at_ms is not None and deliver_at_ms > expires_at_ms:
        raise ExpiryError(
            f"the new due time {deliver_at_ms} is after the message expires ({expires_at_ms}); "
            "choose an earlier time"
        )
    return deliver_at_ms
