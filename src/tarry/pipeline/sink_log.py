"""The offline sink (``--into DATA_DIR``): the accepted copies written as segment files of the log
store's own format (``tarry.store.log.record``: framed, CRC32C-checked MESSAGE records) into an
import area, ``<data_dir>/log/imports/<import>/``, that the store adopts at its next start
(``tarry.store.log.adopt``: all or nothing, every file verified against the import manifest,
whose layout is described there).

Each executor task writes one file per time partition it holds and reports its name, size,
CRC32C and record count; the driver writes ``IMPORT`` from those reports, so files of a failed
task attempt are never named (and adoption deletes the whole area afterwards).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
import orjson
import pyarrow as pa

from tarry.model.fanout import fan_out
from tarry.model.ids import IdGenerator
from tarry.model.message import Message, SendPlan
from tarry.model.validate import DestinationView, TargetView, parse_send
from tarry.store.log.held import dedupe_hash
from tarry.store.log.record import encode_message

__all__ = ["WRITTEN_DDL", "LogSinkSettings", "import_area", "segment_writer"]

WRITTEN_DDL = "name string, partition long, bytes long, crc long, records long"


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

    def write(self, data: bytes) -> None:
        self.handle.write(data)
        self.crc = google_crc32c.extend(self.crc, data)
        self.bytes += len(data)
        self.records += 1

    def finish(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()


def _messages(
    record: dict[str, Any], row: dict[str, Any], ids: IdGenerator, now_ms: int
) -> list[Message]:
    """The copies of one accepted row, built as the engine builds them at send time."""
    request = parse_send(record)
    targets = row["targets"]
    kind = "queue" if targets == [request.destination] else "topic"
    view = DestinationView(request.destination, kind, tuple(TargetView(q) for q in targets))
    plan = SendPlan(
        request=request,
        sent_at_ms=now_ms,
        deliver_at_ms=int(row["deliver_at_ms"]),
        expires_at_ms=row["expires_at_ms"],
    )
    return fan_out(plan, view, ids.new_due)


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
            for row in batch.to_pylist():
                number = int(row["deliver_at_ms"]) // settings.granularity_ms
                out = files.get(number)
                if out is None:
                    out = files[number] = _Open(
                        settings.area / f"p-{number:010d}" / f"{task}-{len(files)}.log"
                    )
                record = orjson.loads(row["record"])
                for message in _messages(record, row, ids, settings.now_ms):
                    out.write(encode_message(message, dedupe_hash(message)))
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
