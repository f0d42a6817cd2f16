"""``tarry pipeline import``: read → check every row with the model's rules → drop repeats →
fan out and partition → load into tarry → rejects and a summary.

The Spark jobs, in order: (1) the destinations named (the catalog snapshot); (2) the rules, run
once and kept (``persist``) for what follows; (3) de-duplication, an aggregation of the keys;
(4) the sinks: online (``sink_http``), offline (``sink_log``), the Parquet plan; (5) the rejects.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tarry.model.validate import DestinationView
from tarry.pipeline.catalog import views_to_json
from tarry.pipeline.dedupe import split_duplicates
from tarry.pipeline.progress import SparkProgress
from tarry.pipeline.sink_http import ALREADY_THERE, CREATED, SENT_DDL, SinkSettings, sender
from tarry.pipeline.sink_log import SEGMENT_COLUMNS, WRITTEN_DDL, LogSinkSettings, segment_writer
from tarry.pipeline.sources import ROW, load_input
from tarry.pipeline.summary import ImportSummary
from tarry.pipeline.validation import CHECKED_DDL, ImportRules, checker

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["ImportOptions", "REJECT_COLUMNS", "run_import"]

#: The rejects dataset: the input row's position, why it was refused, and the row as read.
REJECT_COLUMNS = ("row", "code", "message", "destination", "message_id", "record")

Resolver = Callable[[list[str]], dict[str, DestinationView]]


@dataclass(frozen=True, slots=True)
class ImportOptions:
    input: Path
    rejects_dir: Path
    fmt: str | None = None
    mapping: dict[str, str] = field(default_factory=dict)
    #: The online sink (``--to URL``).
    sink: SinkSettings | None = None
    #: The offline sink (``--into DATA_DIR``): segment files in the log store's format.
    log_sink: LogSinkSettings | None = None
    #: Write the accepted copies, partitioned by time and sorted by due time, as Parquet.
    plan_dir: Path | None = None
    partition_ms: int = 3_600_000
    max_message_bytes: int = 4 * 1024 * 1024
    #: Spark partitions the online sink sends from (parallel connections to the server).
    send_partitions: int | None = None


def _rejects(frame: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return frame.select(
        F.col(ROW).alias("row"), "code", "message", "destination", "message_id", "record"
    )


def _write_plan(first: DataFrame, path: Path) -> None:
    from pyspark.sql import functions as F

    copies = first.select(
        F.explode("targets").alias("queue"),
        F.when(F.col("targets") != F.array("destination"), F.col("destination")).alias("topic"),
        "message_id",
        "deliver_at_ms",
        "expires_at_ms",
        "partition_ms",
        "record",
    )
    (
        copies.repartition("partition_ms")
        .sortWithinPartitions("partition_ms", "deliver_at_ms", "queue")
        .write.mode("overwrite")
        .partitionBy("partition_ms")
        .parquet(str(path))
    )


def _write_segments(imported: DataFrame, settings: LogSinkSettings) -> list[dict[str, Any]]:
    """Segment files per time partition, sorted by due time, then the import manifest (last);
    returns the files' reports (``WRITTEN_DDL``)."""
    from pyspark.sql import functions as F

    from tarry.store.log.adopt import ImportManifest, write_manifest

    number = F.floor(F.col("deliver_at_ms") / settings.granularity_ms)
    settings.area.mkdir(parents=True, exist_ok=True)
    written = (
        imported.withColumn("_number", number)
        .repartition("_number")
        .sortWithinPartitions("_number", "deliver_at_ms")
        .select(*SEGMENT_COLUMNS)
        .mapInArrow(segment_writer(settings), WRITTEN_DDL)
        .collect()
    )
    files = [row.asDict() for row in written]
    write_manifest(
        settings.area,
        ImportManifest(settings.area.name, settings.now_ms, settings.granularity_ms, files),
    )
    return files


def run_import(
    spark: SparkSession,
    options: ImportOptions,
    *,
    now_ms: int,
    resolve_views: Resolver,
    progress: SparkProgress | None = None,
) -> ImportSummary:
    """Run one import; every row ends up imported, a duplicate, or in the rejects dataset."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    show = progress or SparkProgress(spark, enabled=False)
    started = time.perf_counter()
    summary = ImportSummary(rejects_dir=str(options.rejects_dir))
    frame, summary.ignored_columns = load_input(spark, options.input, options.fmt, options.mapping)
    cores = spark.sparkContext.defaultParallelism
    if frame.rdd.getNumPartitions() < cores:
        # A small input (one Parquet row group, one CSV file) reads as fewer tasks than cores;
        # the rules are the costly step, so spread the rows before them.
        frame = frame.repartition(cores)

    with show.phase("catalog"):
        names = [
            r[0]
            for r in frame.select(F.col("destination").cast("string")).distinct().collect()
            if r[0] is not None
        ]
    rules = ImportRules(
        now_ms=now_ms,
        views=tuple(views_to_json(resolve_views(names))),
        partition_ms=options.partition_ms,
        max_message_bytes=options.max_message_bytes,
    )
    checked = frame.mapInArrow(checker(rules), CHECKED_DDL).persist(StorageLevel.MEMORY_AND_DISK)
    with show.phase("validating"):
        by_code = {code: n for code, n in checked.groupBy("code").count().collect()}
    summary.rows_read = sum(by_code.values())
    valid = by_code.pop(None, 0)
    summary.rejected = dict(by_code)

    with show.phase("dedupe"):
        first, repeats, marked = split_duplicates(checked.where(F.col("code").isNull()))
    rejects = _rejects(checked.where(F.col("code").isNotNull())).unionByName(_rejects(repeats))
    imported = first
    sent = None
    refused_by_server = 0
    if options.sink is not None:
        outgoing = first.select(ROW, "destination", "message_id", "record")
        if options.send_partitions:
            outgoing = outgoing.repartition(options.send_partitions)
        sent = outgoing.mapInArrow(sender(options.sink), SENT_DDL).persist(
            StorageLevel.MEMORY_AND_DISK
        )
        with show.phase("sending"):
            outcomes = {o: n for o, n in sent.groupBy("outcome").count().collect()}
        summary.created = outcomes.pop(CREATED, 0)
        summary.already_there = outcomes.pop(ALREADY_THERE, 0)
        for code, n in outcomes.items():
            summary.rejected[code] = summary.rejected.get(code, 0) + n
            refused_by_server += n
        if outcomes:  # rows the server refused for good are not imported
            failed = sent.where(~F.col("outcome").isin(CREATED, ALREADY_THERE))
            rejects = rejects.unionByName(_rejects(failed.withColumnRenamed("outcome", "code")))
            imported = first.join(failed.select(ROW), ROW, "left_anti")
    if options.plan_dir is not None:
        with show.phase("plan"):
            _write_plan(imported, options.plan_dir)
    files: list[dict[str, Any]] | None = None
    if options.log_sink is not None:
        with show.phase("segments"):
            files = _write_segments(imported, options.log_sink)
            summary.files = len(files)
            summary.import_area = str(options.log_sink.area)
    same_partitions = (
        options.log_sink is not None and options.partition_ms == options.log_sink.granularity_ms
    )
    if files is not None and sent is None and same_partitions:
        # Offline only: the writers' reports and the repeated keys say it all, without another
        # pass over every row (the rows with no copy, for topics without subscribers, are in
        # ``accepted`` but in no file).
        repeats_n = marked.agg(F.sum(F.col("_n") - 1)).first()
        summary.duplicates = int((repeats_n[0] if repeats_n else 0) or 0)
        summary.accepted = valid - summary.duplicates
        summary.copies = sum(int(f["records"]) for f in files)
        summary.partitions = len({f["partition"] for f in files})
    else:
        with show.phase("counting"):
            totals = imported.agg(
                F.count(F.lit(1)),
                F.sum(F.size("targets")),
                F.count_distinct("partition_ms"),
            ).first()
        assert totals is not None
        summary.accepted = int(totals[0])
        summary.copies = int(totals[1] or 0)
        summary.partitions = int(totals[2])
        summary.duplicates = valid - summary.accepted - refused_by_server
    with show.phase("rejects"):
        # repartition, not coalesce: the rows are few, but finding them should use every core
        rejects.repartition(1).write.mode("overwrite").parquet(str(options.rejects_dir))
    summary.seconds = time.perf_counter() - started
    summary.phases = dict(show.seconds)
    for frame_ in (checked, marked, sent):
        if frame_ is not None:
            frame_.unpersist()
    return summary
