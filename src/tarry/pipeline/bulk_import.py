"""``tarry pipeline import``: read → check every row with the model's rules → drop repeats →
fan out and partition → load into tarry → rejects and a summary.

The Spark jobs, in order: (1) the destinations named (the catalog snapshot); (2) the rules;
(3) de-duplication, an aggregation of the keys; (4) the sink; (5) the rejects (with a sink, (2)
and (3) are one job over the possible repeats only, and the sink runs the rules on every row).
Two shapes:

- offline (``--into``) and online (``--to``): map-only, the rules run once per row. The rows
  that may share a key are found from the raw key columns (their hashes counted by Spark, no
  rules); the rules run on those few to find the later repeats exactly, which go to every task;
  each task then screens its input (``screen``: rejects and counts by verdict come back as its
  output rows) and writes its own segment files (``sink_log``) or posts its first rows of each
  key to the server (``sink_http``). No whole row is shuffled, and only the few possible
  repeats are kept.
- the Parquet plan alone: the checked rows, whole, are kept (``persist``) for the plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

from tarry.errors import InvalidArgument
from tarry.model.validate import DestinationView
from tarry.pipeline import sink_http
from tarry.pipeline.catalog import views_to_json
from tarry.pipeline.dedupe import Repeats, find_repeats, possible_repeats, split_duplicates
from tarry.pipeline.executors import Executors
from tarry.pipeline.progress import SparkProgress
from tarry.pipeline.screen import DUPLICATE_ROW, REJECT, VERDICTS
from tarry.pipeline.session import default_parallelism, input_partitions, session_settings
from tarry.pipeline.sink_http import SENT_DDL, SinkSettings, sender
from tarry.pipeline.sink_log import (
    FILE,
    FILE_FIELDS,
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
    """A kept frame, released when the import is done."""

    def unpersist(self) -> object: ...


@dataclass(frozen=True, slots=True)
class ImportOptions:
    #: A local path or a shared store's URL (``s3a://...``), as are the other locations.
    input: Path | str
    rejects_dir: Path | str
    fmt: str | None = None
    mapping: dict[str, str] = field(default_factory=dict)
    #: The online sink (``--to URL``).
    sink: SinkSettings | None = None
    #: The offline sink (``--into DATA_DIR``): segment files in the log store's format.
    log_sink: LogSinkSettings | None = None
    #: Write the accepted copies, partitioned by time and sorted by due time, as Parquet.
    plan_dir: Path | str | None = None
    partition_ms: int = 3_600_000
    max_message_bytes: int = 4 * 1024 * 1024


def _rejects(frame: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return frame.select(
        F.col(ROW).alias("row"), "code", "message", "destination", "message_id", "record"
    )


def _write_plan(first: DataFrame, path: Path | str) -> None:
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


def _write_plan_without(
    frame: DataFrame,
    rules: ImportRules,
    dropped: DataFrame,
    path: Path | str,
    executors: Executors,
) -> None:
    """The plan of the accepted rows but ``dropped`` (a frame of ``_row``: later repeats, rows
    the server refused), checked again from the input."""
    from pyspark.sql import functions as F

    checked = frame.mapInArrow(executors.function(checker(rules)), CHECKED_DDL)
    _write_plan(checked.where(F.col("code").isNull()).join(dropped, ROW, "left_anti"), path)


def _later_rows(spark: SparkSession, repeats: Repeats) -> DataFrame:
    return spark.createDataFrame(pa.table({ROW: pa.array(repeats.rows, pa.int64())}))


def _tally(counts: Iterable[tuple[str | None, int]], summary: ImportSummary) -> int:
    """Rows by verdict (``code``, null: passed; a code may come several times, once per task):
    rows read and rejected by code go into ``summary``; returns how many rows passed."""
    by_code: dict[str | None, int] = {}
    for code, n in counts:
        by_code[code] = by_code.get(code, 0) + int(n)
    summary.rows_read = sum(by_code.values())
    valid = by_code.pop(None, 0)
    summary.rejected = {code: n for code, n in by_code.items() if code is not None}
    return valid


def _count_verdicts(checked: DataFrame, show: SparkProgress, summary: ImportSummary) -> int:
    """Runs the rules (the first action on ``checked``) and counts them (``_tally``)."""
    with show.phase("validating"):
        return _tally(checked.groupBy("code").count().collect(), summary)


def _later_repeats(
    spark: SparkSession,
    frame: DataFrame,
    rules: ImportRules,
    show: SparkProgress,
    kept: list[Releasable],
    executors: Executors,
) -> Repeats:
    """The first half of both map-only sinks: the later repeats, found by the rules over the
    possible repeats only (``dedupe``). They are few, so they travel to the tasks that screen
    the input inside the tasks' function (Spark Connect has no broadcast variables; a large
    function is broadcast by Spark itself)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    # Nearly every key hash is distinct: the partial aggregation before the shuffle saves no
    # rows, so it is pure cost.
    one_phase = {"spark.sql.execution.bypassPartialAggregation": "true"}
    with show.phase("dedupe"), session_settings(spark, one_phase):
        # Kept: find_repeats reads it twice (the key grouping and its semi-join).
        verdict = (
            possible_repeats(frame)
            .mapInArrow(executors.function(verdicts(rules)), VERDICT_DDL)
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        kept.append(verdict)
        return find_repeats(verdict.where(F.col("code").isNull()))


def _sink_rejects(out: DataFrame, *kinds: str) -> DataFrame:
    """The rejects a sink's tasks yielded: the screen's and the sink's own ``kinds``."""
    from pyspark.sql import functions as F

    return _rejects(out.where(F.col("kind").isin(REJECT, DUPLICATE_ROW, *kinds)))


def _import_offline(
    spark: SparkSession,
    frame: DataFrame,
    rules: ImportRules,
    options: ImportOptions,
    settings: LogSinkSettings,
    show: SparkProgress,
    summary: ImportSummary,
    kept: list[Releasable],
    executors: Executors,
) -> DataFrame:
    """The offline sink, map-only: the rules run on the possible repeats (kept) to find the
    later ones; then every task checks its input and writes its own sorted segment files, its
    rejects and its counts (``sink_log``), so no row is shuffled whole. Writes ``IMPORT`` last;
    returns the rejects."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from tarry.store.log.adopt import ImportManifest, write_manifest

    repeats = _later_repeats(spark, frame, rules, show, kept, executors)
    settings.area.mkdir(parents=True, exist_ok=True)
    # Kept: the rejects below read the repeats from it, and running it again writes new files.
    written = frame.mapInArrow(
        executors.function(import_writer(settings, rules, lambda: repeats)), WRITTEN_DDL
    ).persist(StorageLevel.MEMORY_AND_DISK)
    kept.append(written)
    with show.phase("segments"):
        reports = written.where(~F.col("kind").isin(REJECT, DUPLICATE_ROW)).collect()
        files = [{k: r[k] for k in FILE_FIELDS} for r in reports if r["kind"] == FILE]
        write_manifest(
            settings.area,
            ImportManifest(settings.area.name, settings.now_ms, settings.granularity_ms, files),
        )
    valid = _tally(((r["code"], r["records"]) for r in reports if r["kind"] == VERDICTS), summary)
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
        with show.phase("plan"):
            later = _later_rows(spark, repeats)
            _write_plan_without(frame, rules, later, options.plan_dir, executors)
    return _sink_rejects(written)


def run_import(
    spark: SparkSession,
    options: ImportOptions,
    *,
    now_ms: int,
    resolve_views: Resolver,
    progress: SparkProgress | None = None,
    every_view: Callable[[], dict[str, DestinationView]] | None = None,
    executors: Executors | None = None,
) -> ImportSummary:
    """Run one import; every row ends up imported, a duplicate, or in the rejects dataset.

    ``resolve_views`` looks up the destinations the input names (found by a pass over it);
    ``every_view``, when the whole catalog is cheap to read (the offline sink's data
    directory), gives it instead, and that pass is saved. ``executors``: where the tasks run
    and what they need shipped (``prepare_executors``; default: this machine, ``local[N]``)."""
    from pyspark.sql import functions as F

    show = progress or SparkProgress(spark, enabled=False)
    started = time.perf_counter()
    summary = ImportSummary(rejects_dir=str(options.rejects_dir))
    frame, summary.ignored_columns = load_input(spark, options.input, options.fmt, options.mapping)
    executors = executors or Executors(default_parallelism(spark))
    cores = executors.cores
    if input_partitions(frame) < cores:
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
            spark, frame, rules, options, options.log_sink, show, summary, kept, executors
        )
    elif options.sink is not None:
        rejects = _import_online(
            spark, frame, rules, options, options.sink, show, summary, kept, executors
        )
    else:
        rejects = _import_checked(frame, rules, options, show, summary, kept, executors)
    with show.phase("rejects"):
        # repartition, not coalesce: the rows are few, but finding them should use every core
        rejects.repartition(1).write.mode("overwrite").parquet(str(options.rejects_dir))
    summary.seconds = time.perf_counter() - started
    summary.phases = dict(show.seconds)
    for item in kept:
        item.unpersist()
    return summary


def _import_online(
    spark: SparkSession,
    frame: DataFrame,
    rules: ImportRules,
    options: ImportOptions,
    settings: SinkSettings,
    show: SparkProgress,
    summary: ImportSummary,
    kept: list[Releasable],
    executors: Executors,
) -> DataFrame:
    """The online sink, map-only like the offline one: the later repeats found beforehand go to
    every task, which screens its input and posts its first rows of each key (``sink_http``);
    the counts and the rejects are its output rows. Returns the rejects."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    repeats = _later_repeats(spark, frame, rules, show, kept, executors)
    # Kept: the rejects read it, and running it again posts everything again.
    sent = frame.mapInArrow(
        executors.function(sender(settings, rules, lambda: repeats)), SENT_DDL
    ).persist(StorageLevel.MEMORY_AND_DISK)
    kept.append(sent)
    with show.phase("sending"):
        totals = (
            sent.where(~F.col("kind").isin(REJECT, DUPLICATE_ROW))
            .groupBy("kind", "code")
            .agg(F.sum("rows"), F.sum("copies"), F.count_distinct("partition"))
            .collect()
        )
    valid = _tally(((code, rows) for kind, code, rows, _, _ in totals if kind == VERDICTS), summary)
    refused_by_server = 0
    for kind, code, rows, copies, partitions in totals:
        if kind == sink_http.COUNT:
            if code == sink_http.CREATED:
                summary.created = int(rows)
            else:
                summary.already_there = int(rows)
            summary.copies += int(copies)
        elif kind == sink_http.SPAN:
            summary.partitions = int(partitions)
        elif kind == sink_http.REFUSED:  # rows the server refused for good are not imported
            summary.rejected[code] = summary.rejected.get(code, 0) + int(rows)
            refused_by_server += int(rows)
    summary.duplicates = len(repeats)
    summary.accepted = valid - summary.duplicates - refused_by_server
    if options.plan_dir is not None:
        with show.phase("plan"):
            dropped = _later_rows(spark, repeats).unionByName(
                sent.where(F.col("kind") == sink_http.REFUSED).select(ROW)
            )
            _write_plan_without(frame, rules, dropped, options.plan_dir, executors)
    return _sink_rejects(sent, sink_http.REFUSED)


def _import_checked(
    frame: DataFrame,
    rules: ImportRules,
    options: ImportOptions,
    show: SparkProgress,
    summary: ImportSummary,
    kept: list[Releasable],
    executors: Executors,
) -> DataFrame:
    """The plan alone: the checked rows, whole, kept for the plan and the counts; returns the
    rejects."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    checked = frame.mapInArrow(executors.function(checker(rules)), CHECKED_DDL).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    kept.append(checked)
    valid = _count_verdicts(checked, show, summary)

    with show.phase("dedupe"):
        first, repeats, marked = split_duplicates(checked.where(F.col("code").isNull()))
    kept.append(marked)
    rejects = _rejects(checked.where(F.col("code").isNotNull())).unionByName(_rejects(repeats))
    if options.plan_dir is not None:
        with show.phase("plan"):
            _write_plan(first, options.plan_dir)
    with show.phase("counting"):
        totals = first.agg(
            F.count(F.lit(1)),
            F.sum(F.size("targets")),
            F.count_distinct("partition_ms"),
        ).first()
    assert totals is not None
    summary.accepted = int(totals[0])
    summary.copies = int(totals[1] or 0)
    summary.partitions = int(totals[2])
    summary.duplicates = valid - summary.accepted
    return rejects
