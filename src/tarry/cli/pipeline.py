"""``tarry pipeline``: bulk import of scheduled messages and delivery analytics, on Spark
(``pip install 'tarry[spark]'``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from tarry.cli.context import client, parsed, reports_errors, usage_error
from tarry.cli.output import console, json_option, print_json, table
from tarry.config import StoreConfig
from tarry.errors import InvalidArgument
from tarry.model.time import SystemClock, parse_duration_ms, parse_instant_ms
from tarry.model.validate import DestinationView

_CLOCK = SystemClock()


def _spark_options(func: Any) -> Any:
    func = click.option(
        "--driver-memory", default="4g", show_default=True, help="Spark driver memory."
    )(func)
    func = click.option(
        "--shuffle-partitions", default=8, show_default=True, help="Partitions after a shuffle."
    )(func)
    return click.option(
        "--master",
        default="local[*]",
        show_default=True,
        help="Spark master: local[N] or a cluster URL.",
    )(func)


def _session(master: str, driver_memory: str, shuffle_partitions: int) -> Any:
    from tarry.pipeline.session import SparkSettings, spark_session

    return spark_session(
        SparkSettings(
            master=master, driver_memory=driver_memory, shuffle_partitions=shuffle_partitions
        )
    )


@click.group()
def pipeline() -> None:
    """Bulk import and delivery analytics on Apache Spark."""


@pipeline.command("import")
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "csv", "json"]),
    help="Input format (default: from the file suffix; Parquet otherwise).",
)
@click.option(
    "--map",
    "mapping",
    multiple=True,
    help="field=column pairs, e.g. deliver_at=send_time,destination=channel (repeatable).",
)
@click.option("--to", "to_url", help="Online sink: a running server's URL.")
@click.option(
    "--into",
    "into_dir",
    type=click.Path(path_type=Path),
    help="Offline sink: a log-store data directory; adopted at the server's next start.",
)
@click.option(
    "--plan",
    "plan_dir",
    type=click.Path(path_type=Path),
    help="Also write the accepted copies as Parquet, partitioned by time, sorted by due time.",
)
@click.option(
    "--rejects",
    "rejects_dir",
    type=click.Path(path_type=Path),
    help="Where refused rows go (Parquet; default ./tarry-rejects-<time>).",
)
@click.option(
    "--partition",
    help="Time partition width (default 1h; with --into the store's granularity, 5m).",
)
@click.option(
    "--batch-size", default=5000, show_default=True, help="Messages per POST (server max 10,000)."
)
@click.option("--now", "now", help="The import's 'now' (RFC 3339 or epoch ms; default: now).")
@click.option("--quiet", is_flag=True, help="No progress bars.")
@_spark_options
@json_option
@click.pass_context
@reports_errors
def import_(
    ctx: click.Context,
    input_path: Path,
    fmt: str | None,
    mapping: tuple[str, ...],
    to_url: str | None,
    into_dir: Path | None,
    plan_dir: Path | None,
    rejects_dir: Path | None,
    partition: str | None,
    batch_size: int,
    now: str | None,
    quiet: bool,
    master: str,
    driver_memory: str,
    shuffle_partitions: int,
    as_json: bool,
) -> None:
    """Schedule every row of INPUT (Parquet, CSV or JSON lines), checked by the API's rules."""
    from tarry.pipeline.bulk_import import ImportOptions, run_import
    from tarry.pipeline.catalog import views_from_server, views_from_store
    from tarry.pipeline.progress import SparkProgress
    from tarry.pipeline.sink_http import SinkSettings
    from tarry.pipeline.sink_log import LogSinkSettings, import_area
    from tarry.pipeline.sources import parse_mapping

    if to_url is None and into_dir is None and plan_dir is None:
        usage_error(InvalidArgument("give --to URL, --into DATA_DIR (or --plan DIR)"))
    if to_url is not None and into_dir is not None:
        usage_error(InvalidArgument("give --to URL or --into DATA_DIR, not both"))
    obj = ctx.ensure_object(dict)
    if to_url is not None:
        obj["url"] = to_url
    now_ms = parsed(parse_instant_ms, now, field="--now") if now else _CLOCK.now_ms()
    if rejects_dir is None:
        stamp = datetime.fromtimestamp(now_ms / 1000, tz=UTC).strftime("%Y%m%dT%H%M%SZ")
        rejects_dir = Path(f"tarry-rejects-{stamp}")
    default_width = StoreConfig().granularity_ms if into_dir is not None else 3_600_000
    partition_ms = (
        parsed(parse_duration_ms, partition, field="--partition") if partition else default_width
    )
    options = ImportOptions(
        input=input_path,
        rejects_dir=rejects_dir,
        fmt=fmt,
        mapping=parsed(parse_mapping, mapping),
        sink=SinkSettings(url=to_url, token=obj.get("token"), batch_size=batch_size)
        if to_url
        else None,
        log_sink=LogSinkSettings(
            area=import_area(into_dir), granularity_ms=partition_ms, now_ms=now_ms
        )
        if into_dir is not None
        else None,
        plan_dir=plan_dir,
        partition_ms=partition_ms,
    )
    resolve: Callable[[list[str]], dict[str, DestinationView]]
    every: Callable[[], dict[str, DestinationView]] | None = None
    if into_dir is not None:
        data_dir = into_dir

        def resolve(names: list[str]) -> dict[str, DestinationView]:
            return views_from_store(data_dir, names, now_ms=now_ms)

        def every() -> dict[str, DestinationView]:
            return views_from_store(data_dir, None, now_ms=now_ms)

        resolve([])  # a data directory without a catalog fails here, before Spark starts
    else:
        server = client(ctx)
        server.health()  # fail fast (exit 3) when the server cannot be reached

        def resolve(names: list[str]) -> dict[str, DestinationView]:
            return views_from_server(server, names)

    spark = _session(master, driver_memory, shuffle_partitions)
    summary = run_import(
        spark,
        options,
        now_ms=now_ms,
        resolve_views=resolve,
        progress=SparkProgress(spark, enabled=not quiet and not as_json),
        every_view=every,
    )
    if as_json:
        print_json(summary.to_dict())
    else:
        table("import", ["", ""], summary.lines())


@pipeline.command("report")
@click.option(
    "--data",
    "data_dirs",
    multiple=True,
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    help="A server's data directory (its journal/); repeatable for several nodes.",
)
@click.option(
    "--journal",
    "journals",
    multiple=True,
    type=click.Path(path_type=Path, exists=True),
    help="A journal file or directory; repeatable.",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(path_type=Path),
    help="Where the Parquet tables and report.html go.",
)
@click.option("--now", "now", help="Forecast from this instant (default: now).")
@_spark_options
@json_option
@reports_errors
def report(
    data_dirs: tuple[Path, ...],
    journals: tuple[Path, ...],
    out_dir: Path,
    now: str | None,
    master: str,
    driver_memory: str,
    shuffle_partitions: int,
    as_json: bool,
) -> None:
    """Delivery analytics from journals: Parquet tables and one offline HTML report."""
    from tarry.pipeline.analytics import journal_paths, run_report
    from tarry.pipeline.progress import SparkProgress

    paths = parsed(journal_paths, data_dirs, journals)
    now_ms = parsed(parse_instant_ms, now, field="--now") if now else _CLOCK.now_ms()
    spark = _session(master, driver_memory, shuffle_partitions)
    summary = run_report(
        spark,
        paths,
        out_dir,
        now_ms=now_ms,
        progress=SparkProgress(spark, enabled=not as_json),
    )
    if as_json:
        print_json(summary)
    else:
        table("report", ["", ""], [(k, str(v)) for k, v in summary.items() if k != "phases"])
        console.print(f"open {out_dir / 'report.html'}")
