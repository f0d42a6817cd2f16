"""The offline sink (``--into DATA_DIR``): the accepted copies written as segment files of the log
store's own format (``tarry.store.log.record``: framed, CRC32C-checked MESSAGE records) into an
import area, ``<data_dir>/log/imports/<import>/``, that the store adopts at its next start
(``tarry.store.log.adopt``: all or nothing, every file verified against the import manifest,
whose layout is described there).

The writer is map-only and the one pass of the rules over every row: each executor task reads its
own share of the input and screens it (``screen.Screen``: the rules, the rejects and the later
repeats as reject rows, the counts by verdict), encodes the copies of the kept rows column-wise
(``tarry.store.log.record_columns``: the same bytes as ``encode_message``) and keeps them in memory
until ``flush_bytes``; then it sorts them by (time partition, due time) and writes one file per time
partition it holds, all in the area itself (``<partition>.<task>-<i>.log``: no directory a
partition, as in the store's ``parts/``). The partitions are the store's own
(``store/log/layout.py``, the function its write path calls, applied to the import's now): a
year of due times makes about 200 partitions, coarser far ahead, not 105,120 of the store's
granularity. A partition gets several files (one
per task and flush), each sorted by due time. Each file is reported with its name, size, CRC32C and
record count; the driver writes ``IMPORT`` from those reports, so files of a failed task attempt are
never named (and adoption deletes the whole area afterwards).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tarry.model.ids import IdGenerator
from tarry.pipeline.dedupe import Repeats
from tarry.pipeline.screen import VERDICTS, Screen, kind_rows, spark_ddl
from tarry.pipeline.sources import ROW
from tarry.pipeline.validation import ImportRules
from tarry.store.log.layout import Layout
from tarry.store.log.record_columns import MessageColumns, dedupe_hashes, encode_message_columns

__all__ = [
    "FILE",
    "FILE_FIELDS",
    "SPAN",
    "WRITTEN_DDL",
    "LogSinkSettings",
    "import_area",
    "import_writer",
]

#: What the writer yields, one row each: a ``FILE`` written (name, partition key (``Layout``),
#: bytes, crc, records), a ``SPAN`` (``partition``: the start of an import partition,
#: ``partition_ms`` wide, that a kept row falls into), and the screen's rows (``screen``: ``REJECT``
#: and ``DUPLICATE_ROW`` with the reject fields, ``VERDICTS`` with the count in ``records``).
FILE, SPAN = "file", "span"
WRITTEN_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("name", pa.string()),
        ("partition", pa.int64()),
        ("bytes", pa.int64()),
        ("crc", pa.int64()),
        ("records", pa.int64()),
        (ROW, pa.int64()),
        ("code", pa.string()),
        ("message", pa.string()),
        ("destination", pa.string()),
        ("message_id", pa.string()),
        ("record", pa.string()),
    ]
)
WRITTEN_DDL = spark_ddl(WRITTEN_SCHEMA)
#: The fields of a ``FILE`` row, as the import manifest lists them.
FILE_FIELDS = ("name", "partition", "bytes", "crc", "records")


@dataclass(frozen=True, slots=True)
class LogSinkSettings:
    #: The area of this import: ``<data_dir>/log/imports/<id>``.
    area: Path
    #: The store's time-partition width (``[store] granularity_ms``).
    granularity_ms: int
    #: The import's now: the messages' ``sent_at``.
    now_ms: int
    #: Encoded bytes a task holds before it sorts and writes them (more: fewer, larger files).
    flush_bytes: int = 256 * 1024 * 1024


def import_area(data_dir: Path) -> Path:
    """A fresh import area under the data directory's log store."""
    return data_dir / "log" / "imports" / f"import-{uuid.uuid4().hex[:16]}"


def _write(path: Path, data: bytes) -> dict[str, Any]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return {"bytes": len(data), "crc": google_crc32c.value(data)}


def _copies(batch: pa.RecordBatch, ids: IdGenerator, now_ms: int) -> tuple[pa.Array, np.ndarray]:
    """The framed MESSAGE records of a batch of accepted rows: one per fan-out copy, in row
    order (``fan_out``: a queue gets the message, a topic one copy per subscriber, carrying the
    topic's name), each with the engine's de-duplication hash; and each copy's due time."""
    targets = batch.column("targets")
    parents = pc.list_parent_indices(targets)
    queue = pc.list_flatten(targets)

    def per_copy(name: str) -> pa.Array:
        return pc.take(batch.column(name), parents)

    # A row whose targets are just its destination went to a queue (or route); else a topic
    # (whose copies carry its name).
    destination = per_copy("destination")
    own = pc.and_(
        pc.equal(pc.take(pc.list_value_length(targets), parents), 1),
        pc.equal(queue, destination),
    )
    copy_topic = pc.if_else(own, pa.scalar(None, pa.string()), destination)
    message_id = per_copy("message_id")
    due = per_copy("deliver_at_ms").to_numpy(zero_copy_only=False)
    columns = MessageColumns(
        ids=ids.new_due_many(now_ms, due),
        destination=queue,
        topic=copy_topic,
        due_ms=due,
        sent_ms=now_ms,
        expires_ms=per_copy("expires_at_ms"),
        message_id=message_id,
        correlation_id=per_copy("correlation_id"),
        reply_to=per_copy("reply_to"),
        report=per_copy("report"),
        headers=per_copy("headers"),
        body=per_copy("body"),
        discard=np.asarray(per_copy("discard").to_numpy(zero_copy_only=False), bool),
        persistent=np.asarray(per_copy("persistent").to_numpy(zero_copy_only=False), bool),
    )
    hashes = dedupe_hashes(copy_topic, queue, message_id)
    return encode_message_columns(columns, hashes), due


class _Held:
    """One task's encoded copies not yet written, with their due times."""

    def __init__(self, settings: LogSinkSettings, task: str) -> None:
        self.settings = settings
        self.layout = Layout(settings.granularity_ms)
        self.task = task
        self.records: list[pa.Array] = []
        self.due: list[np.ndarray] = []
        self.nbytes = 0
        self.files = 0

    def add(self, records: pa.Array, due: np.ndarray) -> None:
        self.records.append(records)
        self.due.append(due)
        self.nbytes += records.nbytes

    def flush(self) -> list[dict[str, Any]]:
        """Sort what is held by (partition, due time), write one file per partition, forget
        it; the files' reports. A copy's partition is the one the store's own write path would
        give it, sent at the import's now (``Layout.keys_for``: coarser partitions far ahead)."""
        if not self.records:
            return []
        due = np.concatenate(self.due)
        numbers = self.layout.keys_for(due, self.settings.now_ms)
        order = np.lexsort((due, numbers))  # stable: equal due times keep their input order
        records = pa.concat_arrays(self.records).take(pa.array(order))
        numbers = numbers[order]
        self.records, self.due, self.nbytes = [], [], 0
        _, offsets, data = records.buffers()
        bounds = np.frombuffer(offsets, np.int32)[
            records.offset : records.offset + len(records) + 1
        ]
        starts = np.flatnonzero(np.r_[True, numbers[1:] != numbers[:-1]])
        ends = np.r_[starts[1:], len(numbers)]
        view = memoryview(data)
        reports = []
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
            number = int(numbers[a])
            name = f"{Layout.name_of(number)}.{self.task}-{self.files}.log"
            self.files += 1
            written = _write(self.settings.area / name, bytes(view[bounds[a] : bounds[b]]))
            reports.append({"name": name, "partition": number, "records": b - a, **written})
        return reports


def _rows(kind: str, columns: dict[str, Any], n: int) -> pa.RecordBatch:
    return kind_rows(WRITTEN_SCHEMA, kind, columns, n)


def import_writer(
    settings: LogSinkSettings, rules: ImportRules, repeats: Callable[[], Repeats]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function for ``mapInArrow`` over the input rows (``_row`` plus send-field columns):
    writes the kept copies (see the module docstring) and yields ``WRITTEN_SCHEMA`` rows.
    ``repeats`` gives the later rows of repeated keys (a broadcast variable's value)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        screen = Screen(rules, repeats(), every_record=False)
        ids = IdGenerator()
        held = _Held(settings, uuid.uuid4().hex[:12])
        reports: list[dict[str, Any]] = []
        spans: set[int] = set()
        for batch in batches:
            if batch.num_rows == 0:
                continue
            rejects, kept = screen.batch(batch)
            for kind, columns, n in rejects:
                yield _rows(kind, columns, n)
            if kept.num_rows == 0:
                continue
            spans.update(pc.unique(kept.column("partition_ms")).to_pylist())
            records, due = _copies(kept, ids, settings.now_ms)
            if len(records):  # none for topics without subscribers
                held.add(records, due)
            if held.nbytes >= settings.flush_bytes:
                reports += held.flush()
        reports += held.flush()
        if reports:
            columns = {k: pa.array([r[k] for r in reports]) for k in FILE_FIELDS}
            yield _rows(FILE, columns, len(reports))
        if spans:
            yield _rows(SPAN, {"partition": pa.array(sorted(spans), pa.int64())}, len(spans))
        codes, counts = screen.verdicts()
        yield _rows(VERDICTS, {"code": codes, "records": counts}, len(codes))

    return run
