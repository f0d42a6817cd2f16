"""``tarry pipeline report``: delivery analytics over the journals of any number of nodes.

Tables (each written as Parquet under ``--out``, and drawn in ``report.html``):

``hourly``            per destination and hour of the event: a count per event kind; lateness
                      p50/p95/p99/max of the releases (``released``, or ``delivered`` for routes);
                      ``expiry_rate`` and ``dead_letter_rate`` = expired (dead_lettered) / messages
                      that ended in that hour (acked, delivered, expired, dead_lettered,
                      cancelled); ``cancellations``.
``lateness``          the same percentiles per hour over all destinations (the chart).
``outcomes``          events by kind over everything read (the outcome mix).
``forecast_minute``   pending messages falling due per minute over the next 24 h;
``forecast_hour``     the same per hour over the next 30 days. A message is pending when its
                      latest event is ``scheduled``, ``rescheduled`` or ``failed``; it falls due
                      at that event's ``deliver_at``. Overdue ones are counted in the summary.

Percentiles are exact nearest ranks (the smallest lateness with at least p of the releases at or
below it) for any number of releases.

How it runs: parsing JSON is most of the work, so the journal is parsed once into a narrow frame
(the event as its step in ``_LIFECYCLE``, a byte) kept in memory as uncompressed columns. Every
per-hour table comes from one grouping of it by destination, hour, event and release lateness
(a small frame: latenesses are whole milliseconds), and the forecasts from one small frame of
pending messages counted per minute of falling due, not from the pending messages themselves.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tarry.errors import InvalidArgument
from tarry.pipeline.progress import SparkProgress
from tarry.pipeline.report_html import render_report
from tarry.pipeline.session import default_parallelism, session_settings

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "EVENTS",
    "forecasts",
    "journal_events",
    "journal_paths",
    "outcomes_of",
    "report_tables",
    "run_report",
]

EVENTS = (
    "scheduled",
    "released",
    "received",
    "acked",
    "nacked",
    "expired",
    "dead_lettered",
    "cancelled",
    "rescheduled",
    "failed",
    "delivered",
)
_RELEASES = ("released", "delivered")
_ENDINGS = ("acked", "delivered", "expired", "dead_lettered", "cancelled")
_PENDING = ("scheduled", "rescheduled", "failed")
#: The order of a message's events within one millisecond.
_LIFECYCLE = (
    "scheduled",
    "rescheduled",
    "failed",
    "released",
    "delivered",
    "received",
    "nacked",
    "acked",
    "expired",
    "dead_lettered",
    "cancelled",
)
#: The columns of the journal's fixed schema (tarry/journal/writer.py) that the report reads;
#: the JSON reader skips the rest.
_READ = "event string, time long, id string, destination string, deliver_at long, lateness_ms long"
_STEP = {event: index for index, event in enumerate(_LIFECYCLE)}
HOUR_MS, MINUTE_MS = 3_600_000, 60_000
DAY_MS = 24 * HOUR_MS
#: Session settings while the report runs (restored after):
#: - the cache of parsed events without compression: compressing it adds CPU to every event on
#:   top of the parsing, and the columns fit in memory (about 60 bytes an event, spilled to disk
#:   beyond);
#: - at least four reading tasks per core, so a single large journal file keeps every core busy
#:   (Spark otherwise splits at 128 MB: 1M events, 294 MB, were three tasks on two cores).
_READ_SETTINGS = {"spark.sql.inMemoryColumnarStorage.compressed": "false"}
_TASKS_PER_CORE = 4


def journal_paths(data_dirs: Iterable[Path], journals: Iterable[Path]) -> list[Path]:
    """Every journal file under the data directories (``journal/``) and the given paths."""
    found: list[Path] = []
    for directory in data_dirs:
        found += sorted((directory / "journal").glob("*.jsonl*"))
    for path in journals:
        found += sorted(path.glob("*.jsonl*")) if path.is_dir() else [path]
    if not found:
        raise InvalidArgument(
            "no journal files found; give --data DIR (a server's data directory) or "
            "--journal PATH (journal-*.jsonl files)"
        )
    return found


_QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))


def _percentiles(counted: DataFrame, keys: Sequence[str]) -> DataFrame:
    """Nearest-rank lateness percentiles per ``keys`` from ``counted`` rows (``keys``,
    ``lateness_ms``, ``n``: how many releases had that lateness): the smallest lateness with at
    least p of the group's releases at or below it, i.e. cumulative count >= ceil(p × releases),
    computed in doubles as Spark's own percentile does. Exact for any group size, and the rows are
    few (latenesses are whole milliseconds, mostly small), so this costs little beside the events'
    one grouping that made them."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    group = Window.partitionBy(*keys)
    running = group.orderBy("lateness_ms").rowsBetween(Window.unboundedPreceding, 0)
    ranked = counted.select(
        *keys,
        "lateness_ms",
        F.sum("n").over(running).alias("at_or_below"),
        F.sum("n").over(group).alias("total"),
    )
    return ranked.groupBy(*keys).agg(
        *[
            F.min(
                F.when(
                    F.col("at_or_below") >= F.ceil(F.lit(q) * F.col("total")),
                    F.col("lateness_ms"),
                )
            ).alias(f"lateness_{name}_ms")
            for name, q in _QUANTILES
        ],
        F.max("lateness_ms").alias("lateness_max_ms"),
        F.coalesce(F.first("total"), F.lit(0)).alias("releases"),  # never null, as a count
    )


def journal_events(spark: SparkSession, paths: Sequence[Path]) -> DataFrame:
    """The journal lines the report uses, narrowed: ``step`` (the event's index in
    ``_LIFECYCLE``, ``len(EVENTS)`` for an unknown kind), ``time``, ``id``, ``destination``,
    ``deliver_at``, ``lateness_ms``. Lines without an event or a time (a torn line) are left out."""
    from pyspark.sql import functions as F

    raw = spark.read.schema(_READ).option("mode", "PERMISSIVE").json([str(p) for p in paths])
    step = F.lit(len(EVENTS))
    for event, index in _STEP.items():
        step = F.when(F.col("event") == event, index).otherwise(step)
    return raw.where(F.col("event").isNotNull() & F.col("time").isNotNull()).select(
        step.cast("byte").alias("step"),
        "time",
        "id",
        "destination",
        "deliver_at",
        "lateness_ms",
    )


def _is(events: Iterable[str]) -> Column:
    from pyspark.sql import functions as F

    return F.col("step").isin(*[_STEP[e] for e in events])


def report_tables(events: DataFrame, *, now_ms: int) -> dict[str, DataFrame]:
    """The report's tables from ``journal_events`` rows: ``hourly``, ``lateness`` and ``due``
    (pending messages counted per minute of falling due, see ``forecasts``), and ``counted``,
    the small frame ``hourly`` and ``lateness`` both come from (persist it while writing them).
    ``outcomes`` is summed from ``hourly``. The events are read twice (keep them cached): once
    counted by destination, hour, event and release lateness, once for each message's latest
    event."""
    from pyspark.sql import functions as F

    hour = (F.col("time") - F.col("time") % HOUR_MS).alias("hour_ms")
    release_lateness = F.when(_is(_RELEASES), F.col("lateness_ms")).alias("lateness_ms")
    # One grouping of all the events: tens of thousands of rows for ten million events, as
    # latenesses are whole milliseconds. Counts per kind and percentiles are summed from it.
    counted = events.groupBy("destination", hour, "step", release_lateness).agg(
        F.count(F.lit(1)).alias("n")
    )
    kinds = counted.groupBy("destination", "hour_ms").agg(
        *[
            F.coalesce(F.sum(F.when(F.col("step") == _STEP[e], F.col("n"))), F.lit(0)).alias(e)
            for e in EVENTS
        ]
    )
    releases = counted.where(F.col("lateness_ms").isNotNull())
    per_destination = _percentiles(
        releases.groupBy("destination", "hour_ms", "lateness_ms").agg(F.sum("n").alias("n")),
        ["destination", "hour_ms"],
    )
    same_group = kinds["destination"].eqNullSafe(per_destination["destination"]) & (
        kinds["hour_ms"] == per_destination["hour_ms"]
    )
    hourly = kinds.join(per_destination, same_group, "left").select(
        kinds["*"],
        *[per_destination[f"lateness_{name}_ms"] for name, _ in _QUANTILES],
        per_destination["lateness_max_ms"],
        F.coalesce(per_destination["releases"], F.lit(0)).alias("releases"),
    )
    ended = sum((F.col(e) for e in _ENDINGS[1:]), F.col(_ENDINGS[0]))
    hourly = (
        hourly.withColumn("ended", ended)
        .withColumn("expiry_rate", F.when(F.col("ended") > 0, F.col("expired") / F.col("ended")))
        .withColumn(
            "dead_letter_rate",
            F.when(F.col("ended") > 0, F.col("dead_lettered") / F.col("ended")),
        )
        .withColumn("cancellations", F.col("cancelled"))
    )
    lateness = _percentiles(
        releases.groupBy("hour_ms", "lateness_ms").agg(F.sum("n").alias("n")), ["hour_ms"]
    )
    # A message's latest event: the greatest (time, step in the lifecycle) — a scheduled and a
    # released line of a message sent without delay share one millisecond. The step stands for
    # the event, so ties order as they would by name; then the greater deliver_at.
    latest = (
        events.where(F.col("id").isNotNull())
        .groupBy("id")
        .agg(F.max(F.struct("time", "step", "deliver_at")).alias("last"))
        .where(F.col("last.step").isin(*[_STEP[e] for e in _PENDING]))
        .select(F.col("last.deliver_at").alias("due_ms"))
    )
    return {
        "counted": counted,
        "hourly": _sorted(hourly, "hour_ms", "destination"),
        "lateness": _sorted(lateness, "hour_ms"),
        "due": _due_counts(latest, now_ms=now_ms),
    }


def _sorted(small: DataFrame, *columns: str) -> DataFrame:
    """A small aggregate in one sorted partition. ``orderBy`` would first sample its input to
    split the range, which computes the aggregate (the percentile digests' merge) twice."""
    return small.repartition(1).sortWithinPartitions(*columns)


def _due_counts(pending: DataFrame, *, now_ms: int) -> DataFrame:
    """Pending messages (``due_ms``) counted by ``minute_ms`` of falling due within 30 days of
    ``now_ms`` (null beyond), ``in_day`` (due within 24 h) and ``overdue``: at most about 86,000
    rows whatever the journal's size, from which the forecasts and the totals are summed."""
    from pyspark.sql import functions as F

    due = F.col("due_ms")
    ahead = due >= now_ms
    return pending.groupBy(
        F.when(ahead & (due < now_ms + 30 * DAY_MS), due - due % MINUTE_MS).alias("minute_ms"),
        (ahead & (due < now_ms + DAY_MS)).alias("in_day"),
        (due < now_ms).alias("overdue"),
    ).agg(F.count(F.lit(1)).alias("due"))


def outcomes_of(hourly: DataFrame) -> DataFrame:
    """Events by kind over everything read, summed from ``hourly``."""
    from pyspark.sql import functions as F

    totals = hourly.agg(*[F.sum(e).alias(e) for e in EVENTS])
    pairs = F.explode(
        F.array(*[F.struct(F.lit(e).alias("event"), F.col(e).alias("count")) for e in EVENTS])
    )
    return (
        totals.select(pairs.alias("p"))
        .select("p.event", F.col("p.count").cast("long").alias("count"))
        .where(F.col("count") > 0)
        .orderBy(F.desc("count"), "event")
    )


def forecasts(due: DataFrame) -> dict[str, DataFrame]:
    """Pending messages due per minute over the next 24 h and per hour over the next 30 days,
    summed from ``report_tables``' ``due`` (an hour is 60 whole minutes of the epoch)."""
    from pyspark.sql import functions as F

    def per(name: str, rows: DataFrame, bucket: Column) -> DataFrame:
        return (
            rows.groupBy(bucket.alias(name))
            .agg(F.coalesce(F.sum("due"), F.lit(0)).cast("long").alias("due"))
            .orderBy(name)
        )

    minute = F.col("minute_ms")
    return {
        "forecast_minute": per("minute_ms", due.where(F.col("in_day")), minute),
        "forecast_hour": per("hour_ms", due.where(minute.isNotNull()), minute - minute % HOUR_MS),
    }


def _rows(frame: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict() for row in frame.collect()]


def run_report(
    spark: SparkSession,
    paths: Sequence[Path],
    out_dir: Path,
    *,
    now_ms: int,
    progress: SparkProgress | None = None,
) -> dict[str, Any]:
    """Read the journals, write every table as Parquet and ``report.html``; return a summary."""
    cores = default_parallelism(spark)
    settings = {**_READ_SETTINGS, "spark.sql.files.minPartitionNum": str(_TASKS_PER_CORE * cores)}
    with session_settings(spark, settings):
        return _run_report(spark, paths, out_dir, now_ms=now_ms, progress=progress)


def _run_report(
    spark: SparkSession,
    paths: Sequence[Path],
    out_dir: Path,
    *,
    now_ms: int,
    progress: SparkProgress | None,
) -> dict[str, Any]:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    show = progress or SparkProgress(spark, enabled=False)
    started = time.perf_counter()
    events = journal_events(spark, paths).persist(StorageLevel.MEMORY_AND_DISK)
    with show.phase("read"):
        events.count()  # parses every file once, into the cache
    tables = report_tables(events, now_ms=now_ms)
    counted = tables["counted"].persist(StorageLevel.MEMORY_AND_DISK)
    out_dir.mkdir(parents=True, exist_ok=True)

    def write(name: str, frame: DataFrame) -> DataFrame:
        with show.phase(name):
            frame.coalesce(1).write.mode("overwrite").parquet(str(out_dir / name))
        return spark.read.parquet(str(out_dir / name))  # small from here on

    hourly = write("hourly", tables["hourly"])
    lateness = write("lateness", tables["lateness"])
    counted.unpersist()
    due = tables["due"].persist(StorageLevel.MEMORY_AND_DISK)
    with show.phase("pending"):
        due.count()
    events.unpersist()
    outcomes = write("outcomes", outcomes_of(hourly))
    forecast = {name: write(name, frame) for name, frame in forecasts(due).items()}
    counts = due.agg(
        F.coalesce(F.sum("due"), F.lit(0)).alias("pending"),
        F.coalesce(F.sum(F.when(F.col("overdue"), F.col("due"))), F.lit(0)).alias("overdue"),
    ).first()
    due.unpersist()
    shape = hourly.agg(
        F.count_distinct("destination").alias("destinations"),
        F.count_distinct("hour_ms").alias("hours"),
    ).first()
    outcome_rows = _rows(outcomes)
    summary: dict[str, Any] = {
        "files": len(paths),
        "events": sum(r["count"] for r in outcome_rows),
        "destinations": int(shape["destinations"]) if shape else 0,
        "hours": int(shape["hours"]) if shape else 0,
        "pending": int(counts["pending"]) if counts else 0,
        "overdue": int(counts["overdue"]) if counts else 0,
        "now_ms": now_ms,
    }
    html = render_report(
        summary=summary,
        outcomes=outcome_rows,
        lateness=_rows(lateness.orderBy("hour_ms")),
        forecast_minute=_rows(forecast["forecast_minute"].orderBy("minute_ms")),
        forecast_hour=_rows(forecast["forecast_hour"].orderBy("hour_ms")),
        destinations=_rows(_by_destination(hourly)),
    )
    (out_dir / "report.html").write_text(html, encoding="utf-8")
    summary["seconds"] = round(time.perf_counter() - started, 3)
    summary["phases"] = dict(show.seconds)
    return summary


def _by_destination(hourly: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return (
        hourly.groupBy("destination")
        .agg(
            *[F.sum(e).alias(e) for e in ("scheduled", "released", "delivered", "acked")],
            *[F.sum(e).alias(e) for e in ("expired", "dead_lettered", "cancelled")],
            F.max("lateness_p99_ms").alias("worst_hour_p99_ms"),
            F.max("lateness_max_ms").alias("lateness_max_ms"),
        )
        .orderBy(F.desc("scheduled"))
        .limit(200)
    )
