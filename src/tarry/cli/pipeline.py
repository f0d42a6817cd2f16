"""``tarry pipeline``: bulk import of scheduled messages and delivery analytics, on Spark
(``pip install 'tarry[spark]'``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tarry.cli.context import client, parsed, reports_errors, usage_error
from tarry.cli.output import console, json_option, print_json, table
from tarry.config import StoreConfig
from tarry.errors import InvalidArgument
from tarry.model.time import SystemClock, parse_duration_ms, parse_instant_ms
from tarry.model.validate import DestinationView

if TYPE_CHECKING:
    from tarry.pipeline.executors import Executors
    from tarry.pipeline.progress import SparkProgress
    from tarry.pipeline.session import SparkSettings

_CLOCK = SystemClock()
_DEFAULT_MASTER = "local[*]"


def _spark_options(func: Any) -> Any:
    func = click.option(
        "--remote",
        metavar="sc://HOST:PORT",
        help="Run on a Spark Connect server instead of --master.",
    )(func)
    func = click.option(
        "--driver-memory", default="4g", show_default=True, help="Spark driver memory."
    )(func)
    func = click.option(
        "--executor-memory", help="Memory of each executor on a cluster (default: the cluster's)."
    )(func)
    func = click.option(
        "--shuffle-partitions", default=8, show_default=True, help="Partitions after a shuffle."
    )(func)
    return click.option(
        "--master",
        default=_DEFAULT_MASTER,
        show_default=True,
        help="Spark master: local[N] or a cluster URL (spark://, yarn, k8s://).",
    )(func)


def _settings(
    master: str,
    remote: str | None,
    driver_memory: str,
    executor_memory: str | None,
    shuffle_partitions: int,
) -> SparkSettings:
    from tarry.pipeline.session import SparkSettings

    if remote is not None:
        if not remote.startswith("sc://"):
            usage_error(InvalidArgument(f"--remote {remote!r} is not sc://HOST:PORT"))
        if master != _DEFAULT_MASTER:
            usage_error(InvalidArgument("give --master or --remote, not both"))
    return SparkSettings(
        master=master,
        remote=remote,
        driver_memory=driver_memory,
        executor_memory=executor_memory,
        shuffle_partitions=shuffle_partitions,
    )


def _executors(
    spark: Any,
    settings: SparkSettings,
    progress: SparkProgress,
    *,
    readable: Iterable[Path | str],
    writable: Iterable[Path | str],
) -> Executors:
    from tarry.pipeline.executors import prepare_executors
    from tarry.pipeline.session import work_dir

    with progress.phase("executors"):
        return prepare_executors(
            spark,
            local=settings.local,
            work_dir=work_dir(settings),
            readable=readable,
            writable=writable,
        )


def _location(value: str | None) -> Path | str | None:
    """A location option: a shared store's URL (``s3a://...``) as given; a local path made
    absolute (executors resolve a relative one in their own working directory)."""
    from tarry.pipeline.executors import local_path

    path = None if value is None else local_path(value)
    return value if path is None else Path(path).absolute()


@click.group()
def pipeline() -> None:
    """Bulk import and delivery analytics on Apache Spark."""


@pipeline.command("import")
@click.argument("input_path", metavar="INPUT")
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
    help="Also write the accepted copies as Parquet, partitioned by time, sorted by due time.",
)
@click.option(
    "--rejects",
    "rejects_dir",
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
    input_path: str,
    fmt: str | None,
    mapping: tuple[str, ...],
    to_url: str | None,
    into_dir: Path | None,
    plan_dir: str | None,
    rejects_dir: str | None,
    partition: str | None,
    batch_size: int,
    now: str | None,
    quiet: bool,
    master: str,
    driver_memory: str,
    executor_memory: str | None,
    shuffle_partitions: int,
    remote: str | None,
    as_json: bool,
) -> None:
    """Schedule every row of INPUT (Parquet, CSV or JSON lines; a path, or a URL such as
    s3a://bucket/dir), checked by the API's rules."""
    from tarry.pipeline.bulk_import import ImportOptions, run_import
    from tarry.pipeline.catalog import views_from_server, views_from_store
    from tarry.pipeline.progress import SparkProgress
    from tarry.pipeline.session import spark_session
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
    settings = _settings(master, remote, driver_memory, executor_memory, shuffle_partitions)
    if rejects_dir is None:
        stamp = datetime.fromtimestamp(now_ms / 1000, tz=UTC).strftime("%Y%m%dT%H%M%SZ")
        rejects_dir = f"tarry-rejects-{stamp}"
    source, rejects, plan = _location(input_path), _location(rejects_dir), _location(plan_dir)
    assert source is not None and rejects is not None
    if into_dir is not None:
        into_dir = into_dir.absolute()
    default_width = StoreConfig().granularity_ms if into_dir is not None else 3_600_000
    partition_ms = (
        parsed(parse_duration_ms, partition, field="--partition") if partition else default_width
    )
    options = ImportOptions(
        input=source,
        rejects_dir=rejects,
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
        plan_dir=plan,
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

    spark = spark_session(settings)
    progress = SparkProgress(spark, enabled=not quiet and not as_json)
    areas = [options.log_sink.area] if options.log_sink is not None else []
    executors = _executors(
        spark,
        settings,
        progress,
        readable=[source],
        writable=[p for p in (rejects, plan, *areas) if p is not None],
    )
    summary = run_import(
        spark,
        options,
        now_ms=now_ms,
        resolve_views=resolve,
        progress=progress,
        every_view=every,
        executors=executors,
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
    executor_memory: str | None,
    shuffle_partitions: int,
    remote: str | None,
    as_json: bool,
) -> None:
    """Delivery analytics from journals: Parquet tables and one offline HTML report."""
    from tarry.pipeline.analytics import journal_paths, run_report
    from tarry.pipeline.progress import SparkProgress
    from tarry.pipeline.session import spark_session

    settings = _settings(master, remote, driver_memory, executor_memory, shuffle_partitions)
    paths = [p.absolute() for p in parsed(journal_paths, data_dirs, journals)]
    out_dir = out_dir.absolute()
    now_ms = parsed(parse_instant_ms, now, field="--now") if now else _CLOCK.now_ms()
    spark = spark_session(settings)
    progress = SparkProgress(spark, enabled=not as_json)
    # The report runs no Python on the executors; the check still finds paths they cannot see.
    _executors(spark, settings, progress, readable=paths, writable=[out_dir])
    summary = run_report(spark, paths, out_dir, now_ms=now_ms, progress=progress)
    if as_json:
        print_json(summary)
    else:
        table("report", ["", ""], [(k, str(v)) for k, v in summary.items() if k != "phases"])
        console.print(f"open {out_dir / 'report.html'}")
