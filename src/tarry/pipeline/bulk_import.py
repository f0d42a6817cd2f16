"""``tarry pipeline import``: read → check every row with the model's rules → drop repeats →
fan out and partition → load into tarry → rejects and a summary.

The Spark jobs, in order: (1) the destinations named (the catalog snapshot); (2) the rules;
(3) de-duplication, an aggregation of the keys; (4) the sink; (5) the rejects (offline, (2) and
(3) are one job, over the possible repeats only). Two shapes:

- offline (``--into``): map-only, the rules run once per row. The rows that may share a key
  are found from the raw key columns (their hashes, counted on the driver; no rules); the
  rules run on those few to find the later repeats exactly, which go to every task; each task
  then checks its input and writes its own segment files, its rejects and its counts
  (``sink_log``). No whole row is shuffled, and only the few possible repeats are kept.
- online (``--to``) and the Parquet plan alone: the checked rows, whole, are kept (``persist``)
  for the sends and the plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from tarry.errors import InvalidArgument
from tarry.model.validate import DestinationView
from tarry.pipeline.catalog import views_to_json
from tarry.pipeline.dedupe import find_repeats, possible_repeats, split_duplicates
from tarry.pipeline.progress import SparkProgress
from tarry.pipeline.sink_http import ALREADY_THERE, CREATED, SENT_DDL, SinkSettings, sender
from tarry.pipeline.sink_log import (
    COUNT,
    DUPLICATE_ROW,
    FILE,
    FILE_FIELDS,
    REJECT,
    SPAN,
    WRITTEN_DDL,
    LogSinkSettings,
    import_writer,
)
from tarry.pipeline.sources import ROW, load_input
from tarry.pipeline.summary import ImportSummary
from tarry.pipeline.validation import CHECKED_DDL, VERDICT_DDL, ImportRules, checker, verdicts

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["ImportOptions", "REJECT_COLUMNS", "run_import"]

#: The rejects dataset: the input row's position, why it was refused, and the row as read.
REJECT_COLUMNS = ("row", "code", "message", "destination", "message_id", "record")

Resolver = Callable[[list[str]], dict[str, DestinationView]]


class Releasable(Protocol):
    """A kept frame or a broadcast variable, released when the import is done."""

    def unpersist(self) -> object: ...


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


def _count_verdicts(checked: DataFrame, show: SparkProgress, summary: ImportSummary) -> int:
    """Runs the rules (the first action on ``checked``): rows read and rejected by code go into
    ``summary``; returns how many rows passed."""
    with show.phase("validating"):
        by_code = {code: n for code, n in checked.groupBy("code").count().collect()}
    summary.rows_read = sum(by_code.values())
    valid = int(by_code.pop(None, 0))
    summary.rejected = dict(by_code)
    return valid


def _import_offline(
    spark: SparkSession,
    frame: DataFrame,
    rules: ImportRules,
    options: ImportOptions,
    settings: LogSinkSettings,
    show: SparkProgress,
    summary: ImportSummary,
    kept: list[Releasable],
) -> DataFrame:
    """The offline sink, map-only: the rules run on the possible repeats (kept) to find the
    later ones; then every task checks its input and writes its own sorted segment files, its
    rejects and its counts (``sink_log``), so no row is shuffled whole. Writes ``IMPORT`` last;
    returns the rejects."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from tarry.store.log.adopt import ImportManifest, write_manifest

    with show.phase("dedupe"):
        # Kept: find_repeats reads it twice (the hash grouping and its semi-join).
        verdict = (
            possible_repeats(frame)
            .mapInArrow(verdicts(rules), VERDICT_DDL)
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        kept.append(verdict)
        repeats = find_repeats(verdict.where(F.col("code").isNull()))
    shared = spark.sparkContext.broadcast(repeats)
    kept.append(shared)
    settings.area.mkdir(parents=True, exist_ok=True)
    # Kept: the rejects below read the repeats from it, and running it again writes new files.
    written = frame.mapInArrow(
        import_writer(settings, rules, lambda: shared.value), WRITTEN_DDL
    ).persist(StorageLevel.MEMORY_AND_DISK)
    kept.append(written)
    with show.phase("segments"):
        reports = written.where(~F.col("kind").isin(REJECT, DUPLICATE_ROW)).collect()
        files = [{k: r[k] for k in FILE_FIELDS} for r in reports if r["kind"] == FILE]
        write_manifest(
            settings.area,
            ImportManifest(settings.area.name, settings.now_ms, settings.granularity_ms, files),
        )
    by_code: dict[str | None, int] = {}
    for r in reports:
        if r["kind"] == COUNT:  # each task's rows by verdict (null: accepted)
            by_code[r["code"]] = by_code.get(r["code"], 0) + int(r["records"])
    summary.rows_read = sum(by_code.values())
    valid = by_code.pop(None, 0)
    summary.rejected = {code: n for code, n in by_code.items() if code is not None}
    summary.files = len(files)
    summary.import_area = str(settings.area)
    summary.duplicates = len(repeats)
    summary.accepted = valid - summary.duplicates
    summary.copies = sum(int(f["records"]) for f in files)
    if options.partition_ms == settings.granularity_ms:
        # the partitions the copies fill (rows for topics without subscribers have none)
        summary.partitions = len({f["partition"] for f in files})
    else:
        summary.partitions = len({r["partition"] for r in reports if r["kind"] == SPAN})
    if options.plan_dir is not None:
        later = spark.createDataFrame(pa.table({ROW: pa.array(repeats.rows, pa.int64())}))
        checked = frame.mapInArrow(checker(rules), CHECKED_DDL)
        with show.phase("plan"):
            _write_plan(
                checked.where(F.col("code").isNull()).join(later, ROW, "left_anti"),
                options.plan_dir,
            )
    return _rejects(written.where(F.col("kind").isin(REJECT, DUPLICATE_ROW)))


def run_import(
    spark: SparkSession,
    options: ImportOptions,
    *,
    now_ms: int,
    resolve_views: Resolver,
    progress: SparkProgress | None = None,
    every_view: Callable[[], dict[str, DestinationView]] | None = None,
) -> ImportSummary:
    """Run one import; every row ends up imported, a duplicate, or in the rejects dataset.

    ``resolve_views`` looks up the destinations the input names (found by a pass over it);
    ``every_view``, when the whole catalog is cheap to read (the offline sink's data
    directory), gives it instead, and that pass is saved."""
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

    if every_view is not None:
        views = every_view()
    else:
        with show.phase("catalog"):
            names = [
                r[0]
                for r in frame.select(F.col("destination").cast("string")).distinct().collect()
                if r[0] is not None
            ]
        views = resolve_views(names)
    rules = ImportRules(
        now_ms=now_ms,
        views=tuple(views_to_json(views)),
        partition_ms=options.partition_ms,
        max_message_bytes=options.max_message_bytes,
    )
    kept: list[Releasable] = []
    if options.log_sink is not None:
        if options.sink is not None:
            raise InvalidArgument("give an online sink or an offline one, not both")
        rejects = _import_offline(
            spark, frame, rules, options, options.log_sink, show, summary, kept
        )
    else:
        rejects = _import_checked(frame, rules, options, show, summary, kept)
    with show.phase("rejects"):
        # repartition, not coalesce: the rows are few, but finding them should use every core
        rejects.repartition(1).write.mode("overwrite").parquet(str(options.rejects_dir))
    summary.seconds = time.perf_counter() - started
    summary.phases = dict(show.seconds)
    for item in kept:
        item.unpersist()
    return summary


def _import_checked(
    frame: DataFrame,
    rules: ImportRules,
    options: ImportOptions,
    show: SparkProgress,
    summary: ImportSummary,
    kept: list[Releasable],
) -> DataFrame:
    """The online sink and the plan: the checked rows, whole, kept for the sends and the plan;
    returns the rejects."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    checked = frame.mapInArrow(checker(rules), CHECKED_DDL).persist(StorageLevel.MEMORY_AND_DISK)
    kept.append(checked)
    valid = _count_verdicts(checked, show, summary)

    with show.phase("dedupe"):
        first, repeats, marked = split_duplicates(checked.where(F.col("code").isNull()))
    kept.append(marked)
    rejects = _rejects(checked.where(F.col("code").isNotNull())).unionByName(_rejects(repeats))
    imported = first
    refused_by_server = 0
    if options.sink is not None:
        outgoing = first.select(ROW, "destination", "message_id", "record")
        if options.send_partitions:
            outgoing = outgoing.repartition(options.send_partitions)
        sent = outgoing.mapInArrow(sender(options.sink), SENT_DDL).persist(
            StorageLevel.MEMORY_AND_DISK
        )
        kept.append(sent)
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
    return rejects
