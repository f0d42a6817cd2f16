"""The send rules over a batch: many sends in, one plan or one error out per send, in order.

This is the form every bulk entry point uses: the server's ``POST /v1/messages/batch`` and the
Spark import (inside ``mapInArrow``, one Arrow batch at a time). It adds no rule of its own: each
record goes through ``parse_send`` and then ``validate_send`` from ``tarry.model.validate``, or,
in ``BatchCheck`` for batches of ``COLUMN_MIN`` (256) sends or more, through the same rules
column by column (``tarry.model.columns``, held to the same answers by property tests). What the
batch form adds is the split between the two steps, so a caller can look up every destination
the batch names once (the server reads its catalog, the import a snapshot of it) before the
rules that need them run. ``BatchCheck.plain`` gives the same verdicts as columns for a batch of
plain sends (``tarry.model.accepted``), the server's common case.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import fields as dataclass_fields
from itertools import repeat
from typing import Any, cast

import numpy as np
import pyarrow as pa

from tarry.errors import TarryError
from tarry.model.accepted import AcceptedColumns
from tarry.model.columns import ParsedColumns, PlannedColumns, parse_columns, validate_columns
from tarry.model.fields import COLUMN_FIELDS, fields_into
from tarry.model.ids import IdGenerator
from tarry.model.message import SendPlan, SendRequest, Undeliverable
from tarry.model.rules import Rule, destination_rules
from tarry.model.validate import DestinationView, SendLimits, parse_send, validate_send

__all__ = [
    "COLUMN_MIN",
    "PLAIN_FIELDS",
    "BatchCheck",
    "destinations_of",
    "parse_batch",
    "validate_batch",
]

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
    and per ``reply_to`` (None: every name is allowed). Errors from parsing pass through
    unchanged."""
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
                    item,
                    now_ms=now_ms,
                    destination=view,
                    may_send=ok,
                    limits=limits,
                    rules=rules,
                    may_send_to=may_send,
                )
            )
        except TarryError as exc:
            append(exc)
    return planned


#: From this many sends on, ``BatchCheck`` goes column-wise: below it the columns' fixed cost
#: (a few dozen Arrow calls a batch) is more than the per-send work it saves.
COLUMN_MIN = 256
#: The fields the columns decide; a send with any other field is checked one at a time.
_COLUMN_FIELDS = tuple(COLUMN_FIELDS)
_COLUMN_SET = frozenset(_COLUMN_FIELDS)
_NO_FIELDS: dict[str, Any] = {}
#: The fields of a plain send (``BatchCheck.plain``): each its own message, no key, no options;
#: derived from the field table, the column-decided fields whose checked column
#: ``AcceptedColumns`` holds (destination, body, delay or time, TTL).
PLAIN_FIELDS = fields_into({f.name for f in dataclass_fields(AcceptedColumns)})


class BatchCheck:
    """The send rules over JSON-shaped sends in two steps: constructing it checks the syntax
    (rule 1) and ``destinations`` names what the rest needs; ``validate`` applies rules 2-10 once
    the caller has looked those up. The answers are ``parse_batch`` + ``validate_batch``'s, in
    order; big batches get them column-wise (``tarry.model.columns``) for the sends whose fields
    the columns decide, the others one at a time."""

    def __init__(self, items: Sequence[Any]) -> None:
        self.items = items
        self._columns: ParsedColumns | None = None
        self._one: dict[int, Parsed] = {}
        self._names: list[str | None] | None = None
        #: Each column field's value per send (None: absent, or the send goes one at a time).
        self._values: dict[str, list[Any]] = {}
        self._planned: tuple[int, PlannedColumns] | None = None
        if len(items) >= COLUMN_MIN:
            self._columns, self._values = _parse_columns(items)
        if self._columns is None:
            self._parsed = parse_batch(items)
        else:
            rows = np.flatnonzero(self._columns.by_row).tolist()
            self._one = dict(zip(rows, parse_batch([items[i] for i in rows]), strict=True))

    def row_destinations(self) -> list[str | None]:
        """Each send's destination where its syntax passed, else None."""
        if self._names is None:
            if self._columns is None:
                self._names = [
                    p.destination if isinstance(p, SendRequest) else None for p in self._parsed
                ]
            else:
                self._names = self._columns.row_destinations()
                for i, p in self._one.items():
                    self._names[i] = p.destination if isinstance(p, SendRequest) else None
        return self._names

    def destinations(self) -> list[str]:
        """The distinct destinations of the sends whose syntax passed, in first-seen order."""
        return [n for n in dict.fromkeys(self.row_destinations()) if n is not None]

    def validate(
        self,
        *,
        now_ms: int,
        views: Mapping[str, DestinationView],
        may_send: Callable[[str], bool] | None = None,
        limits: SendLimits = _DEFAULT_LIMITS,
    ) -> list[Planned]:
        """As ``validate_batch``: one plan or error per send, in order."""
        if self._columns is None:
            return validate_batch(
                self._parsed, now_ms=now_ms, views=views, may_send=may_send, limits=limits
            )
        when = self._when(now_ms=now_ms, views=views, may_send=may_send, limits=limits)
        one = dict(
            zip(
                self._one,
                validate_batch(
                    list(self._one.values()),
                    now_ms=now_ms,
                    views=views,
                    may_send=may_send,
                    limits=limits,
                ),
                strict=True,
            )
        )
        errors: list[Planned | None] = self._columns.errors.tolist()
        # Every field of the other rows is known good: their requests are what parse_send
        # would make of them, built a column at a time (tests/model/test_batch.py holds them
        # to parse_send's).
        rows = [i for i, error in enumerate(errors) if error is None and i not in one]
        planned = errors
        for i, plan in one.items():
            planned[i] = plan
        if rows:
            for i, plan in zip(rows, self._plans(rows, when, now_ms), strict=True):
                planned[i] = plan
        return cast(list[Planned], planned)

    def plain(
        self,
        *,
        now_ms: int,
        views: Mapping[str, DestinationView],
        ids: IdGenerator,
        may_send: Callable[[str], bool] | None = None,
        limits: SendLimits = _DEFAULT_LIMITS,
    ) -> tuple[list[TarryError | None], AcceptedColumns] | None:
        """``validate``'s answers as columns, for a batch whose sends the columns decided
        alone and that are plain (``PLAIN_FIELDS`` only, each due after ``now_ms``): each send's
        refusal (None where accepted), and the accepted sends, named by ``ids``. None when the
        batch is not such a batch: ``validate`` answers it (without checking it twice)."""
        columns = self._columns
        if columns is None or self._one or self._has_other_fields():
            return None
        when = self._when(now_ms=now_ms, views=views, may_send=may_send, limits=limits)
        errors: list[TarryError | None] = columns.errors.tolist()
        taken = np.flatnonzero(~columns.marks.decided)
        due = when.deliver_at_ms[taken]
        if len(taken) and int(due.min()) <= now_ms:
            return None  # released at once: the general path does that
        rows: list[int] = taken.tolist()
        every = len(rows) == len(self.items)
        # (no destination column when no send names one: every send is refused then)
        destinations, bodies = self._values.get("destination", []), self._values.get("body")
        message_ids, correlation_ids = map(self._values.get, ("message_id", "correlation_id"))
        if not every:
            destinations = [destinations[i] for i in rows]
            bodies = None if bodies is None else [bodies[i] for i in rows]
            message_ids = None if message_ids is None else [message_ids[i] for i in rows]
            correlation_ids = (
                None if correlation_ids is None else [correlation_ids[i] for i in rows]
            )
        accepted = AcceptedColumns(
            rows=rows,
            ids=ids.new_due_many(now_ms, due).astype("U26").tolist(),
            destination=destinations,
            body=_utf8(bodies, len(rows)),
            sent_at_ms=now_ms,
            deliver_at_ms=due,
            expires_at_ms=when.expires_at_ms[taken],
            message_id=_given(message_ids),
            correlation_id=_given(correlation_ids),
        )
        return errors, accepted

    def _has_other_fields(self) -> bool:
        """A send of the batch gives a field outside ``PLAIN_FIELDS``."""
        return any(
            any(v is not None for v in values)
            for name, values in self._values.items()
            if name not in PLAIN_FIELDS
        )

    def _when(
        self,
        *,
        now_ms: int,
        views: Mapping[str, DestinationView],
        may_send: Callable[[str], bool] | None,
        limits: SendLimits,
    ) -> PlannedColumns:
        """``validate_columns`` of the batch at ``now_ms``, once (``plain`` then ``validate``
        ask for the same)."""
        assert self._columns is not None
        if self._planned is None or self._planned[0] != now_ms:
            when = validate_columns(
                self._columns, now_ms=now_ms, views=views, may_send=may_send, limits=limits
            )
            self._planned = (now_ms, when)
        return self._planned[1]

    def _plans(self, rows: list[int], when: PlannedColumns, now_ms: int) -> Iterator[SendPlan]:
        """The plans of ``rows`` (column-checked, accepted), in order, from the field values
        the columns were made of."""
        n = len(rows)
        every = n == len(self.items)

        def column(name: str) -> Iterable[Any]:
            values = self._values.get(name)
            if values is None:
                return repeat(None, n)
            return values if every else [values[i] for i in rows]

        # Positional (in field order): keywords go through a dict, once per send here.
        requests = map(
            SendRequest,
            column("destination"),
            [b"" if body is None else body.encode("utf-8") for body in column("body")],
            [{} for _ in range(n)],
            column("delay_ms"),
            column("deliver_at"),
            column("ttl_ms"),
            column("message_id"),
            column("correlation_id"),
            repeat(None, n),
            repeat(frozenset(), n),
            repeat(Undeliverable.DEAD_LETTER, n),
            column("group_id"),
        )
        taken = np.asarray(rows)
        expires: list[int] = when.expires_at_ms[taken].tolist()
        return map(
            SendPlan,
            requests,
            repeat(now_ms, n),
            when.deliver_at_ms[taken].tolist(),
            [None if e < 0 else e for e in expires],
        )


def _given(values: list[str | None] | None) -> list[str | None] | None:
    """A column of optional texts, or None when no send gives one."""
    return values if values is not None and any(values) else None


def _utf8(texts: list[str | None] | None, n: int) -> list[bytes]:
    """Each body's bytes (None, or no body field in the batch: empty)."""
    if texts is None:
        return [b""] * n
    if None in texts:
        return [b"" if text is None else text.encode("utf-8") for text in texts]
    return list(map(str.encode, cast(list[str], texts)))


def _parse_columns(items: Sequence[Any]) -> tuple[ParsedColumns | None, dict[str, list[Any]]]:
    """Rule 1 over ``items`` column-wise; a send with a field the columns do not decide, or a
    value Arrow cannot hold in one column with the others (mixed types, huge ints, bad text),
    is flagged to go one at a time. None when no column could be made; and each present
    field's values, send by send (None for a send flagged)."""
    n = len(items)
    rows: Sequence[Mapping[str, Any]] = items
    by_row = np.zeros(n, bool)
    # The common batch, every send a dict of column fields, seen in two C-level passes.
    if set(map(type, items)) != {dict} or not _COLUMN_SET.issuperset(
        present := set().union(*items)
    ):
        rows = []
        for i, data in enumerate(items):
            if type(data) is dict and _COLUMN_SET.issuperset(data):
                rows.append(data)
            else:
                rows.append(_NO_FIELDS)
                by_row[i] = True
        present = set().union(*rows)
    arrays: list[pa.Array] = []
    names: list[str] = []
    fields: dict[str, list[Any]] = {}
    for name in _COLUMN_FIELDS:
        if name not in present:
            continue
        values = fields[name] = [data.get(name) for data in rows]
        try:
            arrays.append(pa.array(values))
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            by_row |= np.fromiter((v is not None for v in values), bool, n)
            continue
        names.append(name)
    if not arrays:
        return None, fields
    return parse_columns(pa.RecordBatch.from_arrays(arrays, names=names), by_row=by_row), fields
