"""What the pipeline's executors need, shipped with the job, and checked before the work starts.

A cluster's executors run a Python with numpy, pyarrow and pandas (what PySpark's Arrow
functions need) and without tarry. So the functions the import and the report hand to
``mapInArrow`` travel with their code: a zip of the ``tarry`` package and of the other modules
they import (``SHIPPED``, some of them compiled) is built from the driver's environment, added
to the session (``SparkContext.addPyFile``, or ``addArtifacts(pyfile=True)`` over Spark
Connect: the one way both kinds of session take), and unpacked on each executor into its
working directory by a small wrapper (``on_executors``) before the function is unpickled
(compiled modules cannot be imported from a zip). The wrapper imports nothing beyond the
standard library until then.

Before the work, one small job (``check_executors``) runs a task per core: it imports what the
work will import and looks for the paths the work will read and write, so a missing module, a
Python or platform the shipped code does not fit, or a local path an executor cannot see fails
at once with a message that names it, instead of as a task's traceback minutes later.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import os
import socket
import sys
import uuid
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import tarry
from tarry.errors import InvalidArgument, Unavailable
from tarry.pipeline.session import default_parallelism, is_connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "EXECUTOR_MODULES",
    "SHIPPED",
    "STOCK",
    "Bundle",
    "Executors",
    "build_bundle",
    "check_executors",
    "is_local_path",
    "local_path",
    "on_executors",
    "prepare_executors",
    "ship",
]

#: What a cluster's Python for PySpark has; never shipped (pyarrow and numpy are compiled for
#: the executors' platform, and Spark's own Arrow functions need them before ours run).
STOCK = ("numpy", "pyarrow", "pandas")
#: The modules the executor side imports beyond ``STOCK`` and tarry (found by running it on
#: executors with only ``STOCK``): the rules and records (orjson), the segment files'
#: checksums (google_crc32c), policy patterns in the queue rules (re2, google-re2), the online
#: sink's HTTP client (httpx and what it imports to post; its optional extras are left out).
SHIPPED = (
    "orjson",
    "google_crc32c",
    "re2",
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "idna",
    "certifi",
)
#: The modules whose functions run on executors: imported by the check first.
EXECUTOR_MODULES = (
    "tarry.pipeline.validation",
    "tarry.pipeline.screen",
    "tarry.pipeline.sink_log",
    "tarry.pipeline.sink_http",
)
_PREFIX = "tarry-executor-"

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Bundle:
    """The zip of the executors' code: its file and its name (which carries its content's hash,
    so executors of one session never mix two versions)."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name


def is_local_path(location: str | Path) -> bool:
    """A path of this machine's file system (a plain path or a ``file:`` URL), as opposed to a
    URL of a shared store (``s3a://``, ``gs://``, ``abfss://``, ``hdfs://``, ...)."""
    text = str(location)
    return "://" not in text or text.startswith("file:")


def local_path(location: str | Path) -> str | None:
    """The file system path of a local location (``file:`` taken off), None for a shared store's
    URL, which is handed to Spark untouched and never looked at here."""
    if not is_local_path(location):
        return None
    return str(location).removeprefix("file://").removeprefix("file:")


def _distribution_files(module: str) -> list[tuple[Path, str]]:
    """The installed files of the distribution that provides ``module`` (package, compiled
    parts and the libraries it bundles), as (file, name in the zip)."""
    names = importlib.metadata.packages_distributions().get(module)
    if not names:
        raise Unavailable(
            f"the pipeline ships {module} to the executors, but it is not installed here; "
            "reinstall with pip install 'tarry[spark]'"
        )
    found = []
    for name in names:
        dist = importlib.metadata.distribution(name)
        for entry in dist.files or ():
            parts = entry.parts
            if parts[0].endswith((".dist-info", ".egg-info")) or parts[0] in ("..", "bin"):
                continue
            if "__pycache__" in parts:
                continue
            found.append((Path(str(dist.locate_file(entry))), entry.as_posix()))
    return found


def _tarry_files() -> list[tuple[Path, str]]:
    root = Path(tarry.__file__).parent
    return [
        (path, f"tarry/{path.relative_to(root).as_posix()}")
        for path in sorted(root.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    ]


def build_bundle(work_dir: Path) -> Bundle:
    """The zip of tarry and ``SHIPPED`` under ``work_dir``, built once per content."""
    files = sorted(set(_tarry_files()).union(*(_distribution_files(m) for m in SHIPPED)))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for path, name in files:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    data = buffer.getvalue()
    path = work_dir / f"{_PREFIX}{hashlib.sha256(data).hexdigest()[:16]}.zip"
    if not path.exists():
        work_dir.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        partial.write_bytes(data)
        partial.replace(path)
    return Bundle(path)


def ship(spark: SparkSession, bundle: Bundle) -> None:
    """Add the bundle to the session: every task's Python then finds it on its ``sys.path``."""
    if is_connect(spark):
        spark.addArtifacts(str(bundle.path), pyfile=True)
    else:
        before = set(sys.path)
        spark.sparkContext.addPyFile(str(bundle.path))
        # addPyFile puts the zip on this process's path too, ahead of the installed tarry: a
        # compiled module found there first could not be loaded from it.
        sys.path[:] = [p for p in sys.path if p in before]


def on_executors(function: F, bundle: Bundle | None) -> F:
    """``function`` as it can run on an executor without tarry: pickled here, and unpickled
    there only once the bundle is unpacked on ``sys.path``. ``bundle`` None (a local session,
    whose tasks run this Python): ``function`` itself."""
    if bundle is None:
        return function
    from pyspark import cloudpickle

    payload: bytes = cloudpickle.dumps(function)  # type: ignore[no-untyped-call]
    name = bundle.name

    # Defined here, so it is pickled by value; it may import only the standard library.
    def unpacked(*args: Any) -> Any:
        import os
        import pickle
        import sys
        import tempfile
        import zipfile

        stem = name[: -len(".zip")]
        if not any(os.path.basename(p) == stem for p in sys.path):
            archive = next((p for p in sys.path if os.path.basename(p) == name), None)
            if archive is None:
                from pyspark import SparkFiles

                archive = SparkFiles.get(name)
            base = os.getcwd() if os.access(os.getcwd(), os.W_OK) else tempfile.gettempdir()
            target = os.path.join(base, stem)
            if not os.path.isdir(target):
                partial = f"{target}.{os.getpid()}.part"
                with zipfile.ZipFile(archive) as z:
                    z.extractall(partial)
                try:
                    os.rename(partial, target)
                except OSError:  # another worker of this executor was first
                    import shutil

                    shutil.rmtree(partial, ignore_errors=True)
            sys.path.insert(0, target)
            # a tarry imported from the zip itself (or another one) would shadow the unpacked
            for module in [m for m in sys.modules if m == "tarry" or m.startswith("tarry.")]:
                del sys.modules[module]
        return pickle.loads(payload)(*args)

    return unpacked  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class _Probe:
    """What a check task looks for: the modules to import, the paths to read (must exist) and
    the markers the driver left in the directories to write (a local path with the same name
    on another host is not the same directory)."""

    modules: tuple[str, ...]
    readable: tuple[str, ...]
    markers: tuple[str, ...]

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import importlib
        import platform

        import pyarrow as pa

        for _ in batches:
            pass
        missing_modules, broken = [], []
        for module in self.modules:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                missing_modules.append(exc.name or module)
            except ImportError as exc:  # present but not loadable here (platform, Python)
                broken.append(f"{module}: {exc}")
        unseen = [p for p in self.readable if not os.path.exists(p)]
        unseen += [os.path.dirname(m) for m in self.markers if not os.path.exists(m)]
        yield pa.RecordBatch.from_pydict(
            {
                "host": [socket.gethostname()],
                "python": [f"{platform.python_version()} {sys.executable}"],
                "modules": [sorted(set(missing_modules))],
                "broken": [broken],
                "unseen": [unseen],
            },
            schema=pa.schema(
                [
                    ("host", pa.string()),
                    ("python", pa.string()),
                    ("modules", pa.list_(pa.string())),
                    ("broken", pa.list_(pa.string())),
                    ("unseen", pa.list_(pa.string())),
                ]
            ),
        )


_PROBE_DDL = (
    "host string, python string, modules array<string>, broken array<string>, unseen array<string>"
)


def _root_cause(exc: BaseException) -> str:
    """The last line that names an error in a Spark failure (a Python worker's traceback ends
    with the exception that stopped it)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line or "Exception" in line]
    return (named or lines or [type(exc).__name__])[-1][:500]


def check_executors(
    spark: SparkSession,
    *,
    bundle: Bundle | None,
    cores: int,
    readable: Iterable[str | Path] = (),
    writable: Iterable[str | Path] = (),
) -> None:
    """Run one task per core that imports ``EXECUTOR_MODULES`` and looks for the local paths in
    ``readable`` (must exist) and ``writable`` (directories, created here if need be): raise
    ``Unavailable`` naming what the executors lack, or ``InvalidArgument`` naming a path they
    cannot see. URLs of shared stores are not looked at."""
    token = uuid.uuid4().hex[:12]
    markers = []
    for directory in (Path(p) for p in map(local_path, writable) if p is not None):
        directory.mkdir(parents=True, exist_ok=True)
        marker = directory / f".tarry-reach-{token}"
        marker.touch()
        markers.append(marker)
    probe = _Probe(
        modules=EXECUTOR_MODULES,
        readable=tuple(p for p in map(local_path, readable) if p is not None),
        markers=tuple(str(m) for m in markers),
    )
    try:
        rows = (
            spark.range(0, cores, 1, cores)
            .mapInArrow(on_executors(probe, bundle), _PROBE_DDL)
            .collect()
        )
    except Exception as exc:  # the executors could not even run the check
        raise Unavailable(
            "the Spark executors cannot run tarry's tasks: "
            f"{_root_cause(exc)}. They need Python {sys.version_info[0]}.{sys.version_info[1]} "
            f"(as this driver) with {', '.join(STOCK)}"
        ) from None
    finally:
        for marker in markers:
            marker.unlink(missing_ok=True)
    modules = sorted({m for r in rows for m in r["modules"]})
    broken = sorted({b for r in rows for b in r["broken"]})
    if modules or broken:
        hosts = sorted({r["host"] for r in rows if r["modules"] or r["broken"]})
        pythons = sorted({r["python"] for r in rows})
        what = ", ".join(modules + broken)
        raise Unavailable(
            f"the Spark executors on {', '.join(hosts)} (Python {', '.join(pythons)}) cannot "
            f"import {what}; install it there, or run them on the same Python version and "
            f"platform as this driver ({sys.version.split()[0]}, {sys.platform}) so the "
            "shipped copy loads"
        )
    unseen = sorted({u for r in rows for u in r["unseen"]})
    if unseen:
        hosts = sorted({r["host"] for r in rows if r["unseen"]})
        raise InvalidArgument(
            f"the Spark executors on {', '.join(hosts)} cannot see {', '.join(unseen)}, which "
            f"this side (on {socket.gethostname()}) has: a local path must be on a file system "
            "every executor mounts at the same place; use a shared mount, or an object-store "
            "URL (s3a://, gs://, abfss://) for the input, --rejects, --plan and --out"
        )


@dataclass(frozen=True, slots=True)
class Executors:
    """Where a session's tasks run: how many cores, and the bundle their functions need (None:
    this machine's Python, which has tarry: ``local[N]``)."""

    cores: int
    bundle: Bundle | None = None

    def function(self, function: F) -> F:
        """``function`` ready to be handed to ``mapInArrow`` (``on_executors``)."""
        return on_executors(function, self.bundle)


def prepare_executors(
    spark: SparkSession,
    *,
    local: bool,
    work_dir: Path,
    readable: Iterable[str | Path] = (),
    writable: Iterable[str | Path] = (),
) -> Executors:
    """The session's executors, ready for the work: on a cluster (or over Spark Connect) the
    bundle built, shipped and loaded, and the paths checked (``check_executors``)."""
    cores = default_parallelism(spark)
    if local:
        return Executors(cores)
    bundle = build_bundle(work_dir)
    ship(spark, bundle)
    check_executors(spark, bundle=bundle, cores=cores, readable=readable, writable=writable)
    return Executors(cores, bundle)
