"""The send rules inside Spark: one ``mapInArrow`` step that runs ``tarry.model.batch`` on every
Arrow batch of input rows, in the executors' Python workers.

Each input row comes out as exactly one row of ``CHECKED_SCHEMA``: accepted (``code`` null) with
its due time, expiry, time partition and fan-out targets, or rejected with the error code and
message the HTTP API would have given. Nothing is dropped here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from tarry.errors import TarryError
from tarry.model.batch import parse_batch, validate_batch
from tarry.model.fanout import targets_of
from tarry.model.validate import DestinationView, SendLimits
from tarry.pipeline.catalog import views_from_json
from tarry.pipeline.records import decode_row, derived_message_id, record_json
from tarry.pipeline.sources import ROW

__all__ = ["CHECKED_DDL", "CHECKED_SCHEMA", "ImportRules", "check_rows", "checker"]


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
    ]
)
CHECKED_DDL = (
    f"{ROW} long, destination string, message_id string, code string, message string, "
    "deliver_at_ms long, expires_at_ms long, partition_ms long, targets array<string>, "
    "record string"
)


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


def check_rows(
    rows: Sequence[dict[str, Any]],
    ordinals: Sequence[int],
    rules: ImportRules,
    views: dict[str, DestinationView],
) -> pa.RecordBatch:
    """The rules over one batch of input rows (plain dicts named by send field)."""
    sends: list[dict[str, Any]] = []
    decode_errors: dict[int, TarryError] = {}
    for index, row in enumerate(rows):
        try:
            data = decode_row(row)
        except TarryError as exc:
            decode_errors[index] = exc
            data = {k: v for k, v in row.items() if v is not None and k != "headers"}
        if "message_id" not in data:
            data["message_id"] = derived_message_id(data)
        sends.append(data)
    parsed = parse_batch(sends)
    for index, error in decode_errors.items():
        parsed[index] = error
    planned = validate_batch(
        parsed,
        now_ms=rules.now_ms,
        views=views,
        limits=SendLimits(max_message_bytes=rules.max_message_bytes),
    )
    columns: dict[str, list[Any]] = {name: [] for name in CHECKED_SCHEMA.names}
    span = rules.partition_ms
    for ordinal, data, plan in zip(ordinals, sends, planned, strict=True):
        destination = data.get("destination")
        columns[ROW].append(ordinal)
        columns["destination"].append(None if destination is None else str(destination))
        message_id = data.get("message_id")
        columns["message_id"].append(None if message_id is None else str(message_id))
        columns["record"].append(record_json(data).decode())
        if isinstance(plan, TarryError):
            columns["code"].append(plan.code)
            columns["message"].append(plan.message)
            for name in ("deliver_at_ms", "expires_at_ms", "partition_ms", "targets"):
                columns[name].append(None)
            continue
        columns["code"].append(None)
        columns["message"].append(None)
        columns["deliver_at_ms"].append(plan.deliver_at_ms)
        columns["expires_at_ms"].append(plan.expires_at_ms)
        columns["partition_ms"].append(plan.deliver_at_ms - plan.deliver_at_ms % span)
        destination = plan.request.destination
        columns["targets"].append([q for q, _ in targets_of(destination, views.get(destination))])
    return pa.RecordBatch.from_pydict(columns, schema=CHECKED_SCHEMA)


def checker(rules: ImportRules) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function for ``DataFrame.mapInArrow``: input batches (send-field columns plus
    ``_row``) in, ``CHECKED_SCHEMA`` batches out."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        views = views_from_json(rules.views)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            names = [n for n in batch.schema.names if n != ROW]
            columns = [batch.column(n).to_pylist() for n in names]  # faster than row dicts
            rows = [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]
            yield check_rows(rows, batch.column(ROW).to_pylist(), rules, views)

    return run
