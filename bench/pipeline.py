"""Pipeline benchmark (issue 6); prints JSON.

    .venv/bin/python bench/pipeline.py --rows 1000000            # while others work
    .venv/bin/python bench/pipeline.py --rows 10000000           # the full run

Input: ``--rows`` generated rows (Parquet; about 3 % invalid, 1 % duplicates, 20 queues and a
topic with 2 subscriptions, deliver_at or delay_ms, some ttl_ms), a real ``tarry serve`` for the
catalog. Measured, each Spark run in a fresh process (the JVM's start-up is reported apart):

1. import, offline sink (validate → dedupe → fan out → partition → sort → segment files in the
   log store's format, adopted at the next start) on local[1] and local[2]; target local[2]
   >= 150,000 rows/s and >= 1.7 x local[1]; then the server's restart that adopts them;
2. the same work single-process with pyarrow as the baseline (a child process too, so its
   memory is freed before the Spark runs): the same rules through the same
   code as the Spark executors (``tarry.pipeline.validation.checker``, i.e. the model's
   column-wise rules), then dedupe → fan out → partition → sort → Parquet out;
3. import, online sink on local[1] and local[2]: ``--online-rows`` rows over HTTP into a real
   ``tarry serve`` (a fresh one per run, so each run stores every row), with that server's CPU
   seconds beside the Spark tree's, and local[2] / local[1];
4. ``tarry pipeline report`` over ``--events`` journal events on local[2] (target <= 60 s at 10M);
5. ``cluster`` (issue 27): the offline import on local[2] and on a standalone cluster of 2 workers
   of 1 core (``scripts/spark-cluster``, loopback) whose executors run a bare Python (numpy,
   pyarrow, pandas: the code is shipped): rows/s, CPU seconds per million rows (driver, JVMs,
   Python workers, the cluster's daemons and executors), and the seconds the cluster path adds
   (start-up with executors, shipping and checking the code) over local[2]'s start-up.

``--only offline`` (or any of baseline, offline, online, report, cluster) runs only those parts;
the default is every part but ``cluster``. Each
Spark run also reports ``cpu_s``: the CPU seconds of its process tree (driver, JVM, Python
workers) during the import, per phase and per program, so runs on a shared machine compare.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

QUEUES = [f"bench.q{i:02d}" for i in range(20)]
TOPIC, SUBS = "bench.topic", ["bench.s1", "bench.s2"]
#: The import's now (whole minute); the online sink's server checks against its own clock.
NOW_MS = int(time.time()) // 60 * 60_000
#: Rows per Parquet row group (~25 MB): a lake's input comes in many row groups, and Spark
#: splits a file only between them (one 1M-row group read as one task, leaving a core idle).
CHUNK = 250_000
HERE = Path(__file__).resolve().parent


# --- data -----------------------------------------------------------------------------------------
def generate_input(path: Path, rows: int, seed: int = 7, spread_ms: int = 48 * 3_600_000) -> None:
    rng = np.random.default_rng(seed)
    schema = pa.schema(
        [
            ("message_id", pa.string()),
            ("destination", pa.string()),
            ("body", pa.string()),
            ("deliver_at", pa.timestamp("ms", tz="UTC")),
            ("delay_ms", pa.int64()),
            ("ttl_ms", pa.int64()),
        ]
    )
    names = np.array(QUEUES + [TOPIC, "bench.missing", "bad name!"], dtype=object)
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, CHUNK):
            n = min(CHUNK, rows - start)
            index = np.arange(start, start + n)
            ids = np.char.add("m", index.astype(str)).astype(object)
            dup = rng.random(n) < 0.01  # repeat an earlier id of the same chunk
            ids[dup] = ids[np.maximum(0, np.arange(n)[dup] - rng.integers(1, 1000, dup.sum()))]
            dest_index = rng.integers(0, 21, n)
            bad = rng.random(n)
            dest_index[bad < 0.005] = 21  # unknown destination
            dest_index[(bad >= 0.005) & (bad < 0.01)] = 22  # invalid name
            dest = names[dest_index]
            dest[dup] = names[np.where(np.isin(names[dest_index], names[:21]), dest_index, 0)][dup]
            at = rng.random(n) < 0.5
            spread = rng.integers(0, spread_ms, n)
            deliver_at = np.where(at, NOW_MS + spread, 0)
            delay = np.where(at, 0, spread)
            both = (bad >= 0.01) & (bad < 0.02)  # deliver_at and delay_ms: invalid_argument
            ttl = np.where(rng.random(n) < 0.3, spread + 60_000, -1)
            short_ttl = (bad >= 0.02) & (bad < 0.03)  # expiry_error
            ttl[short_ttl] = 1
            delay[short_ttl] = np.maximum(delay[short_ttl], 10_000)
            deliver_at[short_ttl] = 0
            body = np.char.add("reminder body with some words in it, number ", index.astype(str))
            table = pa.table(
                {
                    "message_id": pa.array(ids, pa.string()),
                    "destination": pa.array(dest, pa.string()),
                    "body": pa.array(body.astype(object), pa.string()),
                    "deliver_at": pa.array(
                        np.where((deliver_at > 0) | both, np.maximum(deliver_at, NOW_MS), 0),
                        pa.timestamp("ms", tz="UTC"),
                        mask=~((deliver_at > 0) | both),
                    ),
                    "delay_ms": pa.array(delay, pa.int64(), mask=(deliver_at > 0) & ~both),
                    "ttl_ms": pa.array(ttl, pa.int64(), mask=ttl < 0),
                },
                schema=schema,
            )
            writer.write_table(table)


def generate_journal(directory: Path, events: int, seed: int = 11) -> None:
    """About 2.2 events per message: scheduled, then released (+ received/acked), expired,
    cancelled or still pending, over 48 h before and 30 days after NOW_MS."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    per_file = 2_000_000
    written = 0
    part = 0
    while written < events:
        n_msgs = max(1, min(per_file, events - written) // 2)
        sent = NOW_MS - rng.integers(0, 48 * 3_600_000, n_msgs)
        due = sent + rng.integers(0, 50 * 3_600_000, n_msgs)
        late = rng.gamma(2.0, 8.0, n_msgs).astype(np.int64)
        dest = rng.integers(0, len(QUEUES), n_msgs)
        fate = rng.random(n_msgs)
        lines: list[bytes] = []
        for i in range(n_msgs):
            base = {
                "node": f"n{part % 2}",
                "id": f"j{part}-{i}",
                "destination": QUEUES[dest[i]],
                "topic": None,
                "queue": QUEUES[dest[i]],
                "message_id": None,
                "correlation_id": None,
                "sent_at": int(sent[i]),
                "deliver_at": int(due[i]),
                "expires_at": None,
                "size": 90,
                "failures": 0,
                "reason": None,
            }
            lines.append(
                orjson.dumps(
                    {**base, "event": "scheduled", "time": int(sent[i]), "lateness_ms": None}
                )
            )
            if due[i] > NOW_MS or fate[i] < 0.02:
                if fate[i] < 0.02:
                    lines.append(
                        orjson.dumps(
                            {
                                **base,
                                "event": "cancelled",
                                "time": int(sent[i]) + 5,
                                "lateness_ms": None,
                            }
                        )
                    )
                continue
            t = int(due[i] + late[i])
            kind = "expired" if fate[i] < 0.05 else "released"
            lines.append(
                orjson.dumps({**base, "event": kind, "time": t, "lateness_ms": int(late[i])})
            )
            if kind == "released" and fate[i] > 0.5:
                lines.append(
                    orjson.dumps({**base, "event": "acked", "time": t + 40, "lateness_ms": None})
                )
        (directory / f"journal-{part}-n{part % 2}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
        written += len(lines)
        part += 1


# --- the baseline ------------------------------------------------------------------------------
def baseline(input_path: Path, out: Path, views: Any) -> dict[str, Any]:
    """validate (the same rules) → dedupe → partition → sort → Parquet, one process, pyarrow."""
    from tarry.pipeline.validation import ImportRules, checker

    started = time.perf_counter()
    rules = ImportRules(now_ms=NOW_MS, views=tuple(views))
    run = checker(rules)
    offset = 0
    checked = []
    for batch in pq.ParquetFile(input_path).iter_batches(batch_size=10_000):
        ordinals = pa.array(np.arange(offset, offset + batch.num_rows), pa.int64())
        offset += batch.num_rows
        batch = batch.set_column(
            batch.schema.get_field_index("deliver_at"),
            "deliver_at",
            pc.cast(pc.cast(batch.column("deliver_at"), pa.timestamp("ms")), pa.int64()),
        )
        checked += list(
            run(
                iter(
                    [
                        pa.RecordBatch.from_arrays(
                            [ordinals, *batch.columns], names=["_row", *batch.schema.names]
                        )
                    ]
                )
            )
        )
    table = pa.Table.from_batches(checked)
    ok = table.filter(pc.is_null(table.column("code")))
    firsts = ok.group_by(["destination", "message_id"]).aggregate([("_row", "min")])
    kept = ok.filter(pc.is_in(ok.column("_row"), firsts.column("_row_min")))
    parents = pc.list_parent_indices(kept.column("targets"))
    flat = pa.table(
        {
            "queue": pc.list_flatten(kept.column("targets")),
            **{c: pc.take(kept.column(c), parents) for c in ("partition_ms", "deliver_at_ms")},
            "record": pc.take(kept.column("record"), parents),
        }
    ).sort_by([("partition_ms", "ascending"), ("deliver_at_ms", "ascending")])
    ds.write_dataset(
        flat,
        out,
        format="parquet",
        partitioning=ds.partitioning(pa.schema([("partition_ms", pa.int64())]), flavor="hive"),
        existing_data_behavior="delete_matching",
        max_rows_per_group=1 << 20,
    )
    seconds = time.perf_counter() - started
    return {
        "seconds": round(seconds, 2),
        "rows_per_s": round(table.num_rows / seconds),
        "accepted": kept.num_rows,
        "rejected": table.num_rows - ok.num_rows,
        "duplicates": ok.num_rows - kept.num_rows,
    }


# --- child processes (one JVM each) -----------------------------------------------------------
#: Processes whose trees count as the run's besides this one's: a cluster's daemons (their
#: children are the executors and their Python workers).
CLUSTER_PIDS: set[int] = set()


def tree_cpu_s(by_program: dict[str, float] | None = None) -> float:
    """CPU seconds used so far by this process and its descendants (the JVM, Python workers),
    and by ``CLUSTER_PIDS``' trees, from /proc: how many cores a run keeps busy, whatever
    ``local[n]`` says. ``by_program`` gets the same split by program (java, python), the
    driver's own Python apart."""
    parent_of: dict[int, int] = {}
    used: dict[int, int] = {}
    program: dict[int, str] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, tail = stat.read_text().rsplit(")", 1)
        except OSError:
            continue
        fields = tail.split()
        pid = int(stat.parent.name)
        parent_of[pid] = int(fields[1])
        used[pid] = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        program[pid] = head.split("(", 1)[1]
    mine = {os.getpid(), *CLUSTER_PIDS}
    grew = True
    while grew:
        more = {p for p, parent in parent_of.items() if parent in mine} - mine
        grew = bool(more)
        mine |= more
    tick = os.sysconf("SC_CLK_TCK")
    if by_program is not None:
        for pid in mine:
            name = "driver" if pid == os.getpid() else program.get(pid, "?")
            name = "python" if name.startswith("python") else name
            by_program[name] = by_program.get(name, 0.0) + used.get(pid, 0) / tick
    return sum(used.get(p, 0) for p in mine) / tick


def cpu_progress(spark: Any) -> Any:
    """A quiet ``SparkProgress`` that also notes each phase's CPU seconds (``tree_cpu_s``)."""
    from contextlib import contextmanager

    from tarry.pipeline.progress import SparkProgress

    class CpuProgress(SparkProgress):
        cpu: dict[str, float] = {}

        @contextmanager
        def phase(self, name: str) -> Any:
            before = tree_cpu_s()
            with super().phase(name):
                yield
            self.cpu[name] = round(self.cpu.get(name, 0.0) + tree_cpu_s() - before, 1)

    return CpuProgress(spark, enabled=False)


def child(args: argparse.Namespace) -> None:
    from tarry.client import Client
    from tarry.config import StoreConfig
    from tarry.pipeline.analytics import run_report
    from tarry.pipeline.bulk_import import ImportOptions, run_import
    from tarry.pipeline.catalog import views_from_server, views_from_store
    from tarry.pipeline.session import SparkSettings, spark_session
    from tarry.pipeline.sink_http import SinkSettings
    from tarry.pipeline.sink_log import LogSinkSettings, import_area

    if args.child == "baseline":
        # its own process: the baseline holds the whole checked table (about 13 GB at 10M
        # rows), freed when it exits, before any Spark child starts
        views = json.loads(Path(args.views).read_text())
        result = baseline(Path(args.input), Path(args.out), views)
        result["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        print(json.dumps(result))
        return
    from tarry.pipeline.executors import prepare_executors
    from tarry.pipeline.session import work_dir

    if args.cluster_state:
        CLUSTER_PIDS.update(json.loads(Path(args.cluster_state).read_text())["pids"])
    started = time.perf_counter()
    settings = SparkSettings(
        master=args.master,
        driver_memory=args.driver_memory,
        executor_memory=args.executor_memory,
        shuffle_partitions=args.shuffle,
        light_jvm=args.light_jvm,
    )
    spark = spark_session(settings)
    spark.range(10).count()  # on a cluster: waits for the executors
    startup = time.perf_counter() - started
    programs_before: dict[str, float] = {}
    cpu_before = tree_cpu_s(programs_before)
    out = Path(args.out)
    if args.child == "report":
        summary = run_report(spark, sorted(Path(args.input).glob("*.jsonl")), out, now_ms=args.now)
        cpu = tree_cpu_s() - cpu_before
        print(json.dumps({"startup_s": round(startup, 2), "cpu_s": round(cpu, 1), **summary}))
        return
    client = Client(args.url)
    granularity = StoreConfig().granularity_ms
    offline = args.child == "offline"
    data_dir = Path(args.data) if args.data else None
    options = ImportOptions(
        input=Path(args.input),
        rejects_dir=out / "rejects",
        plan_dir=out / "plan" if args.child == "plan" else None,
        sink=SinkSettings(url=args.url) if args.child == "online" else None,
        log_sink=LogSinkSettings(import_area(data_dir), granularity, args.now)
        if offline and data_dir
        else None,
        partition_ms=granularity if offline else 3_600_000,
    )
    progress = cpu_progress(spark)
    t = time.perf_counter()
    areas = [options.log_sink.area] if options.log_sink is not None else []
    executors = prepare_executors(
        spark,
        local=settings.local,
        work_dir=work_dir(settings),
        readable=[options.input],
        writable=[options.rejects_dir, *areas],
    )
    ship_s = time.perf_counter() - t
    summary = run_import(
        spark,
        options,
        progress=progress,
        now_ms=args.now,
        resolve_views=lambda names: (
            views_from_store(data_dir, names, now_ms=args.now)
            if offline and data_dir
            else views_from_server(client, names)
        ),
        every_view=(lambda: views_from_store(data_dir, None, now_ms=args.now))
        if offline and data_dir
        else None,
        executors=executors,
    )
    client.close()
    programs: dict[str, float] = {}
    cpu = tree_cpu_s(programs) - cpu_before
    by_program = {k: round(v - programs_before.get(k, 0.0), 1) for k, v in programs.items()}
    print(
        json.dumps(
            {
                "startup_s": round(startup, 2),
                "ship_and_check_s": round(ship_s, 2),
                "cpu_s": round(cpu, 1),
                "cpu_s_per_million_rows": round(cpu / summary.rows_read * 1e6, 1),
                "cores_busy": round(cpu / summary.seconds, 2),
                "cpu_phases": progress.cpu,
                "cpu_by_program": by_program,
                **summary.to_dict(),
            }
        )
    )


def run_child(
    kind: str,
    master: str,
    input_path: Path,
    out: Path,
    url: str,
    args: Any,
    *,
    env: dict[str, str] | None = None,
    cluster_state: Path | None = None,
) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--now",
        str(NOW_MS),
        "--child",
        kind,
        "--master",
        master,
        "--input",
        str(input_path),
        "--out",
        str(out),
        "--url",
        url,
        "--driver-memory",
        args.driver_memory,
        "--shuffle",
        str(args.shuffle),
        "--data",
        str(args.data_dir),
        *(["--light-jvm"] if args.light_jvm else []),
        *(["--views", str(args.views)] if kind == "baseline" else []),
        *(["--executor-memory", args.executor_memory] if cluster_state else []),
        *(["--cluster-state", str(cluster_state)] if cluster_state else []),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, env={**os.environ, **(env or {})}
    )
    if done.returncode != 0:
        raise SystemExit(f"{kind} on {master} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def declare(url: str) -> list[dict[str, Any]]:
    """The bench's queues, topic and subscriptions on the server at ``url``; their views."""
    from tarry.client import Client
    from tarry.pipeline.catalog import views_from_server, views_to_json

    with Client(url) as client:
        for name in QUEUES + SUBS:
            client.declare_queue(name)
        client.declare_topic(TOPIC)
        for sub in SUBS:
            client.subscribe(TOPIC, sub)
        return views_to_json(views_from_server(client, QUEUES + [TOPIC, "bench.missing"]))


def run_online(master: str, root: Path, args: Any) -> dict[str, Any]:
    """The online sink on ``master`` into a fresh ``tarry serve`` (its own data directory, so
    every run stores every row): the import's figures plus the server's CPU seconds."""
    name = f"online-{master[-2]}"
    shutil.rmtree(root / f"{name}-data", ignore_errors=True)  # a kept one holds every row
    server, url = start_server(root / f"{name}-data")
    try:
        declare(url)
        before = process_cpu_s(server.pid)
        run = run_child("online", master, root / "online.parquet", root / name, url, args)
        run["server_cpu_s"] = round(process_cpu_s(server.pid) - before, 1)
        run["load_average"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        server.terminate()
        server.wait(30)
    return run


def run_cluster(root: Path, url: str, args: Any, local: dict[str, Any] | None) -> dict[str, Any]:
    """The offline import on local[2] (unless given) and on a 2-worker standalone cluster with
    bare executors; their figures side by side."""
    script = HERE.parent / "scripts" / "spark-cluster"
    if local is None:
        local = run_child(
            "offline", "local[2]", root / "input.parquet", root / "offline-2", url, args
        )
        local["load_average"] = [round(x, 2) for x in os.getloadavg()]
    bare = subprocess.run(
        [sys.executable, str(script), "bare-python"], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    state = root / "cluster-state"
    memory = f"{int(args.executor_memory.rstrip('g')) + 1}g"
    subprocess.run(
        [sys.executable, str(script), "start", "--workers", "2", "--worker-memory", memory]
        + ["--state", str(state)],
        check=True,
        capture_output=True,
    )
    try:
        master = json.loads((state / "cluster.json").read_text())["master"]
        run = run_child(
            "offline",
            master,
            root / "input.parquet",
            root / "offline-cluster",
            url,
            args,
            env={"PYSPARK_PYTHON": bare},
            cluster_state=state / "cluster.json",
        )
        run["load_average"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        subprocess.run([sys.executable, str(script), "stop", "--state", str(state)], check=False)
    return {
        "offline_sink_local[2]": local,
        "offline_sink_cluster_2x1": run,
        "cluster_over_local2_rows_per_s": round(run["rows_per_s"] / local["rows_per_s"], 2),
        "cluster_adds_s": round(
            run["startup_s"]
            + run["ship_and_check_s"]
            - local["startup_s"]
            - local["ship_and_check_s"],
            1,
        ),
    }


def start_server(data: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tarry.cli.main", "serve", "--port", "0", "--data", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "TARRY_JOURNAL__ENABLED": "false", "TARRY_STORE__SYNCHRONOUS": "normal"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("tarry serving on "):
        raise SystemExit("tarry serve did not start")
    return proc, line.split()[-1].strip()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--online-rows", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=None, help="journal events (default --rows)")
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--shuffle", type=int, default=8)
    parser.add_argument(
        "--light-jvm", action="store_true", help="C1 JIT only and a serial GC (SparkSettings)"
    )
    parser.add_argument("--keep", help="keep the data in this directory (and reuse its input)")
    parser.add_argument(
        "--spread-hours",
        type=float,
        default=48,
        help="due times uniform over this many hours from now (8760: a year)",
    )
    parser.add_argument(
        "--only",
        default="baseline,offline,online,report",
        help="comma-separated parts to run: baseline, offline, online, report (the default), "
        "cluster",
    )
    parser.add_argument(
        "--executor-memory", default="3g", help="per executor of the cluster part (1 core each)"
    )
    parser.add_argument("--cluster-state", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--now", type=int, default=NOW_MS, help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--views", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    from tarry.client import Client

    root = Path(args.keep or tempfile.mkdtemp(prefix="tarry-bench-pipeline-"))
    root.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"rows": args.rows, "cpus": os.cpu_count()}
    parts = set(args.only.split(","))
    t = time.perf_counter()
    spread_ms = int(args.spread_hours * 3_600_000)
    result["spread_hours"] = args.spread_hours
    made_input = (
        root / "input.spread"
    )  # a kept input is reused when it has the same rows and spread
    if (
        not (root / "input.parquet").exists()
        or pq.ParquetFile(root / "input.parquet").metadata.num_rows != args.rows
        or not made_input.exists()
        or made_input.read_text() != str(spread_ms)
    ):
        generate_input(root / "input.parquet", args.rows, spread_ms=spread_ms)
        made_input.write_text(str(spread_ms))
    if "online" in parts:
        generate_input(
            root / "online.parquet", min(args.online_rows, args.rows), seed=8, spread_ms=spread_ms
        )
    events = args.events or args.rows
    made = root / "journal" / "events.txt"  # a kept journal is reused when it has as many events
    if "report" in parts and not (made.exists() and made.read_text() == str(events)):
        shutil.rmtree(root / "journal", ignore_errors=True)
        generate_journal(root / "journal", events)
        made.write_text(str(events))
    result["generate_s"] = round(time.perf_counter() - t, 1)
    args.data_dir = root / "data"
    server, url = start_server(root / "data")
    try:
        views = declare(url)
        if "baseline" in parts:
            args.views = root / "views.json"
            args.views.write_text(json.dumps(views))
            result["baseline_pyarrow"] = run_child(
                "baseline", "-", root / "input.parquet", root / "baseline", url, args
            )
        for master in ("local[1]", "local[2]") if "offline" in parts else ():
            run = run_child(
                "offline", master, root / "input.parquet", root / f"offline-{master[-2]}", url, args
            )
            run["rows_per_s_incl_startup"] = round(args.rows / (run["seconds"] + run["startup_s"]))
            run["load_average"] = [round(x, 2) for x in os.getloadavg()]
            result[f"offline_sink_{master}"] = run
        if "offline" in parts:
            one, two = result["offline_sink_local[1]"], result["offline_sink_local[2]"]
            result["speedup_local2_over_local1"] = round(two["rows_per_s"] / one["rows_per_s"], 2)
        if "offline" in parts and "baseline" in parts:
            result["local2_over_baseline"] = round(
                two["rows_per_s"] / result["baseline_pyarrow"]["rows_per_s"], 2
            )
        for master in ("local[1]", "local[2]") if "online" in parts else ():
            result[f"online_sink_{master}"] = run_online(master, root, args)
        if "online" in parts:
            one, two = result["online_sink_local[1]"], result["online_sink_local[2]"]
            result["online_local2_over_local1"] = round(two["rows_per_s"] / one["rows_per_s"], 2)
        if "cluster" in parts:
            result.update(run_cluster(root, url, args, result.get("offline_sink_local[2]")))
        if "report" in parts:
            result["report_local[2]"] = run_child(
                "report", "local[2]", root / "journal", root / "report", url, args
            )
    finally:
        server.terminate()
        server.wait(30)
    # The next start adopts both offline imports (the second only finds messages it holds).
    t = time.perf_counter()
    server, url = start_server(root / "data")
    result["restart_adopting_both_imports_s"] = round(time.perf_counter() - t, 2)
    result["partitions_after_adoption"] = len(
        {f.name.split(".")[0] for f in (root / "data" / "log" / "parts").glob("p*-*.seg-*.log")}
    )
    with Client(url) as client:
        result["scheduled_after_adoption"] = client.stats()["messages"]["scheduled"]
    server.terminate()
    server.wait(30)
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
