"""The send-time rules as tables: each rule is its error type, a test of the facts it needs, and
the message it gives. ``validate.py`` runs them on one send (Python scalars) and ``columns.py``
on whole Arrow batches (numpy arrays); there is no second copy of any rule.

A test may use only what means the same on a ``bool``/``int`` and on a numpy array: comparisons,
``&`` and ``|`` (never ``and``/``or``/``not``). So ``fails(delay_ms=5_000, ttl_ms=10, ...)`` is a
``bool`` and ``fails(delay_ms=array, ttl_ms=array, ...)`` is a mask, from the same expression.
A message is only ever built for one refused send, from that send's scalar facts.

Facts, by name (one send's, or a column of them):

- ``length``: a text field's length in characters, ``-1`` when it is not text;
  ``has_nul``: it holds a NUL;
- ``not_int``: a millisecond field is not a whole number (bool counts as not);
  ``value``: its value (when it is one);
- ``has_delay``/``has_at``: ``delay_ms``/``deliver_at`` given;
- ``delay_ms``: the resolved delay (``deliver_at`` in the past counts as 0);
  ``ttl_ms``: the TTL, ``-1`` when none; ``grouped``/``retain``: ``group_id`` given / ``retain``;
- ``size``: the body's length in bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from tarry.errors import (
    DestinationFull,
    ExpiryError,
    InvalidArgument,
    MessageTooLarge,
    NotAuthorized,
    OptionsError,
    Overloaded,
    PutDisabled,
    TarryError,
    UnknownDestination,
)
from tarry.model.message import MAX_DELAY_MS, MAX_INSTANT_MS, MAX_TTL_MS

if TYPE_CHECKING:
    from tarry.model.validate import DestinationView, SendLimits, TargetView

__all__ = [
    "BEHIND_HORIZON_MS",
    "BOTH_TIMES",
    "DESTINATION_REQUIRED",
    "REPLY_TO_ALLOWED",
    "MAX_ID_CHARS",
    "Rule",
    "destination_rules",
    "due_soon",
    "first_failure",
    "id_rules",
    "instant_rules",
    "ms_rules",
    "TIME_RULES",
]

MAX_ID_CHARS = 256
#: Sends due within this of now are refused while their queue's consumers are behind; one due
#: later is taken (a reminder for next week does not wait on today's backlog).
BEHIND_HORIZON_MS = 10_000


def due_soon(delay_ms: Any) -> Any:
    """Where a delay falls within ``BEHIND_HORIZON_MS``: a ``bool`` for one send, a mask for a
    column. The consumers-behind rule (``_target_rules``) and the engine's whole-request
    refusal before parsing (``engine/sending``) both ask this."""
    return delay_ms < BEHIND_HORIZON_MS


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: ``fails(**facts)`` is true where the rule refuses; ``message(**facts)`` says why
    (for one send)."""

    error: type[TarryError]
    fails: Callable[..., Any]
    message: Callable[..., str]
    #: Fields the error carries besides its message (``Overloaded``'s ``retry_after_s``).
    details: Callable[..., dict[str, Any]] | None = None

    def refuse(self, **facts: Any) -> TarryError:
        extra = self.details(**facts) if self.details is not None else {}
        return self.error(self.message(**facts), **extra)


def first_failure(rules: tuple[Rule, ...], **facts: Any) -> TarryError | None:
    """The error of the first rule (in table order) that refuses one send's ``facts``."""
    for rule in rules:
        if rule.fails(**facts):
            return rule.refuse(**facts)
    return None


# --- syntax -------------------------------------------------------------------------------------
DESTINATION_REQUIRED = Rule(
    InvalidArgument,
    lambda *, missing, **_: missing,
    lambda **_: "destination is required: name the queue or topic to deliver to",
)
BOTH_TIMES = Rule(
    InvalidArgument,
    lambda *, has_delay, has_at, **_: has_delay & has_at,
    lambda **_: "give delay_ms or deliver_at, not both",
)


@cache
def id_rules(key: str) -> tuple[Rule, ...]:
    """An optional id-like text field (``message_id``, ``group_id``, ...), when given."""
    return (
        Rule(
            InvalidArgument,
            lambda *, length, **_: (length < 1) | (length > MAX_ID_CHARS),
            lambda **_: f"{key} must be a non-empty string of at most {MAX_ID_CHARS} chars",
        ),
        # No store keeps NUL in text (PostgreSQL refuses it): say so instead of failing later.
        Rule(
            InvalidArgument,
            lambda *, has_nul, **_: has_nul,
            lambda **_: f"{key} must not contain NUL (\\x00) characters; remove them",
        ),
    )


#: The range of each span, said when a value is refused. Syntax bounds ``ttl_ms`` only:
#: ``delay_ms`` is bounded once resolved (``TIME_RULES``), where ``deliver_at`` meets it too.
_MS_RANGE = {"ttl_ms": (MAX_TTL_MS, "10 years"), "delay_ms": (MAX_DELAY_MS, "2^28 - 1 s")}


@cache
def ms_rules(key: str) -> tuple[Rule, ...]:
    """An optional span of milliseconds (``delay_ms`` or ``ttl_ms``), when given."""
    most, said = _MS_RANGE[key]
    rules = (
        Rule(
            InvalidArgument,
            lambda *, not_int, **_: not_int,
            lambda *, value, **_: (
                f"{key} must be a whole number of milliseconds, 0 to {most} ({said}), got {value!r}"
            ),
        ),
        Rule(
            InvalidArgument,
            lambda *, value, **_: value < 0,
            lambda *, value, **_: f"{key} ({value}) must not be negative",
        ),
    )
    if key == "delay_ms":
        return rules
    return (
        *rules,
        # Before any sum with "now": an int64 column would wrap, a store's field overflow.
        Rule(
            InvalidArgument,
            lambda *, value, **_: value > most,
            lambda *, value, **_: f"{key} ({value}) is out of range; use 0 to {most} ms ({said})",
        ),
    )


@cache
def instant_rules(key: str) -> tuple[Rule, ...]:
    """An instant given as epoch milliseconds (``deliver_at``)."""
    return (
        Rule(
            InvalidArgument,
            lambda *, value, **_: value < 0,
            lambda *, value, **_: f"{key} ({value}) must not be before 1970",
        ),
        Rule(
            InvalidArgument,
            lambda *, value, **_: value > MAX_INSTANT_MS,
            lambda *, value, **_: (
                f"{key} ({value}) is out of range; use epoch milliseconds from 0 to "
                f"{MAX_INSTANT_MS} (9999-12-31T23:59:59.999Z)"
            ),
        ),
    )


# --- when: rules 2-4 ----------------------------------------------------------------------------
def _options_message(*, grouped: Any, **_: Any) -> str:
    what = "group_id" if grouped else "retain"
    return (
        f"{what} cannot be combined with a delay; send grouped or retained messages "
        "without delay_ms/deliver_at"
    )


TIME_RULES = (
    Rule(
        OptionsError,
        lambda *, delay_ms, grouped, retain, **_: (delay_ms > 0) & (grouped | retain),
        _options_message,
    ),
    Rule(
        InvalidArgument,
        lambda *, delay_ms, **_: delay_ms > MAX_DELAY_MS,
        lambda *, delay_ms, **_: (
            f"the delay ({delay_ms} ms) is longer than the maximum of {MAX_DELAY_MS} ms "
            "(2^28 - 1 s, about 8.5 years); shorten it"
        ),
    ),
    Rule(
        ExpiryError,
        lambda *, delay_ms, ttl_ms, **_: (ttl_ms > 0) & (delay_ms > 0) & (ttl_ms < delay_ms),
        lambda *, delay_ms, ttl_ms, **_: (
            f"ttl_ms ({ttl_ms}) is shorter than the delay ({delay_ms} ms), so the message would "
            "expire before it is due; raise ttl_ms or drop it"
        ),
    ),
)


# --- where: rules 5-10 --------------------------------------------------------------------------
REPLY_TO_ALLOWED = Rule(
    NotAuthorized,
    lambda *, refused, **_: refused,
    lambda *, reply_to, **_: (
        f"this token may not send to reply_to {reply_to!r}, where the reports asked for would "
        "go; ask for a token with send permission on it, or name a queue of your own"
    ),
)


def _never(**_: Any) -> bool:
    return False


def _always(**_: Any) -> bool:
    return True


def destination_rules(
    destination: DestinationView, *, may_send: bool, limits: SendLimits
) -> Iterator[Rule]:
    """The rules of one destination, in order; each tests only ``size``. A rule that does not
    depend on the send is ``_always``/``_never``."""
    name = destination.name
    yield Rule(
        NotAuthorized,
        _never if may_send else _always,
        lambda **_: (
            f"this token may not send to {name!r}; ask for a token with send permission on it"
        ),
    )
    if destination.kind is None:
        yield Rule(
            UnknownDestination,
            _always,
            lambda **_: (
                f"destination {name!r} does not exist; declare it first "
                f"(PUT /v1/queues/{name} or tarry queue declare)"
            ),
        )
        return
    limit = limits.max_message_bytes
    yield Rule(
        MessageTooLarge,
        lambda *, size, **_: size > limit,
        lambda *, size, **_: (
            f"the body is {size} bytes, over the server's limit of {limit}; send a smaller body"
        ),
    )
    for target in destination.targets:
        yield from _target_rules(target)


def _target_rules(target: TargetView) -> Iterator[Rule]:
    queue, most = target.name, target.max_message_bytes
    if not target.put_enabled:
        yield Rule(
            PutDisabled,
            _always,
            lambda **_: (
                f"queue {queue!r} is put-disabled; enable it (put_enabled=true) before sending"
            ),
        )
    if most is not None:
        yield Rule(
            MessageTooLarge,
            lambda *, size, **_: size > most,
            lambda *, size, **_: (
                f"the body is {size} bytes, over queue {queue!r}'s max_message_bytes of "
                f"{most}; send a smaller body"
            ),
        )
    if target.full:
        yield Rule(
            DestinationFull,
            _always,
            lambda **_: (
                f"queue {queue!r} is full (max_length reached, overflow reject_publish); "
                "retry later or consume from it"
            ),
        )
    lag, limit = target.lag_ms, target.lag_limit_ms
    if limit and lag > limit:
        refused = Overloaded.consumers_behind(queue, lag, limit)
        yield Rule(
            Overloaded,
            lambda *, delay_ms, **_: due_soon(delay_ms),
            lambda **_: refused.message,
            lambda **_: dict(refused.details),
        )
