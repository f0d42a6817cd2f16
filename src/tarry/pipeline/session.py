"""Starting Spark for the pipeline: one tuned, quiet ``SparkSession`` per process.

What the settings are for (measured on these machines, see shared/reference/spark.md):

- Parquet timestamps are written as ``TIMESTAMP_MICROS`` in UTC (Spark's INT96 default reads back
  in pyarrow as naive nanoseconds).
- the Spark UI and progress bar are off; log4j prints errors only;
- on ``local[N]``, Python workers run this interpreter (``PYSPARK_PYTHON``) and the driver
  listens on loopback; on a cluster both are left to the user's environment (the executors'
  Python is theirs, and a driver on loopback cannot be reached from other hosts), and the code
  the executors run is shipped with the job (``executors``);
- ``spark.driver.memory`` must be set before the JVM starts, so it is a builder option here;
- over Spark Connect (``remote``) the driver is the Connect server: only session settings
  (SQL settings) can be given from here.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tarry.errors import Unavailable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "SparkSettings",
    "default_parallelism",
    "is_connect",
    "input_partitions",
    "session_settings",
    "spark_session",
    "stop_session",
    "work_dir",
]

_QUIET_LOG4J = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


@dataclass(frozen=True, slots=True)
class SparkSettings:
    """How to run Spark: ``local[*]`` by default, any cluster through ``master``."""

    master: str = "local[*]"
    #: A Spark Connect server, ``sc://HOST:PORT`` (instead of ``master``).
    remote: str | None = None
    #: Memory of the driver JVM (in local mode also the executors').
    driver_memory: str = "4g"
    #: Memory of each executor on a cluster (None: the cluster's ``spark.executor.memory``).
    executor_memory: str | None = None
    #: Partitions after a shuffle (de-duplication, the per-partition sort, the report's groups).
    shuffle_partitions: int = 8
    #: Fewer JIT tiers and a serial GC: less JVM CPU for short jobs and tests, where compiling
    #: each new query is much of the work; large imports run slower on C1's code.
    light_jvm: bool = False
    #: Rows per Arrow batch handed to the Python workers (``mapInArrow``): the rules and the
    #: record encoding pay a fixed cost per batch and per column call, so larger batches make
    #: them cheaper per row (Spark's default is 10,000).
    arrow_batch_rows: int = 50_000
    #: Where Spark may write scratch files (default: a temporary directory).
    work_dir: Path | None = None
    app_name: str = "tarry-pipeline"

    @property
    def local(self) -> bool:
        """Tasks run in this process's machine and Python (``local[N]``)."""
        return self.remote is None and self.master.startswith("local")


def _require_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise Unavailable(
            "the pipeline needs Apache Spark: install it with pip install 'tarry[spark]' "
            "(and Java 17 on the PATH)"
        ) from None


def work_dir(settings: SparkSettings) -> Path:
    """Where this side keeps Spark's scratch files (and the executors' bundle)."""
    work = settings.work_dir or Path(tempfile.gettempdir()) / f"tarry-spark-{os.getuid()}"
    work.mkdir(parents=True, exist_ok=True)
    return work


def _sql_settings(settings: SparkSettings) -> dict[str, str]:
    """The session settings, which a Connect session takes as well."""
    return {
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(settings.arrow_batch_rows),
        "spark.sql.adaptive.enabled": "true",
    }


def spark_session(settings: SparkSettings = SparkSettings()) -> SparkSession:
    """The process's SparkSession, created on first use with ``settings``."""
    _require_pyspark()
    from pyspark.sql import SparkSession

    if settings.remote is not None:
        return _connect_session(settings)
    if settings.local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    work = work_dir(settings)
    log4j = work / "log4j2-quiet.properties"
    if not log4j.exists():
        log4j.write_text(_QUIET_LOG4J)
    java_options = f"-Dlog4j.configurationFile=file:{log4j}"
    if settings.light_jvm:
        java_options += " -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    builder = (
        SparkSession.builder.master(settings.master)
        .appName(settings.app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.warehouse.dir", str(work / "warehouse"))
        .config("spark.local.dir", str(work / "local"))
        .config("spark.driver.memory", settings.driver_memory)
        .config("spark.driver.extraJavaOptions", java_options)
    )
    for key, value in _sql_settings(settings).items():
        builder = builder.config(key, value)
    if settings.executor_memory is not None:
        builder = builder.config("spark.executor.memory", settings.executor_memory)
    if settings.local:
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _connect_session(settings: SparkSettings) -> SparkSession:
    assert settings.remote is not None
    try:
        from pyspark.sql.connect.utils import check_dependencies

        check_dependencies()
    except ImportError as exc:
        raise Unavailable(
            f"--remote needs the Spark Connect client, which is missing here ({exc}); install "
            "it with pip install 'tarry[spark]'"
        ) from None
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(settings.remote)
    try:
        session = builder.getOrCreate()
        for key, value in _sql_settings(settings).items():
            session.conf.set(key, value)
    except Exception as exc:
        raise Unavailable(
            f"cannot reach the Spark Connect server {settings.remote}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    return session


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session (it has no SparkContext, RDDs or broadcast
    variables on this side)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def default_parallelism(spark: SparkSession) -> int:
    """The cores the session's tasks run on (Spark's default parallelism)."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    from pyspark.sql import functions as F

    # A range without a partition count is split into the default parallelism.
    tasks = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("task"))
    row = tasks.agg(F.max("task")).first()
    return int(row[0]) + 1 if row is not None else 1


def input_partitions(frame: DataFrame) -> int:
    """How many partitions (tasks) ``frame`` reads as."""
    if not is_connect(frame.sparkSession):
        return int(frame.rdd.getNumPartitions())
    from pyspark.sql import functions as F

    # Over Connect there is no RDD to ask; with no column read, the scan is cheap.
    row = frame.select(F.spark_partition_id().alias("task")).agg(F.max("task")).first()
    return int(row[0]) + 1 if row is not None and row[0] is not None else 1


def stop_session() -> None:
    """Stop the process's session, if one runs (the next ``spark_session`` starts afresh)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


@contextmanager
def session_settings(spark: SparkSession, values: Mapping[str, str]) -> Iterator[None]:
    """Session settings for the duration of a block, then the previous values again (a query is
    planned with the settings of the moment it runs or is ``persist``ed)."""
    before = {key: spark.conf.get(key, None) for key in values}
    for key, value in values.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, previous in before.items():
            if previous is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, previous)
