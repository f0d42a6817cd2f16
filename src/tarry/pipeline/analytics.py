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

Percentiles are Spark's ``percentile_approx`` with accuracy 10,000: exact (nearest rank: the
smallest value with at least p of the values at or below it) for groups of up to 10,000.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tarry.errors import InvalidArgument
from tarry.pipeline.progress import SparkProgress
from tarry.pipeline.report_html import render_report

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "EVENTS",
    "forecasts",
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
HOUR_MS, MINUTE_MS = 3_600_000, 60_000


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


def _percentiles(column: str) -> list[Any]:
    from pyspark.sql import functions as F

    values = F.percentile_approx(column, [0.5, 0.95, 0.99], 10_000)
    return [values[i].alias(f"lateness_{p}_ms") for i, p in enumerate(("p50", "p95", "p99"))] + [
        F.max(column).alias("lateness_max_ms"),
        F.count(column).alias("releases"),
    ]


def report_tables(events: DataFrame, *, now_ms: int) -> dict[str, DataFrame]:
    """The report's tables from journal events (``JOURNAL_DDL`` rows). ``outcomes`` is summed
    from ``hourly``, and the forecasts share one per-message state: the journal is scanned for
    ``hourly``, ``lateness`` and the state, nothing more."""
    from pyspark.sql import functions as F

    events = events.where(F.col("event").isNotNull() & F.col("time").isNotNull())
    with_release = events.withColumn("hour_ms", F.col("time") - F.col("time") % HOUR_MS).withColumn(
        "release_lateness_ms", F.when(F.col("event").isin(*_RELEASES), F.col("lateness_ms"))
    )
    hourly = with_release.groupBy("destination", "hour_ms").agg(
        *[F.count(F.when(F.col("event") == e, 1)).alias(e) for e in EVENTS],
        *_percentiles("release_lateness_ms"),
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
        .orderBy("hour_ms", "destination")
    )
    lateness = (
        with_release.where(F.col("release_lateness_ms").isNotNull())
        .groupBy("hour_ms")
        .agg(*_percentiles("release_lateness_ms"))
        .orderBy("hour_ms")
    )
    # A message's latest event: the greatest (time, step in the lifecycle) — a scheduled and a
    # released line of a message sent without delay share one millisecond.
    step = F.lit(len(EVENTS))
    for index, event in enumerate(_LIFECYCLE):
        step = F.when(F.col("event") == event, index).otherwise(step)
    latest = (
        events.where(F.col("id").isNotNull())
        .groupBy("id")
        .agg(
            F.max(F.struct(F.col("time"), step.alias("step"), "event", "deliver_at")).alias("last")
        )
        .where(F.col("last.event").isin(*_PENDING))
        .select(F.col("last.deliver_at").alias("due_ms"))
    )
    return {"hourly": hourly, "lateness": lateness, "pending": latest}


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


def forecasts(pending: DataFrame, *, now_ms: int) -> dict[str, DataFrame]:
    """Pending messages due per minute over 24 h and per hour over 30 days, from ``now_ms``."""
    from pyspark.sql import functions as F

    def due(width_ms: int, span_ms: int, name: str) -> DataFrame:
        return (
            pending.where((F.col("due_ms") >= now_ms) & (F.col("due_ms") < now_ms + span_ms))
            .withColumn(name, F.col("due_ms") - F.col("due_ms") % width_ms)
            .groupBy(name)
            .agg(F.count(F.lit(1)).alias("due"))
            .orderBy(name)
        )

    return {
        "forecast_minute": due(MINUTE_MS, 24 * HOUR_MS, "minute_ms"),
        "forecast_hour": due(HOUR_MS, 30 * 24 * HOUR_MS, "hour_ms"),
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
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    show = progress or SparkProgress(spark, enabled=False)
    started = time.perf_counter()
    events = (
        spark.read.schema(_READ)
        .option("mode", "PERMISSIVE")
        .json([str(p) for p in paths])
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    tables = report_tables(events, now_ms=now_ms)
    out_dir.mkdir(parents=True, exist_ok=True)

    def write(name: str, frame: DataFrame) -> DataFrame:
        with show.phase(name):
            frame.coalesce(1).write.mode("overwrite").parquet(str(out_dir / name))
        return spark.read.parquet(str(out_dir / name))  # small from here on

    hourly = write("hourly", tables["hourly"])
    lateness = write("lateness", tables["lateness"])
    pending = tables["pending"].persist(StorageLevel.MEMORY_AND_DISK)
    events.unpersist()
    outcomes = write("outcomes", outcomes_of(hourly))
    due = {name: write(name, frame) for name, frame in forecasts(pending, now_ms=now_ms).items()}
    counts = pending.agg(
        F.count(F.lit(1)).alias("pending"),
        F.count(F.when(F.col("due_ms") < now_ms, 1)).alias("overdue"),
    ).first()
    pending.unpersist()
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
        forecast_minute=_rows(due["forecast_minute"].orderBy("minute_ms")),
        forecast_hour=_rows(due["forecast_hour"].orderBy("hour_ms")),
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
