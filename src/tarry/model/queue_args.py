"""Queue arguments and policies, with RabbitMQ's rules for which value is in force.

- At most one user policy and one operator policy apply to a queue: the matching one with the
  highest priority (ties: the name that sorts first, so the choice is at least stable).
- ``message_ttl_ms``, ``expires_ms`` and ``max_length``: the lowest of the queue's argument, the
  user policy and the operator policy wins (RabbitMQ's server code, not its docs).
- ``dead_letter_to``: the queue's argument wins, then the user policy, then the operator policy.
- ``overflow``: the queue's argument wins; between policies the operator's wins.

A policy's pattern is searched for in the queue name, as RabbitMQ does (``^orders`` matches
``orders.eu``; anchor both ends to match a whole name). It runs under RE2, whose matching time is
linear in the name: a pattern such as ``^a(b+)+$`` cannot stall the server, which Python's
backtracking ``re`` lets it do. RE2 has no backreferences or lookaround; such a pattern is
refused when the policy is set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import re2

from tarry.errors import InvalidArgument
from tarry.model.message import MAX_INT64, MAX_TTL_MS
from tarry.model.validate import check_name

__all__ = [
    "MAX_PATTERN_CHARS",
    "MAX_TTL_MS",
    "EffectiveQueueArgs",
    "Overflow",
    "Policy",
    "QueueArgs",
    "compile_pattern",
    "effective_args",
    "parse_policy",
    "parse_queue_args",
]

#: The longest pattern a policy may have.
MAX_PATTERN_CHARS = 1000
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is the caller's mistake, not a server log line
_RE2_OPTIONS.never_capture = True  # only "does it match" is asked


class Overflow(StrEnum):
    #: Drop (dead-letter with reason ``maxlen``) the oldest ready message to make room.
    DROP_HEAD = "drop_head"
    #: Refuse new messages while full (``destination_full`` at send time).
    REJECT_PUBLISH = "reject_publish"


@dataclass(frozen=True, slots=True)
class QueueArgs:
    """The arguments a queue is declared with; None means "not set"."""

    message_ttl_ms: int | None = None
    expires_ms: int | None = None
    dead_letter_to: str | None = None
    max_length: int | None = None
    overflow: Overflow | None = None
    max_message_bytes: int | None = None
    put_enabled: bool = True

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["overflow"] = self.overflow.value if self.overflow else None
        return data


@dataclass(frozen=True, slots=True)
class EffectiveQueueArgs:
    """The arguments in force once policies are applied."""

    message_ttl_ms: int | None = None
    expires_ms: int | None = None
    dead_letter_to: str | None = None
    max_length: int | None = None
    overflow: Overflow = Overflow.DROP_HEAD
    max_message_bytes: int | None = None
    put_enabled: bool = True
    policy: str | None = None
    operator_policy: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["overflow"] = self.overflow.value
        return data


_POLICY_KEYS = frozenset(
    {"message_ttl_ms", "expires_ms", "dead_letter_to", "max_length", "overflow"}
)
_QUEUE_KEYS = frozenset(
    {
        "message_ttl_ms",
        "expires_ms",
        "dead_letter_to",
        "max_length",
        "overflow",
        "max_message_bytes",
        "put_enabled",
    }
)


@dataclass(frozen=True, slots=True)
class Policy:
    """A named rule that sets queue arguments on every queue whose name matches ``pattern``."""

    name: str
    pattern: str
    definition: QueueArgs
    priority: int = 0
    operator: bool = False
    apply_to: str = "queues"
    _regex: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regex", compile_pattern(self.pattern))

    def matches(self, queue: str) -> bool:
        return self._regex.search(queue) is not None

    def to_dict(self) -> dict[str, Any]:
        definition = {
            k: v
            for k, v in self.definition.to_dict().items()
            if k in _POLICY_KEYS and v is not None
        }
        return {
            "name": self.name,
            "pattern": self.pattern,
            "apply_to": self.apply_to,
            "priority": self.priority,
            "operator": self.operator,
            "definition": definition,
        }


def compile_pattern(pattern: str) -> Any:
    """A policy's pattern compiled under RE2 (see the module docstring); ``invalid_argument``
    naming what RE2 does not support, or why the pattern is not a regular expression."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InvalidArgument(
            f"pattern is {len(pattern)} characters long; at most {MAX_PATTERN_CHARS} allowed"
        )
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as exc:
        why = exc.args[0] if exc.args else exc
        if isinstance(why, bytes):
            why = why.decode("utf-8", errors="replace")
        raise InvalidArgument(
            f"pattern {pattern!r} cannot be used: {why}; policy patterns are RE2 regular "
            "expressions, without backreferences (\\1) or lookaround ((?=, (?!, (?<=, (?<!)"
        ) from None


def _int_arg(
    data: Mapping[str, Any], key: str, *, minimum: int, maximum: int = MAX_INT64
) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(
            f"{key} must be a whole number from {minimum} to {maximum}, got {value!r}"
        )
    if not minimum <= value <= maximum:
        raise InvalidArgument(f"{key} ({value}) is out of range; use {minimum} to {maximum}")
    return value


def _parse_args(data: Mapping[str, Any], allowed: frozenset[str], what: str) -> QueueArgs:
    if not isinstance(data, Mapping):
        raise InvalidArgument(f"{what} must be a JSON object")
    unknown = set(data) - allowed
    if unknown:
        raise InvalidArgument(
            f"unknown {what} key(s) {', '.join(sorted(unknown))}; allowed: "
            f"{', '.join(sorted(allowed))}"
        )
    overflow_raw = data.get("overflow")
    try:
        overflow = None if overflow_raw is None else Overflow(overflow_raw)
    except ValueError:
        raise InvalidArgument(
            f"overflow {overflow_raw!r} is unknown; use 'drop_head' or 'reject_publish'"
        ) from None
    dead_letter_to = data.get("dead_letter_to")
    if dead_letter_to is not None:
        check_name(dead_letter_to, field="dead_letter_to")
    put_enabled = data.get("put_enabled", True)
    if not isinstance(put_enabled, bool):
        raise InvalidArgument(f"put_enabled must be true or false, got {put_enabled!r}")
    return QueueArgs(
        message_ttl_ms=_int_arg(data, "message_ttl_ms", minimum=0, maximum=MAX_TTL_MS),
        # RabbitMQ refuses x-expires = 0: an unused queue needs a positive lifetime.
        expires_ms=_int_arg(data, "expires_ms", minimum=1, maximum=MAX_TTL_MS),
        dead_letter_to=dead_letter_to,
        max_length=_int_arg(data, "max_length", minimum=0),
        overflow=overflow,
        max_message_bytes=_int_arg(data, "max_message_bytes", minimum=1),
        put_enabled=put_enabled,
    )


def parse_queue_args(data: Mapping[str, Any]) -> QueueArgs:
    """Queue arguments from a declare request; raises ``invalid_argument`` naming the key."""
    return _parse_args(data, _QUEUE_KEYS, "queue argument")


def parse_policy(name: str, data: Mapping[str, Any]) -> Policy:
    """A policy from ``PUT /v1/policies/{name}``; raises ``invalid_argument`` naming the key."""
    check_name(name, field="policy name")
    if not isinstance(data, Mapping):
        raise InvalidArgument("a policy must be a JSON object")
    unknown = set(data) - {"pattern", "apply_to", "priority", "operator", "definition"}
    if unknown:
        raise InvalidArgument(f"unknown policy field(s) {', '.join(sorted(unknown))}")
    pattern = data.get("pattern")
    if not isinstance(pattern, str):
        raise InvalidArgument("pattern is required: a regular expression matching queue names")
    compile_pattern(pattern)
    apply_to = data.get("apply_to", "queues")
    if apply_to != "queues":
        raise InvalidArgument(f"apply_to {apply_to!r} is not supported; use 'queues'")
    priority = _int_arg(data, "priority", minimum=-MAX_INT64) or 0
    operator = data.get("operator", False)
    if not isinstance(operator, bool):
        raise InvalidArgument(f"operator must be true or false, got {operator!r}")
    definition = data.get("definition")
    definition = _parse_args(
        {} if definition is None else definition, _POLICY_KEYS, "policy definition"
    )
    return Policy(
        name=name,
        pattern=pattern,
        definition=definition,
        priority=priority,
        operator=operator,
        apply_to=apply_to,
    )


def _pick(policies: Iterable[Policy], queue: str, operator: bool) -> Policy | None:
    matching = [p for p in policies if p.operator is operator and p.matches(queue)]
    if not matching:
        return None
    return sorted(matching, key=lambda p: (-p.priority, p.name))[0]


def _lowest(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def effective_args(queue: str, args: QueueArgs, policies: Iterable[Policy]) -> EffectiveQueueArgs:
    """The arguments in force on ``queue`` (see the module docstring for who wins)."""
    policies = list(policies)
    user = _pick(policies, queue, operator=False)
    op = _pick(policies, queue, operator=True)
    u = user.definition if user else QueueArgs()
    o = op.definition if op else QueueArgs()
    overflow = args.overflow or o.overflow or u.overflow or Overflow.DROP_HEAD
    return EffectiveQueueArgs(
        message_ttl_ms=_lowest(args.message_ttl_ms, u.message_ttl_ms, o.message_ttl_ms),
        expires_ms=_lowest(args.expires_ms, u.expires_ms, o.expires_ms),
        dead_letter_to=args.dead_letter_to or u.dead_letter_to or o.dead_letter_to,
        max_length=_lowest(args.max_length, u.max_length, o.max_length),
        overflow=overflow,
        max_message_bytes=args.max_message_bytes,
        put_enabled=args.put_enabled,
        policy=user.name if user else None,
        operator_policy=op.name if op else None,
    )
