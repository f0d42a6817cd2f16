"""The send rules inside Spark: one ``mapInArrow`` step that runs the model's column-wise rules
(``tarry.model.columns``) on every Arrow batch of input rows, in the executors' Python workers.

Each input row comes out as exactly one row of ``CHECKED_SCHEMA``: accepted (``code`` null) with
its due time, expiry, time partition, fan-out targets and the normalised message fields the
offline sink encodes, or rejected with the error code and message the HTTP API would have given.
Nothing is dropped here. ``record`` is the send as JSON (what the online sink posts and the
rejects keep), built column-wise too where the values need no JSON escaping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tarry.errors import TarryError
from tarry.model.columns import CheckedColumns, check_columns
from tarry.model.fanout import targets_of
from tarry.model.fields import CHECKED_COLUMNS
from tarry.model.validate import DestinationView, SendLimits
from tarry.pipeline.catalog import views_from_json
from tarry.pipeline.ddl import spark_ddl
from tarry.pipeline.records import decode_row, derived_message_id, record_json
from tarry.pipeline.sources import ROW
from tarry.store.log.record_columns import needs_json_escape

__all__ = [
    "CHECKED_DDL",
    "CHECKED_SCHEMA",
    "VERDICT_DDL",
    "ImportRules",
    "check_batch",
    "checker",
    "verdicts",
]


#: The normalised message fields, passed through from the model's verdicts: the checked form's
#: columns (``tarry.model.fields``) but those ``check_batch`` fills in itself.
MESSAGE_FIELDS = tuple(
    name
    for name in CHECKED_COLUMNS
    if name not in ("destination", "message_id", "deliver_at_ms", "expires_at_ms")
)
CHECKED_SCHEMA = pa.schema(
    [
        (ROW, pa.int64()),
        ("destination", pa.string()),
        ("message_id", pa.string()),
        ("code", pa.string()),
        ("message", pa.string()),
        ("deliver_at_ms", pa.int64()),
        ("expires_at_ms", pa.int64()),
        ("partition_ms", pa.int64()),
        ("targets", pa.list_(pa.string())),
        ("record", pa.string()),
        *((name, pa.type_for_alias(CHECKED_COLUMNS[name])) for name in MESSAGE_FIELDS),
    ]
)
CHECKED_DDL = spark_ddl(CHECKED_SCHEMA)
#: ``verdicts``' narrow rows: the rules' answer without the message itself (``record``, the
#: input row as JSON, only for rejected rows).
VERDICT_COLUMNS = (ROW, "destination", "message_id", "code", "message", "record")
VERDICT_SCHEMA = pa.schema([CHECKED_SCHEMA.field(name) for name in VERDICT_COLUMNS])
VERDICT_DDL = spark_ddl(VERDICT_SCHEMA)


@dataclass(frozen=True, slots=True)
class ImportRules:
    """Everything the rules need, fixed for the whole import and shipped to every executor."""

    #: The import's "now": a delay counts from here, a past deliver_at means this instant.
    now_ms: int
    #: ``catalog.views_to_json`` of the destinations as of the import.
    views: tuple[dict[str, Any], ...]
    #: Width of a time partition (a message's partition is its due time rounded down to it).
    partition_ms: int = 3_600_000
    max_message_bytes: int = SendLimits().max_message_bytes


def check_batch(
    batch: pa.RecordBatch,
    rules: ImportRules,
    views: Mapping[str, DestinationView],
    *,
    record_for: np.ndarray | None = None,
) -> pa.RecordBatch:
    """The rules over one batch of input rows (``_row`` plus send-field columns).

    ``record`` (the send as JSON, the dearest column) is built for every row, or, given
    ``record_for`` (a mask), only for those rows and the rejected ones (null elsewhere)."""
    n = batch.num_rows
    sends = batch.drop_columns([ROW]) if ROW in batch.schema.names else batch
    checked = check_columns(
        sends,
        now_ms=rules.now_ms,
        views=views,
        limits=SendLimits(max_message_bytes=rules.max_message_bytes),
        decode=decode_row,
    )
    given_id = _text(sends, "message_id")
    needs_id = ~_valid(given_id)
    if record_for is None:
        wanted = np.ones(n, bool)
        records, by_row = _records(sends, checked.by_row | needs_id)
    else:
        wanted = record_for | _valid(checked.code)
        picked_rows = np.flatnonzero(wanted)
        some, some_by_row = _records(
            sends.take(pa.array(picked_rows)), (checked.by_row | needs_id)[wanted]
        )
        at = np.full(n, -1)
        at[picked_rows] = np.arange(len(picked_rows))
        records = some.take(pa.array(at, mask=at < 0))
        by_row = needs_id.copy()
        by_row[picked_rows] |= some_by_row
    message_id = given_id
    if by_row.any():  # ids derived from the content, and JSON that needs escaping
        rows = np.flatnonzero(by_row)
        picked = sends.take(pa.array(rows)).to_pylist()
        ids, texts = [], []
        for i, row in zip(rows, picked, strict=True):
            try:
                data = decode_row(row)
            except TarryError:
                data = {k: v for k, v in row.items() if v is not None and k != "headers"}
            if needs_id[i]:
                data["message_id"] = derived_message_id(data)
            ids.append(None if data.get("message_id") is None else str(data["message_id"]))
            texts.append(record_json(data).decode() if wanted[i] else None)
        mask = pa.array(np.isin(np.arange(n), rows))
        message_id = pc.replace_with_mask(message_id, mask, pa.array(ids, pa.string()))
        records = pc.replace_with_mask(records, mask, pa.array(texts, pa.string()))
    accepted = pc.is_null(checked.code)
    # The checked message_id (a derived one where none was given) for accepted rows.
    message_id = pc.if_else(accepted, pc.coalesce(checked.message_id, message_id), message_id)
    due = checked.deliver_at_ms
    columns: dict[str, Any] = {
        ROW: batch.column(ROW),
        "destination": _text(sends, "destination"),
        "message_id": message_id,
        "code": checked.code,
        "message": checked.message,
        "deliver_at_ms": due,
        "expires_at_ms": checked.expires_at_ms,
        "partition_ms": _partition(due, rules.partition_ms),
        "targets": _targets(checked, views),
        "record": records,
    }
    columns.update({name: getattr(checked, name) for name in MESSAGE_FIELDS})
    return pa.RecordBatch.from_pydict(columns, schema=CHECKED_SCHEMA)


def _partition(due: pa.Array, span: int) -> pa.Array:
    """The due time rounded down to the partition width."""
    values = pc.fill_null(due, 0).to_numpy(zero_copy_only=False)
    return pa.array(values - values % span, pa.int64(), mask=~_valid(due))


def _valid(column: pa.Array) -> np.ndarray:
    return np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _text(batch: pa.RecordBatch, name: str) -> pa.Array:
    """A column as text: a string column as it is; other types value by value (``str``)."""
    if name not in batch.schema.names:
        return pa.nulls(batch.num_rows, pa.string())
    column = batch.column(name)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.cast(pa.string())
    return pa.array([None if v is None else str(v) for v in column.to_pylist()], pa.string())


def _targets(checked: CheckedColumns, views: Mapping[str, DestinationView]) -> pa.Array:
    """The queues each accepted row lands in (null for refused rows)."""
    accepted = pc.is_null(checked.code)
    destination = pc.if_else(accepted, checked.destination, pa.scalar(None, pa.string()))
    encoded = destination.dictionary_encode()
    lists = [
        [queue for queue, _ in targets_of(name, views.get(name))]
        for name in encoded.dictionary.to_pylist()
    ]
    return pc.take(pa.array(lists, pa.list_(pa.string())), encoded.indices)


#: Characters JSON must escape: text holding one goes through ``record_json`` instead.
_NEEDS_ESCAPE = r'[\x00-\x1f"\\]'


def _records(sends: pa.RecordBatch, by_row: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """``record_json`` of each row, concatenated column-wise: keys sorted, nulls left out. Rows
    in ``by_row``, or with text that JSON must escape, are left for ``record_json``: the second
    value marks them (their first value is meaningless)."""
    n = sends.num_rows
    pieces = []
    for name in sorted(sends.schema.names):
        column = sends.column(name)
        kind = column.type
        if pa.types.is_null(kind):
            continue
        if pa.types.is_integer(kind):
            piece = pc.binary_join_element_wise(f',"{name}":', pc.cast(column, pa.string()), "")
        elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
            column = column.cast(pa.string())
            by_row = by_row | needs_json_escape(column)
            piece = pc.binary_join_element_wise(f',"{name}":"', column, '"', "")
        else:
            by_row = by_row | _valid(column)
            continue
        pieces.append(piece)
    # '}' closes every row and its first ',' becomes '{'; a row with no field at all has no
    # message_id either, so it is in by_row already.
    joined = pc.binary_join_element_wise(*pieces, "}", "", null_handling="replace")
    if not pieces:
        joined = pa.array(["}"] * n, pa.string())
    return pc.binary_replace_slice(joined, start=0, stop=1, replacement="{"), by_row


def checker(rules: ImportRules) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function for ``DataFrame.mapInArrow``: input batches (send-field columns plus
    ``_row``) in, ``CHECKED_SCHEMA`` batches out."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        views = views_from_json(rules.views)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            yield check_batch(batch, rules, views)

    return run


def verdicts(rules: ImportRules) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function for ``DataFrame.mapInArrow``: input batches in, ``VERDICT_SCHEMA`` batches
    out, one row per input row. Narrow on purpose: what the de-duplication of the offline sink
    needs of the possible repeats (``dedupe.possible_repeats``), cheap to keep; the sink runs
    the rules again where it writes."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        views = views_from_json(rules.views)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            none = np.zeros(batch.num_rows, bool)
            yield check_batch(batch, rules, views, record_for=none).select(list(VERDICT_COLUMNS))

    return run
