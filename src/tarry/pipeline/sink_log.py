"""The offline sink (``--into DATA_DIR``): the accepted copies written as segment files of the log
store's own format (``tarry.store.log.record``: framed, CRC32C-checked MESSAGE records) into an
import area, ``<data_dir>/log/imports/<import>/``, that the store adopts at its next start
(``tarry.store.log.adopt``: all or nothing, every file verified against the import manifest,
whose layout is described there).

The records are encoded column-wise (``tarry.store.log.record_columns``: the same bytes as
``encode_message``), one Arrow batch at a time. Each executor task writes one file per time
partition it holds and reports its name, size, CRC32C and record count; the driver writes
``IMPORT`` from those reports, so files of a failed task attempt are never named (and adoption
deletes the whole area afterwards).
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
from tarry.pipeline.validation import MESSAGE_FIELDS
from tarry.store.log.record_columns import MessageColumns, dedupe_hashes, encode_message_columns

__all__ = ["SEGMENT_COLUMNS", "WRITTEN_DDL", "LogSinkSettings", "import_area", "segment_writer"]

WRITTEN_DDL = "name string, partition long, bytes long, crc long, records long"
#: The checked columns the writer reads (``tarry.pipeline.validation.CHECKED_SCHEMA``).
SEGMENT_COLUMNS = (
    "deliver_at_ms",
    "expires_at_ms",
    "targets",
    "destination",
    "message_id",
    *MESSAGE_FIELDS,
)


@dataclass(frozen=True, slots=True)
class LogSinkSettings:
    #: The area of this import: ``<data_dir>/log/imports/<id>``.
    area: Path
    #: The store's time-partition width (``[store] granularity_ms``).
    granularity_ms: int
    #: The import's now: the messages' ``sent_at``.
    now_ms: int


def import_area(data_dir: Path) -> Path:
    """A fresh import area under the data directory's log store."""
    return data_dir / "log" / "imports" / f"import-{uuid.uuid4().hex[:16]}"


class _Open:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.handle = open(path, "wb")  # noqa: SIM115 - closed in finish()
        self.crc = 0
        self.bytes = 0
        self.records = 0

    def write(self, data: bytes, records: int) -> None:
        self.handle.write(data)
        self.crc = google_crc32c.extend(self.crc, data)
        self.bytes += len(data)
        self.records += records

    def finish(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()


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


def segment_writer(
    settings: LogSinkSettings,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function for ``mapInArrow`` over accepted rows sorted by (partition, due time):
    writes the records, then yields one row per file written (``WRITTEN_DDL``)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = uuid.uuid4().hex[:12]
        ids = IdGenerator()
        files: dict[int, _Open] = {}
        for batch in batches:
            if batch.num_rows == 0:
                continue
            records, due = _copies(batch, ids, settings.now_ms)
            if len(records) == 0:  # topics without subscribers
                continue
            numbers = due // settings.granularity_ms
            _, offsets, data = records.buffers()
            bounds = np.frombuffer(offsets, np.int32)[
                records.offset : records.offset + len(records) + 1
            ]
            # Rows arrive sorted by partition: each partition's copies are one run of bytes.
            starts = np.flatnonzero(np.r_[True, numbers[1:] != numbers[:-1]])
            ends = np.r_[starts[1:], len(numbers)]
            view = memoryview(data)
            for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
                number = int(numbers[a])
                out = files.get(number)
                if out is None:
                    out = files[number] = _Open(
                        settings.area / f"p-{number:010d}" / f"{task}-{len(files)}.log"
                    )
                out.write(bytes(view[bounds[a] : bounds[b]]), b - a)
        written: dict[str, list[Any]] = {n: [] for n in ("name", "partition", "bytes", "crc")}
        written["records"] = []
        for number, out in files.items():
            out.finish()
            written["name"].append(str(out.path.relative_to(settings.area)))
            written["partition"].append(number)
            written["bytes"].append(out.bytes)
            written["crc"].append(out.crc)
            written["records"].append(out.records)
        if files:
            yield pa.RecordBatch.from_pydict(
                written,
                schema=pa.schema(
                    [
                        ("name", pa.string()),
                        ("partition", pa.int64()),
                        ("bytes", pa.int64()),
                        ("crc", pa.int64()),
                        ("records", pa.int64()),
                    ]
                ),
            )

    return run
