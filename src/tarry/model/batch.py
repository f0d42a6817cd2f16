"""The send rules over a batch: many sends in, one plan or one error out per send, in order.

This is the form every bulk entry point uses: the server's ``POST /v1/messages/batch`` and the
Spark import (inside ``mapInArrow``, one Arrow batch at a time). It adds no rule of its own: each
record goes through ``parse_send`` and then ``validate_send`` from ``tarry.model.validate``. What
the batch form adds is the split between the two steps, so a caller can look up every
destination the batch names once (the server reads its catalog, the import a snapshot of it)
before the rules that need them run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tarry.errors import TarryError
from tarry.model.message import SendPlan, SendRequest
from tarry.model.rules import Rule, destination_rules
from tarry.model.validate import DestinationView, SendLimits, parse_send, validate_send

__all__ = ["destinations_of", "parse_batch", "validate_batch"]

Parsed = SendRequest | TarryError
Planned = SendPlan | TarryError
_DEFAULT_LIMITS = SendLimits()


def parse_batch(items: Iterable[Mapping[str, Any]]) -> list[Parsed]:
    """Syntax of every send (``parse_send``): a request, or the error that refused it."""
    parsed: list[Parsed] = []
    append = parsed.append
    for data in items:
        try:
            append(parse_send(data))
        except TarryError as exc:
            append(exc)
    return parsed


def destinations_of(parsed: Iterable[Parsed]) -> list[str]:
    """The distinct destinations the parsed sends name, in first-seen order."""
    seen: dict[str, None] = {}
    for item in parsed:
        if isinstance(item, SendRequest):
            seen.setdefault(item.destination)
    return list(seen)


def validate_batch(
    parsed: Sequence[Parsed],
    *,
    now_ms: int,
    views: Mapping[str, DestinationView],
    may_send: Callable[[str], bool] | None = None,
    limits: SendLimits = _DEFAULT_LIMITS,
) -> list[Planned]:
    """Every rule (``validate_send``) for every parsed send, all at the same ``now_ms``.

    ``views`` holds the destinations as the rules should see them; a name missing from it does
    not exist (``unknown_destination``). ``may_send`` answers the token check per destination
    (None: every destination is allowed). Errors from parsing pass through unchanged."""
    planned: list[Planned] = []
    append = planned.append
    # Per destination, once: its view, the token's answer, and its rules.
    known: dict[str, tuple[DestinationView, bool, tuple[Rule, ...]]] = {}
    for item in parsed:
        if isinstance(item, TarryError):
            append(item)
            continue
        name = item.destination
        entry = known.get(name)
        if entry is None:
            view = views.get(name) or DestinationView(name, None)
            ok = may_send(name) if may_send is not None else True
            entry = known[name] = (
                view,
                ok,
                tuple(destination_rules(view, may_send=ok, limits=limits)),
            )
        view, ok, rules = entry
        try:
            append(
                validate_send(
                    item, now_ms=now_ms, destination=view, may_send=ok, limits=limits, rules=rules
                )
            )
        except TarryError as exc:
            append(exc)
    return planned
