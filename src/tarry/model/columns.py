"""The send rules over a whole Arrow batch, column by column (numpy and ``pyarrow.compute``):
the form the Spark import runs in its executors, where a Python call per row is the cost that
matters.

It holds no rule of its own. The tests and messages come from the tables in ``tarry.model.rules``
(the same ones ``validate.py`` applies to one send), evaluated here over whole columns; names go
through ``check_name`` once per distinct value. A row is checked one send at a time
(``parse_send`` then ``validate_send``) when it uses what the columns cannot say cheaply:
a field outside the common set (headers, report, reply_to, ``body_base64``, retain, ...) or a
column whose Arrow type is not the plain one (text for a number, binary for a body, ...).
Either way each row gets the same verdict, code and message as ``validate_send`` would give it
(a property test holds the two forms to that).

The server's batch endpoint runs it too, through ``tarry.model.batch.BatchCheck``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from tarry.errors import TarryError
from tarry.model.fields import CHECKED_COLUMNS, COLUMN_FIELDS
from tarry.model.message import SendPlan, reports_text
from tarry.model.rules import (
    BOTH_TIMES,
    DESTINATION_REQUIRED,
    TIME_RULES,
    Rule,
    destination_rules,
    id_rules,
    instant_rules,
    ms_rules,
)
from tarry.model.validate import (
    SEND_FIELDS,
    DestinationView,
    SendLimits,
    check_name,
    parse_send,
    validate_send,
)

__all__ = [
    "CheckedColumns",
    "ParsedColumns",
    "PlannedColumns",
    "check_columns",
    "parse_columns",
    "validate_columns",
]

#: Fields the columns decide, and which Arrow type each is read as.
_COLUMN_TYPES = {name: pa.type_for_alias(kind) for name, kind in COLUMN_FIELDS.items()}
_DEFAULT_LIMITS = SendLimits()

Decode = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class CheckedColumns:
    """One batch's verdicts, row for row. ``code`` is null for an accepted row, whose normalised
    fields (as ``parse_send``/``validate_send`` would set them) are filled in; a refused row has
    ``code`` and ``message`` and nulls elsewhere."""

    code: pa.Array
    message: pa.Array
    destination: pa.Array
    deliver_at_ms: pa.Array
    expires_at_ms: pa.Array
    body: pa.Array
    #: The headers as JSON text (null: none).
    headers: pa.Array
    message_id: pa.Array
    correlation_id: pa.Array
    reply_to: pa.Array
    #: The reports asked for, comma-separated (null: none).
    report: pa.Array
    #: ``on_undeliverable`` is ``discard``.
    discard: pa.Array
    persistent: pa.Array
    #: Rows that were checked one send at a time (see the module docstring).
    by_row: np.ndarray


def _fast_type(name: str, kind: pa.DataType) -> bool:
    if pa.types.is_null(kind):
        return True
    read_as = _COLUMN_TYPES.get(name)
    if read_as == pa.string():
        return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))
    if read_as == pa.int64():  # (uint64 may not fit the int64 the rules compute in)
        return bool(pa.types.is_integer(kind)) and kind != pa.uint64()
    return False


def _valid(column: pa.Array) -> np.ndarray:
    return np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _ints(column: pa.Array | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(present, value with 0 for null) of an integer column (absent: none present)."""
    if column is None or pa.types.is_null(column.type):
        return np.zeros(n, bool), np.zeros(n, np.int64)
    values = pc.fill_null(column.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
    return _valid(column), values


class _Marks:
    """The first refusal of each row, rule by rule in table order."""

    def __init__(self, n: int, decided: np.ndarray) -> None:
        self.n = n
        self.decided = decided.copy()
        self.error = np.full(n, None, dtype=object)

    def apply(self, rule: Rule, where: np.ndarray | bool, **facts: Any) -> None:
        """Refuse the undecided rows of ``where`` that ``rule`` fails on ``facts``."""
        if where is not True and not np.any(where):
            return  # a field no send of the batch has: its rules need not run
        hit = np.broadcast_to(np.asarray(rule.fails(**facts), dtype=bool), (self.n,))
        hit = hit & where & ~self.decided
        if not hit.any():
            return
        for i in np.flatnonzero(hit):
            one = {k: v[i].item() if isinstance(v, np.ndarray) else v for k, v in facts.items()}
            self.error[i] = rule.refuse(**one)
        self.decided |= hit

    def refuse(self, where: np.ndarray, error: TarryError) -> None:
        hit = where & ~self.decided
        # Without its traceback: the frames it holds reach this object array, a cycle the
        # garbage collector cannot see through (numpy does not traverse object arrays), so
        # every batch with a refused row stayed in memory for good.
        self.error[hit] = error.with_traceback(None)
        self.decided |= hit

    def codes(self) -> tuple[pa.Array, pa.Array]:
        """(code, message) of every row, null where accepted."""
        codes = [None if e is None else e.code for e in self.error]
        messages = [None if e is None else e.message for e in self.error]
        return pa.array(codes, pa.string()), pa.array(messages, pa.string())


@dataclass(slots=True)
class ParsedColumns:
    """A batch after rule 1 (syntax), column by column; ``validate_columns`` applies rules 2-9
    once the destinations are known. Rows of ``by_row`` are left to the caller, to check one
    send at a time."""

    n: int
    marks: _Marks
    by_row: np.ndarray
    destination: pa.Array
    #: The distinct destination names (``dictionary_encode`` order) and each row's index in it.
    names: list[str | None]
    index: np.ndarray
    has_delay: np.ndarray
    delay: np.ndarray
    has_at: np.ndarray
    at: np.ndarray
    has_ttl: np.ndarray
    ttl: np.ndarray
    texts: dict[str, pa.Array]
    body: pa.Array

    @property
    def errors(self) -> np.ndarray:
        """Each row's refusal so far (a ``TarryError``), None where none yet."""
        return self.marks.error

    def row_destinations(self) -> list[str | None]:
        """Each row's destination where the row passed so far, else None."""
        names = [*self.names, None]
        index = np.where(self.marks.decided, -1, self.index)
        return [names[k] for k in index.tolist()]


@dataclass(frozen=True, slots=True)
class PlannedColumns:
    """When each accepted row falls due and expires (``expires_at_ms`` -1: never)."""

    deliver_at_ms: np.ndarray
    expires_at_ms: np.ndarray
    ttl_ms: np.ndarray


def parse_columns(batch: pa.RecordBatch, *, by_row: np.ndarray | None = None) -> ParsedColumns:
    """Rule 1 (syntax) for every row of ``batch`` (columns named by send field), column-wise.
    Rows whose values the columns cannot decide (see the module docstring), and those of
    ``by_row``, are flagged in the result's ``by_row`` and left undecided."""
    n = batch.num_rows
    columns: dict[str, pa.Array] = {}  # the columns read column-wise
    one_at_a_time = np.zeros(n, bool) if by_row is None else by_row.copy()
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        if name in SEND_FIELDS and _fast_type(name, column.type):
            columns[name] = column
        else:
            one_at_a_time |= _valid(column)
    marks = _Marks(n, one_at_a_time)

    # 1. syntax, in parse_send's order
    destination = columns.get("destination")
    if destination is None or pa.types.is_null(destination.type):
        destination = pa.nulls(n, pa.string())
    destination = destination.cast(pa.string())
    marks.apply(DESTINATION_REQUIRED, True, missing=~_valid(destination))
    encoded = destination.dictionary_encode()
    names: list[str | None] = encoded.dictionary.to_pylist()
    index = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False)
    for k, name in enumerate(names):
        try:
            check_name(name, field="destination")
        except TarryError as exc:
            marks.refuse(index == k, exc)
    has_delay, delay = _ints(columns.get("delay_ms"), n)
    for rule in ms_rules("delay_ms"):
        marks.apply(rule, has_delay, not_int=False, value=delay)
    has_at, at = _ints(columns.get("deliver_at"), n)
    marks.apply(BOTH_TIMES, True, has_delay=has_delay, has_at=has_at)
    for rule in instant_rules("deliver_at"):
        marks.apply(rule, has_at, value=at)
    has_ttl, ttl = _ints(columns.get("ttl_ms"), n)
    for rule in ms_rules("ttl_ms"):
        marks.apply(rule, has_ttl, not_int=False, value=ttl)
    texts: dict[str, pa.Array] = {}
    for key in ("message_id", "correlation_id", "group_id"):
        column = columns.get(key)
        if column is None or pa.types.is_null(column.type):
            texts[key] = pa.nulls(n, pa.string())
            continue
        texts[key] = column = column.cast(pa.string())
        present = _valid(column)
        length = pc.fill_null(pc.utf8_length(column), 0).to_numpy(zero_copy_only=False)
        has_nul = pc.fill_null(pc.match_substring(column, "\x00"), False)
        for rule in id_rules(key):
            marks.apply(
                rule,
                present,
                length=length,
                has_nul=np.asarray(has_nul.to_numpy(zero_copy_only=False), dtype=bool),
            )
    body = columns.get("body")
    if body is None or pa.types.is_null(body.type):
        body = pa.nulls(n, pa.binary())
    return ParsedColumns(
        n=n,
        marks=marks,
        by_row=one_at_a_time,
        destination=destination,
        names=names,
        index=index,
        has_delay=has_delay,
        delay=delay,
        has_at=has_at,
        at=at,
        has_ttl=has_ttl,
        ttl=ttl,
        texts=texts,
        body=pc.fill_null(body.cast(pa.binary()), b""),
    )


def validate_columns(
    parsed: ParsedColumns,
    *,
    now_ms: int,
    views: Mapping[str, DestinationView],
    may_send: Callable[[str], bool] | None = None,
    limits: SendLimits = _DEFAULT_LIMITS,
) -> PlannedColumns:
    """Rules 2-9 for the rows still undecided, all at ``now_ms``; ``views``/``may_send``: as
    ``validate_batch``, asked only about destinations of such rows."""
    marks = parsed.marks
    # 2-4. when
    delay_ms = np.where(parsed.has_at, np.maximum(0, parsed.at - now_ms), parsed.delay)
    ttl_ms = np.where(parsed.has_ttl, parsed.ttl, -1)
    for rule in TIME_RULES:
        marks.apply(
            rule,
            True,
            delay_ms=delay_ms,
            ttl_ms=ttl_ms,
            grouped=_valid(parsed.texts["group_id"]),
            retain=False,
        )

    # 5-9. where
    size = pc.binary_length(parsed.body).to_numpy(zero_copy_only=False)
    for k, name in enumerate(parsed.names):
        mine = parsed.index == k
        if name is None or not (mine & ~marks.decided).any():
            continue
        view = views.get(name) or DestinationView(name, None)
        ok = may_send(name) if may_send is not None else True
        for rule in destination_rules(view, may_send=ok, limits=limits):
            marks.apply(rule, mine, size=size, delay_ms=delay_ms)

    deliver_at_ms = now_ms + delay_ms
    expires_at_ms = np.where(ttl_ms == 0, deliver_at_ms, np.where(ttl_ms < 0, -1, now_ms + ttl_ms))
    return PlannedColumns(deliver_at_ms=deliver_at_ms, expires_at_ms=expires_at_ms, ttl_ms=ttl_ms)


def check_columns(
    batch: pa.RecordBatch,
    *,
    now_ms: int,
    views: Mapping[str, DestinationView],
    may_send: Callable[[str], bool] | None = None,
    limits: SendLimits = _DEFAULT_LIMITS,
    decode: Decode | None = None,
) -> CheckedColumns:
    """Every send-time rule for every row of ``batch`` (columns named by send field), all at
    ``now_ms``. ``views``/``may_send``: as ``validate_batch``. ``decode`` turns a row checked one
    send at a time into the JSON shapes ``parse_send`` reads (the import's input decoding);
    a ``TarryError`` it raises refuses the row."""
    n = batch.num_rows
    parsed = parse_columns(batch)
    planned = validate_columns(parsed, now_ms=now_ms, views=views, may_send=may_send, limits=limits)
    marks, by_row = parsed.marks, parsed.by_row
    accepted = ~marks.decided
    out = _Out(n, accepted)
    out.set("destination", parsed.destination)
    out.set("deliver_at_ms", pa.array(planned.deliver_at_ms, pa.int64()))
    out.set("expires_at_ms", pa.array(planned.expires_at_ms, pa.int64(), mask=planned.ttl_ms < 0))
    out.set("body", parsed.body)
    out.set("message_id", parsed.texts["message_id"])
    out.set("correlation_id", parsed.texts["correlation_id"])
    out.set("discard", pa.array(np.zeros(n, bool)))
    out.set("persistent", pa.array(np.ones(n, bool)))
    if by_row.any():
        one = _OneAtATime(now_ms=now_ms, views=views, may_send=may_send, limits=limits)
        one.check(batch, np.flatnonzero(by_row), marks, out, decode)
    code, message = marks.codes()
    return CheckedColumns(code=code, message=message, by_row=by_row, **out.arrays())


#: The checked form's columns (``tarry.model.fields``).
_OUT_TYPES = {name: pa.type_for_alias(kind) for name, kind in CHECKED_COLUMNS.items()}


class _Out:
    """The normalised fields: column values for accepted column-checked rows, values of the
    plan for rows checked one at a time, null for refused rows."""

    def __init__(self, n: int, accepted: np.ndarray) -> None:
        self.n = n
        self.accepted = accepted
        self.columns: dict[str, pa.Array] = {}
        self.rows: dict[str, dict[int, Any]] = {name: {} for name in _OUT_TYPES}

    def set(self, name: str, column: pa.Array) -> None:
        self.columns[name] = column

    def arrays(self) -> dict[str, pa.Array]:
        out: dict[str, pa.Array] = {}
        for name, kind in _OUT_TYPES.items():
            column = self.columns.get(name)
            if column is None:
                column = pa.nulls(self.n, kind)
            column = _only(column.cast(kind), self.accepted)
            rows = self.rows[name]
            if rows:
                mask = np.zeros(self.n, bool)
                order = sorted(rows)
                mask[order] = True
                column = pc.replace_with_mask(
                    column, pa.array(mask), pa.array([rows[i] for i in order], kind)
                )
            out[name] = column
        return out


def _only(column: pa.Array, keep: np.ndarray) -> pa.Array:
    """``column`` with every value outside ``keep`` made null: a new validity bitmap over the
    same buffers (no copy of the values)."""
    if column.offset != 0 or pa.types.is_null(column.type):
        return pc.if_else(pa.array(keep), column, pa.scalar(None, column.type))
    valid = keep & _valid(column)
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    return pa.Array.from_buffers(column.type, len(column), [bitmap, *column.buffers()[1:]])


@dataclass(frozen=True, slots=True)
class _OneAtATime:
    now_ms: int
    views: Mapping[str, DestinationView]
    may_send: Callable[[str], bool] | None
    limits: SendLimits

    def check(
        self,
        batch: pa.RecordBatch,
        rows: np.ndarray,
        marks: _Marks,
        out: _Out,
        decode: Decode | None,
    ) -> None:
        """The rows the columns left alone, one send at a time through ``validate.py``."""
        picked = batch.take(pa.array(rows))
        names = picked.schema.names
        values = [picked.column(i).to_pylist() for i in range(len(names))]
        for j, i in enumerate(rows):
            data = {name: column[j] for name, column in zip(names, values, strict=True)}
            data = {k: v for k, v in data.items() if v is not None}
            try:
                if decode is not None:
                    data = decode(data)
                request = parse_send(data)
                name = request.destination
                plan: SendPlan = validate_send(
                    request,
                    now_ms=self.now_ms,
                    destination=self.views.get(name) or DestinationView(name, None),
                    may_send=self.may_send(name) if self.may_send is not None else True,
                    limits=self.limits,
                    may_send_to=self.may_send,
                )
            except TarryError as exc:
                marks.error[i] = exc.with_traceback(None)  # see _Marks.refuse
                continue
            got = out.rows
            got["destination"][i] = name
            got["deliver_at_ms"][i] = plan.deliver_at_ms
            got["expires_at_ms"][i] = plan.expires_at_ms
            got["body"][i] = request.body
            got["headers"][i] = orjson.dumps(request.headers).decode() if request.headers else None
            got["message_id"][i] = request.message_id
            got["correlation_id"][i] = request.correlation_id
            got["reply_to"][i] = request.reply_to
            got["report"][i] = reports_text(request.report) or None
            got["discard"][i] = request.on_undeliverable.value == "discard"
            got["persistent"][i] = request.persistent
