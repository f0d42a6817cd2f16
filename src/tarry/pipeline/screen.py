"""The first half of a map-only sink's task (``sink_log``, ``sink_http``): the one pass of the
model's rules over the task's input rows. It drops the rows the rules refuse and the later
repeats (``dedupe.Repeats``, found beforehand from the keys alone), hands both back as reject
columns (the rejects dataset's fields, with the record), counts the rows by verdict, and keeps
the accepted first rows of each key for the sink to write or post.

The rejects and the counts leave the task as its output rows, not as accumulators, so only the
attempt that succeeded is counted.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from tarry.pipeline.catalog import views_from_json
from tarry.pipeline.ddl import spark_ddl
from tarry.pipeline.dedupe import Repeats, duplicate_rejects
from tarry.pipeline.sources import ROW
from tarry.pipeline.validation import ImportRules, check_batch

__all__ = [
    "DUPLICATE_ROW",
    "REJECT",
    "REJECT_FIELDS",
    "VERDICTS",
    "Screen",
    "kind_rows",
    "spark_ddl",
]

#: Kinds of a sink's output rows shared by both sinks: a ``REJECT`` (a row the rules refused),
#: a ``DUPLICATE_ROW`` (a later repeat), a ``VERDICTS`` count (the task's rows with the verdict
#: ``code``, null for accepted, repeats included).
REJECT, DUPLICATE_ROW, VERDICTS = "reject", "duplicate", "verdicts"
#: The fields of a ``REJECT`` or ``DUPLICATE_ROW`` row.
REJECT_FIELDS = (ROW, "code", "message", "destination", "message_id", "record")

Rejects = tuple[str, dict[str, Any], int]


def kind_rows(schema: pa.Schema, kind: str, columns: dict[str, Any], n: int) -> pa.RecordBatch:
    """A batch of ``schema`` (a sink's output rows) of ``n`` rows of one ``kind``; the columns
    not given are null."""
    data = {f.name: columns.get(f.name, pa.nulls(n, f.type)) for f in schema}
    data["kind"] = pa.array([kind] * n, pa.string())
    return pa.RecordBatch.from_pydict(data, schema=schema)


class Screen:
    """One task's rules over its batches. ``every_record``: build the record (the send as JSON)
    of every kept row (the online sink posts it), or only of the rejects (the offline sink
    encodes the copies from the checked columns)."""

    def __init__(self, rules: ImportRules, repeats: Repeats, *, every_record: bool) -> None:
        self._rules = rules
        self._views = views_from_json(rules.views)
        self._repeats = repeats
        self._every_record = every_record
        self._verdicts: Counter[str | None] = Counter()

    def batch(self, batch: pa.RecordBatch) -> tuple[list[Rejects], pa.RecordBatch]:
        """The rejects of ``batch`` (kind, columns, rows) and its kept rows, checked."""
        first = self._repeats.first_of(batch.column(ROW).to_numpy())
        record_for = None if self._every_record else first >= 0
        checked = check_batch(batch, self._rules, self._views, record_for=record_for)
        accepted = np.asarray(checked.column("code").is_null().to_numpy(zero_copy_only=False))
        self._verdicts[None] += int(accepted.sum())
        rejects: list[Rejects] = []
        if not accepted.all():
            refused = checked.filter(pa.array(~accepted))
            self._verdicts.update(refused.column("code").to_pylist())
            columns = {name: refused.column(name) for name in REJECT_FIELDS}
            rejects.append((REJECT, columns, refused.num_rows))
        later = accepted & (first >= 0)
        if later.any():
            rows = checked.filter(pa.array(later))
            rejects.append((DUPLICATE_ROW, duplicate_rejects(rows, first[later]), rows.num_rows))
        return rejects, checked.filter(pa.array(accepted & ~later))

    def verdicts(self) -> tuple[pa.Array, pa.Array]:
        """The codes (null: accepted) and how many of the task's rows got each."""
        return (
            pa.array(list(self._verdicts), pa.string()),
            pa.array(list(self._verdicts.values()), pa.int64()),
        )
