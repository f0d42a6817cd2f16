"""Issue 22: what the spread of due times costs each store, every case on a fresh `tarry serve`,
every store and source tree in the same minutes; prints JSON with the ratios.

    .venv/bin/python bench/spread.py --messages 20000                  # a small check
    .venv/bin/python bench/spread.py --baseline-src ../tarry-before     # the issue's scale
    .venv/bin/python bench/spread.py --only restart-pending --restart-pending 10000000 \\
        --baseline-src ../tarry-before

Parts (``--only`` runs one):
- ``spread``: ``POST /v1/messages/batch`` of 1,000 messages (100-byte bodies) from
  ``--clients`` threads (default 4, posting with ``--client``, default ``http.client``),
  ``--messages`` a case (default 100,000), due times uniform over 1–10 s (``near``), over a
  day and over a year. Per case: msg/s; the server's CPU µs per
  message (``/proc`` of its pid); its fsyncs per group commit, from ``tarry_store_fsyncs_total``
  and ``tarry_store_group_commits_total`` when ``/metrics`` has them (``*_metrics``); the sync
  calls (fsync, fdatasync, syncfs, sync) and write calls per batch by file, counted by
  ``strace`` on a second fresh server sent ``--strace-batches`` batches one at a time, so that
  a batch is a group commit (``strace``; null without strace); the restart after kill -9
  (spawn to ``tarry serving on``, to ``/healthz`` ok, and to the first due message received);
  and disk bytes / raw message bytes (raw = body + destination + id).
- ``restart-pending``: ``--restart-pending`` messages (default 1,000,000; the issue's goal is
  10,000,000) due over a year from an hour ahead, filled in-process in due order (as
  ``logstore.py --year-order due`` fills), then a ``tarry serve`` on them, kill -9, and a fresh
  one: ready to serve, the first due message received, RSS.

Source trees: this one's ``src`` and, with ``--baseline-src DIR`` (a checkout or ``git worktree``
of an older main, or its ``src``; or ``git archive COMMIT src | tar -x -C DIR`` with
``--baseline-commit COMMIT``), that one, each server on its tree's ``PYTHONPATH``.
``--stores`` (default log,sqlite) run on this tree, ``--baseline-stores`` (default log) on the
baseline. ``ratios``: day and year against near (rate, server CPU per message); log against
sqlite; this tree against the baseline.

A case lasts about a second, so one pair of runs says little: ``--repeat N`` (default 5) runs
the near and year cases of ``--repeat-stores`` (default log) N times each, on every tree, each
on a fresh server, alternating the order (near, year / year, near; and the trees likewise). The
year-to-near and this-to-baseline ratios are then the medians of the repetitions' pairs
(``pairs`` beside them; every run in ``runs``); the restart, disk and strace figures come from
the first repetition. ``--repeat 1`` is the single run of before. Before any of it, a near case
on each tree warms the machine up, not counted (``warm_up``; ``--no-warm-up``: none).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from foundation import (  # noqa: E402
    cpu_s,
    loop_sleep_cpu_us,
    open_for_filling,
    rss_mb,
    start_server,
)
from logstore import ratio, year_batches  # noqa: E402

QUEUE = "bench.spread"
PROBE = "bench.probe"
BATCH = 1000
BODY_BYTES = 100
DAY_MS = 86_400_000
#: Delay ranges (ms) of each case, uniform.
SPREADS = {
    "near": (1_000, 10_000),
    "day": (1_000, DAY_MS),
    "year": (1_000, 365 * DAY_MS),
}
#: The cases ``--repeat`` runs again (the issue's goal compares them).
REPEATED = ("near", "year")
RATE, CPU = "messages_per_s", "server_cpu_us_per_message"
JSON_HEADERS = {"content-type": "application/json"}
STORE_METRICS = ("tarry_store_fsyncs_total", "tarry_store_group_commits_total")
#: The producer path's fsyncs: the write-ahead log's (a checkpoint's are the others' labels).
WAL_FSYNCS = 'tarry_store_fsyncs_total{what="wal"}'
#: Group commits a producer waited for (the others carry release markers, which need no fsync).
DURABLE_GROUPS = "tarry_store_durable_group_commits_total"


@dataclass(frozen=True)
class Tree:
    """A source tree whose ``tarry serve`` is measured: ``name`` in the JSON, ``src`` on the
    server's ``PYTHONPATH``."""

    name: str
    src: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.src)}


def tree_src(path: Path) -> Path:
    """``path``'s source directory: ``path/src`` for a checkout, else ``path`` itself."""
    src = path / "src" if (path / "src" / "tarry").is_dir() else path
    if not (src / "tarry").is_dir():
        raise SystemExit(f"{path} holds no tarry package (looked in {path}/src and {path})")
    return src.resolve()


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --- load generator ---------------------------------------------------------------------------
def batch_bodies(batches: int, spread: tuple[int, int], rng: random.Random) -> list[bytes]:
    """``batches`` encoded batches of 1,000 messages to ``QUEUE``, 100-byte bodies, delays
    uniform over ``spread``: encoded before any clock starts (the producer's JSON work is not
    the server's)."""
    low, high = spread
    bodies = []
    for b in range(batches):
        items = [
            {
                "destination": QUEUE,
                "body": f"{b * BATCH + i:012d}".ljust(BODY_BYTES, "x"),
                "delay_ms": rng.randint(low, high),
            }
            for i in range(BATCH)
        ]
        bodies.append(orjson.dumps({"messages": items}))
    return bodies


#: How a client thread posts: ``stdlib`` (``http.client``, the default) or ``httpx``. The
#: clients share the server's two cores: four ``httpx`` threads took 2.7-4 µs of CPU a message
#: (their GIL contended), ``http.client`` threads about 0.4, so the faster a server is, the
#: more an ``httpx`` client held its rate down.
CLIENTS = ("stdlib", "httpx")


def send_all(
    url: str, bodies: list[bytes], clients: int, *, client: str = "stdlib"
) -> dict[str, Any]:
    """Post every batch of ``bodies`` from ``clients`` threads, a connection each (``client``:
    one of ``CLIENTS``); the answers' contents in ``answers``, with wall and this process's CPU
    seconds."""
    work: SimpleQueue[bytes] = SimpleQueue()
    for body in bodies:
        work.put(body)
    answers: list[bytes] = []

    def next_body() -> bytes | None:
        try:
            return work.get_nowait()
        except Empty:
            return None

    def with_httpx() -> None:
        with httpx.Client(base_url=url, timeout=120) as session:
            while (body := next_body()) is not None:
                response = session.post("/v1/messages/batch", content=body, headers=JSON_HEADERS)
                response.raise_for_status()
                answers.append(response.content)

    def with_stdlib() -> None:
        address = urlsplit(url)
        conn = http.client.HTTPConnection(address.hostname or "", address.port, timeout=120)
        try:
            while (body := next_body()) is not None:
                conn.request("POST", "/v1/messages/batch", body=body, headers=JSON_HEADERS)
                response = conn.getresponse()
                content = response.read()
                if response.status != 200:
                    raise RuntimeError(f"a batch was answered {response.status}: {content[:300]!r}")
                answers.append(content)
        finally:
            conn.close()

    post = {"stdlib": with_stdlib, "httpx": with_httpx}[client]
    started, cpu = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(clients) as pool:
        for done in [pool.submit(post) for _ in range(clients)]:
            done.result()  # a client's error is the run's
    return {
        "seconds": time.perf_counter() - started,
        "client_cpu_s": time.process_time() - cpu,
        "answers": answers,
    }


def raw_bytes(answers: list[bytes]) -> int:
    """Raw bytes of the messages ``answers`` accepted: body + destination + id, as
    ``logstore.py`` counts them."""
    return sum(
        BODY_BYTES + len(QUEUE) + len(result["id"])
        for answer in answers
        for result in orjson.loads(answer)["results"]
    )


# --- what the server shows ----------------------------------------------------------------------
def store_metrics(url: str) -> dict[str, float] | None:
    """The server's fsync and group-commit counters, or None when its ``/metrics`` has not
    both."""
    text = httpx.get(url + "/metrics", timeout=30).text
    found: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in STORE_METRICS:
            found[name] = found.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        if line.startswith((WAL_FSYNCS + " ", DURABLE_GROUPS + " ")):
            found[line.rsplit(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return found if all(name in found for name in STORE_METRICS) else None


def disk_bytes(data_dir: Path) -> dict[str, int]:
    """Allocated bytes of the store's files (everything but the event journal) and of the
    journal; ``store_inodes``: the store's files and directories (each an inode the case
    created, besides the few it deleted again)."""
    store = journal = inodes = 0
    for path in data_dir.rglob("*"):
        in_journal = "journal" in path.relative_to(data_dir).parts
        inodes += not in_journal
        if path.is_file():
            size = path.stat().st_blocks * 512
            if in_journal:
                journal += size
            else:
                store += size
    return {"store": store, "journal": journal, "store_inodes": inodes}


def file_class(data_dir: Path, path: str) -> str | None:
    """Which file a call was for: the log store, a SQLite database, the journal, another file;
    None for a socket or a pipe."""
    if not path.startswith("/"):
        return None
    relative = path[len(str(data_dir)) + 1 :] if path.startswith(str(data_dir)) else path
    if relative.startswith("log/wal/"):
        return "log_wal"
    if relative.startswith("log"):
        return "log_store"
    if relative.startswith(("queues.db", "tarry.db")):
        return relative.split(".db", 1)[0] + "_db"
    if relative.startswith("journal"):
        return "journal"
    return "other"


#: Calls that make writes durable (``syncfs`` and ``sync``: today's store makes a group that
#: touches many files durable with one ``syncfs``), and calls that write.
SYNC_CALLS = ("fsync", "fdatasync", "syncfs", "sync")
WRITE_CALLS = ("write", "pwrite64", "writev", "pwritev", "pwritev2")
STORE_FILES = ("log_wal", "log_store", "tarry_db")


def traced_calls(pid: int, data_dir: Path, send: Any) -> dict[str, int] | None:
    """Sync and write calls of every thread of ``pid`` to files while ``send()`` runs, as
    ``"call:file class"`` → count (``strace -y`` names each descriptor's file); None without
    strace."""
    if not _has_strace():
        return None
    calls = ",".join(SYNC_CALLS + WRITE_CALLS)
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        tracer = subprocess.Popen(
            ["strace", "-f", "-qq", "-y", "-e", f"trace={calls}", "-o", out.name]
            + ["-p", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attached to every thread before the first batch
        try:
            send()
        finally:
            tracer.send_signal(signal.SIGINT)
            tracer.wait(30)
        counts: dict[str, int] = {}
        for line in out.read().splitlines():
            # "PID call(FD</path>, ...) = N" or "PID call(FD</path> <unfinished ...>"; a
            # "<... call resumed>" half has no "(" and is counted by its first half.
            words = line.split(None, 1)
            if len(words) < 2 or "(" not in words[1]:
                continue
            call, args = words[1].split("(", 1)
            if call == "sync":
                key: str | None = "other"
            elif "<" in args:
                key = file_class(data_dir, args[args.index("<") + 1 : args.index(">")])
            else:
                key = None
            if key is not None:
                counts[f"{call}:{key}"] = counts.get(f"{call}:{key}", 0) + 1
        return counts


def _has_strace() -> bool:
    return subprocess.run(["which", "strace"], capture_output=True).returncode == 0


def wait_healthy(url: str, deadline_s: float = 120) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            response = httpx.get(url + "/healthz", timeout=5)
            if response.status_code == 200 and response.json()["status"] == "ok":
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.01)
    raise RuntimeError(f"{url} did not report ok within {deadline_s} s")


def kill_and_restart(
    proc: subprocess.Popen[str], url: str, data_dir: Path, store: str, tree: Tree
) -> tuple[subprocess.Popen[str], str, dict[str, Any]]:
    """Schedule a probe due in 1 s, kill -9 the server once it is accepted, wait until the
    probe is due, then spawn a fresh server on ``data_dir``: seconds from the spawn until it
    announced itself (``serving_s``), until ``/healthz`` said ok (``healthz_ok_s``) and until
    the probe was received (``first_due_received_s``), and its RSS then."""
    httpx.put(f"{url}/v1/queues/{PROBE}", json={}, timeout=30).raise_for_status()
    answer = httpx.post(
        url + "/v1/messages",
        json={"destination": PROBE, "body": "probe", "delay_ms": 1000},
        timeout=30,
    )
    answer.raise_for_status()
    due_ms = answer.json()["deliver_at"]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(max(0.0, due_ms / 1000 - time.time()) + 0.05)
    spawned = time.perf_counter()
    proc, url = start_server(data_dir, store, env=tree.env)
    serving = time.perf_counter() - spawned
    wait_healthy(url)
    healthy = time.perf_counter() - spawned
    got: list[Any] = []
    with httpx.Client(base_url=url, timeout=60) as http:
        while not got and time.perf_counter() - spawned < 120:
            response = http.post(f"/v1/queues/{PROBE}/receive", json={"max": 1, "wait_ms": 1000})
            response.raise_for_status()
            got = response.json()["messages"]
    received = time.perf_counter() - spawned
    return (
        proc,
        url,
        {
            "serving_s": round(serving, 3),
            "healthz_ok_s": round(healthy, 3),
            "first_due_received_s": round(received, 3) if got else None,
            "rss_mb": round(rss_mb(proc.pid), 1),
        },
    )


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        proc.wait(60)


# --- the spread part --------------------------------------------------------------------------
def case_dir(tree: Tree, store: str, spread_name: str, repetition: int) -> str:
    name = f"{tree.name}-{store}-{spread_name}"
    return f"{name}-r{repetition}" if repetition else name


def run_case(
    tmp: Path,
    tree: Tree,
    store: str,
    spread_name: str,
    *,
    messages: int,
    clients: int,
    client: str,
    strace_batches: int,
    restart: bool = True,
    repetition: int = 0,
) -> dict[str, Any]:
    """One case on a fresh server; with ``restart`` its restart after kill -9 and its disk
    once checkpointed too (a repetition leaves them out: they are timed once)."""
    rng = random.Random(22)
    spread = SPREADS[spread_name]
    bodies = batch_bodies(1 + messages // BATCH, spread, rng)
    warm_up = bodies.pop(0)
    data_dir = tmp / case_dir(tree, store, spread_name, repetition)
    started = time.perf_counter()
    proc, url = start_server(data_dir, store, env=tree.env)
    try:
        httpx.put(f"{url}/v1/queues/{QUEUE}", json={}, timeout=30).raise_for_status()
        # One batch before the clock: the first one pays one-time costs (imports, warm-up).
        first = httpx.post(
            url + "/v1/messages/batch", content=warm_up, headers=JSON_HEADERS, timeout=120
        )
        first.raise_for_status()
        counters = store_metrics(url)
        server_cpu = cpu_s(proc.pid)
        sent = send_all(url, bodies, clients, client=client)
        server_cpu = cpu_s(proc.pid) - server_cpu
        after = store_metrics(url)
        count = len(bodies) * BATCH
        raw = raw_bytes([first.content, *sent["answers"]])
        disk = disk_bytes(data_dir)
        result: dict[str, Any] = {
            "messages": count,
            "messages_per_s": round(count / sent["seconds"]),
            "server_cpu_us_per_message": round(server_cpu / count * 1e6, 1),
            # The clients' threads share one GIL: their CPU over the wall time, near 1.0,
            # would say one client process could not keep the server busy.
            "client_cpu_share_of_a_core": round(sent["client_cpu_s"] / sent["seconds"], 2),
            "fsyncs_per_group_commit_metrics": None,
            "raw_message_bytes": raw,
            "disk_bytes": disk["store"],
            "store_inodes": disk["store_inodes"],
            "journal_bytes": disk["journal"],
            "disk_to_raw": round(disk["store"] / raw, 3),
            "load_average": load(),
        }
        if counters is not None and after is not None:
            fsyncs = after[STORE_METRICS[0]] - counters[STORE_METRICS[0]]
            commits = after[STORE_METRICS[1]] - counters[STORE_METRICS[1]]
            result["fsyncs_per_group_commit_metrics"] = ratio(fsyncs, commits)
            if WAL_FSYNCS in after:  # the write-ahead log's alone (issue 22's design)
                wal = after[WAL_FSYNCS] - counters.get(WAL_FSYNCS, 0.0)
                result["wal_fsyncs_per_group_commit_metrics"] = ratio(wal, commits)
                if DURABLE_GROUPS in after:  # the producer's path alone
                    durable = after[DURABLE_GROUPS] - counters.get(DURABLE_GROUPS, 0.0)
                    result["wal_fsyncs_per_durable_group_commit_metrics"] = ratio(wal, durable)
            result["group_commits_per_batch_metrics"] = ratio(commits, len(bodies))
        if restart:
            proc, url, result["restart_after_kill"] = kill_and_restart(
                proc, url, data_dir, store, tree
            )
            result["disk_bytes_after_restart"] = disk_bytes(data_dir)["store"]
    finally:
        stop(proc)
    if restart:
        # A graceful stop ends with a checkpoint (the log store's WAL before it deleted): the
        # disk the goal means ("once checkpointed").
        result["disk_to_raw_checkpointed"] = round(disk_bytes(data_dir)["store"] / raw, 3)
    if strace_batches:
        result["strace"] = strace_case(tmp, tree, store, spread_name, strace_batches)
    result["case_wall_s"] = round(time.perf_counter() - started, 1)
    return result


def strace_case(
    tmp: Path, tree: Tree, store: str, spread_name: str, batches: int
) -> dict[str, Any] | None:
    """Sync and write calls per batch by file, on a fresh server sent ``batches`` batches one
    at a time (a batch is then a group commit) under ``strace``: the server runs slower traced,
    so this is not the timed run. Messages released meanwhile (the near case) add the queue
    database's calls and the store's release markers: ``released_meanwhile`` says how many."""
    if not _has_strace():
        return None
    data_dir = tmp / f"{tree.name}-{store}-{spread_name}-strace"
    bodies = batch_bodies(batches + 1, SPREADS[spread_name], random.Random(23))
    proc, url = start_server(data_dir, store, env=tree.env)
    try:
        httpx.put(f"{url}/v1/queues/{QUEUE}", json={}, timeout=30).raise_for_status()
        httpx.post(
            url + "/v1/messages/batch", content=bodies.pop(0), headers=JSON_HEADERS, timeout=120
        ).raise_for_status()
        counts = traced_calls(proc.pid, data_dir, lambda: send_all(url, bodies, 1))
        info = httpx.get(f"{url}/v1/queues/{QUEUE}", timeout=30).json()
    finally:
        stop(proc)
    if counts is None:
        return None

    def per_batch(calls: tuple[str, ...], files: tuple[str, ...] | None = None) -> float:
        total = sum(
            n
            for key, n in counts.items()
            if key.split(":")[0] in calls and (files is None or key.split(":")[1] in files)
        )
        return round(total / batches, 2)

    return {
        "batches": batches,
        "calls_by_file": counts,
        "store_syncs_per_batch": per_batch(SYNC_CALLS, STORE_FILES),
        "store_writes_per_batch": per_batch(WRITE_CALLS, STORE_FILES),
        "syncs_per_batch": per_batch(SYNC_CALLS),
        # The write-ahead log's calls alone, and the partitions' (written behind it).
        "wal_syncs_per_batch": per_batch(SYNC_CALLS, ("log_wal",)),
        "wal_writes_per_batch": per_batch(WRITE_CALLS, ("log_wal",)),
        "partition_writes_per_batch": per_batch(WRITE_CALLS, ("log_store",)),
        "released_meanwhile": info["ready"],
    }


def part_spread(
    tmp: Path,
    trees: list[tuple[Tree, list[str]]],
    *,
    messages: int,
    clients: int,
    client: str,
    strace_batches: int,
    repeat: int = 1,
    repeat_stores: tuple[str, ...] = ("log",),
    warm: bool = True,
    remove_between: bool = False,
) -> dict[str, Any]:
    """Every case once (``cases``), then the near and year cases of ``repeat_stores`` again
    until each has run ``repeat`` times, each on a fresh server (``runs``: every run's rate and
    CPU, the first included). A repetition alternates the order of the spreads and of the
    trees (near, year / year, near; this, baseline / baseline, this), so that neither the
    warmer machine nor the first place favours one side; a pair is one repetition's two runs."""
    cases: dict[str, dict[str, dict[str, Any]]] = {}
    runs: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}
    #: Runs that failed (a batch refused, e.g. ``overloaded`` on a busy machine): left out of
    #: ``cases``, ``runs`` and every ratio, and listed here; the others still run.
    failed: list[dict[str, Any]] = []

    def finished(path: Path) -> None:
        # A case's data stays on disk until the run ends: on ext4 without a journal, creating
        # a file skips every inode freed in the last seconds, so removing one case's ~330
        # partition files just before the next case made that case pay for the removal (the
        # year's many partitions most). --remove-between measures that pattern.
        if remove_between:
            _remove(path)

    def attempt(tree: Tree, store: str, spread_name: str, rep: int, **options: Any) -> Any:
        try:
            return run_case(tmp, tree, store, spread_name, repetition=rep, **options)
        except (RuntimeError, httpx.HTTPError) as exc:
            failed.append(
                {"tree": tree.name, "store": store, "spread": spread_name, "repetition": rep}
                | {"error": str(exc)[:300], "load_average": load()}
            )
            print(f"{tree.name} {store} {spread_name} #{rep} failed: {exc}", file=sys.stderr)
            return None

    def note(tree: Tree, store: str, spread_name: str, result: dict[str, Any], rep: int) -> None:
        runs.setdefault(tree.name, {}).setdefault(store, {}).setdefault(spread_name, []).append(
            {
                "repetition": rep,
                "messages_per_s": result["messages_per_s"],
                "server_cpu_us_per_message": result["server_cpu_us_per_message"],
                "load_average": result["load_average"],
            }
        )
        print(f"{tree.name} {store} {spread_name} #{rep}: {json.dumps(result)}", file=sys.stderr)

    # A warm-up case on each tree first, not counted: the first server of a run meets a cold
    # machine (in one run its near case ran at 40 % of the next ones' rate), which favoured
    # the year against it in the first pair.
    warm_up: dict[str, Any] = {}
    if warm:
        for tree, stores in trees:
            result = attempt(
                tree,
                stores[0],
                "near",
                -1,
                messages=messages,
                clients=clients,
                client=client,
                strace_batches=0,
                restart=False,
            )
            finished(tmp / case_dir(tree, stores[0], "near", -1))
            if result is not None:
                warm_up[tree.name] = {k: result[k] for k in (RATE, CPU, "load_average")}
    # Spread by spread, every tree and store one after the other: a ratio compares runs
    # taken in the same minutes.
    for spread_name in SPREADS:
        for tree, stores in trees:
            for store in stores:
                result = attempt(
                    tree,
                    store,
                    spread_name,
                    0,
                    messages=messages,
                    clients=clients,
                    client=client,
                    strace_batches=strace_batches,
                )
                if result is not None:
                    cases.setdefault(tree.name, {}).setdefault(store, {})[spread_name] = result
                    note(tree, store, spread_name, result, 0)
    for rep in range(1, repeat):
        spreads = REPEATED if rep % 2 == 0 else REPEATED[::-1]
        ordered = trees if rep % 2 == 0 else trees[::-1]
        for spread_name in spreads:
            for tree, stores in ordered:
                for store in stores:
                    if store not in repeat_stores:
                        continue
                    result = attempt(
                        tree,
                        store,
                        spread_name,
                        rep,
                        messages=messages,
                        clients=clients,
                        client=client,
                        strace_batches=0,
                        restart=False,
                    )
                    if result is not None:
                        note(tree, store, spread_name, result, rep)
                    finished(tmp / case_dir(tree, store, spread_name, rep))
    return {
        "messages_per_case": messages,
        "clients": clients,
        "client": client,
        "repeat": repeat,
        "remove_between": remove_between,
        "warm_up": warm_up,
        "cases": cases,
        "runs": runs,
        "failed": failed,
    }


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else float("nan")


def paired(runs: list[dict[str, Any]], against: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``runs`` ÷ ``against``, rate and server CPU a message, each repetition's pair (the two
    runs of one repetition), and the median of the pairs' ratios; None without a pair."""
    by_rep = {run["repetition"]: run for run in against}
    pairs = [
        {
            "repetition": run["repetition"],
            "messages_per_s": ratio(run[RATE], by_rep[run["repetition"]][RATE]),
            "server_cpu_us_per_message": ratio(run[CPU], by_rep[run["repetition"]][CPU]),
        }
        for run in runs
        if run["repetition"] in by_rep
    ]
    if not pairs:
        return None
    return {
        RATE: _median([p[RATE] for p in pairs]),
        CPU: _median([p[CPU] for p in pairs]),
        "pairs": pairs,
    }


def spread_ratios(
    cases: dict[str, dict[str, dict[str, Any]]],
    runs: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] | None = None,
) -> dict[str, Any]:
    """Day and year against near, log against sqlite, this tree against the baseline: rates
    and server CPU per message, each pair from the same run. With ``runs`` (``part_spread``),
    a ratio between cases that ran more than once is the median of its pairs' ratios, the pairs
    listed beside it; the medians of each side's runs in ``medians``."""
    restart = "first_due_received_s"
    runs = runs or {}
    out: dict[str, Any] = {}
    for tree, stores in runs.items():
        for store, repeated in stores.items():
            for far in ("day", "year"):
                # every run's pair (with one repetition, the first's: the single run)
                found = paired(repeated.get(far, []), repeated.get("near", []))
                if found is not None:
                    if len(found["pairs"]) == 1:
                        del found["pairs"]
                    out[f"{tree}.{store}.{far}_to_near"] = found
    for tree, stores in cases.items():
        if "log" in stores and "sqlite" in stores:
            for spread_name, log_case in stores["log"].items():
                sqlite_case = stores["sqlite"].get(spread_name)
                if sqlite_case is not None:
                    out[f"{tree}.log_to_sqlite.{spread_name}"] = {
                        RATE: ratio(log_case[RATE], sqlite_case[RATE]),
                        CPU: ratio(log_case[CPU], sqlite_case[CPU]),
                        "restart_first_due_received_s": ratio(
                            log_case["restart_after_kill"][restart] or 0,
                            sqlite_case["restart_after_kill"][restart] or 0,
                        ),
                    }
    if "this" in cases and "baseline" in cases:
        for store, by_spread in cases["this"].items():
            for spread_name, case in by_spread.items():
                base = cases["baseline"].get(store, {}).get(spread_name)
                if base is not None:
                    key = f"this_to_baseline.{store}.{spread_name}"
                    out[key] = {
                        RATE: ratio(case[RATE], base[RATE]),
                        CPU: ratio(case[CPU], base[CPU]),
                        "restart_first_due_received_s": ratio(
                            case["restart_after_kill"][restart] or 0,
                            base["restart_after_kill"][restart] or 0,
                        ),
                    }
                    ours = runs.get("this", {}).get(store, {}).get(spread_name, [])
                    theirs = runs.get("baseline", {}).get(store, {}).get(spread_name, [])
                    if len(ours) > 1 and len(theirs) > 1:
                        medians = paired(ours, theirs)
                        if medians is not None:
                            out[key].update(medians)
    medians: dict[str, Any] = {}
    for tree, stores in runs.items():
        for store, by_spread in stores.items():
            for spread_name, those in by_spread.items():
                if len(those) > 1:
                    medians[f"{tree}.{store}.{spread_name}"] = {
                        RATE: _median([r[RATE] for r in those]),
                        CPU: _median([r[CPU] for r in those]),
                        "runs": len(those),
                    }
    if medians:
        out["medians"] = medians
    return out


def goals(results: dict[str, Any]) -> dict[str, Any]:
    """Issue 22's goals that this run measured: each with its value, the goal and whether it
    was met (this tree's log store; the ratios from ``ratios``)."""
    checks: dict[str, tuple[Any, str, bool]] = {}
    spread = results.get("spread")
    if spread is not None:
        ratios = spread["ratios"]
        year_to_near = ratios.get("this.log.year_to_near")
        if year_to_near is not None:
            value = year_to_near["messages_per_s"]
            checks["year_to_near_rate"] = (value, ">= 0.9", value >= 0.9)
            value = year_to_near["server_cpu_us_per_message"]
            checks["year_to_near_server_cpu_per_message"] = (value, "<= 1.15", value <= 1.15)
        to_sqlite = ratios.get("this.log_to_sqlite.year")
        if to_sqlite is not None:
            value = to_sqlite["messages_per_s"]
            checks["year_rate_log_to_sqlite"] = (value, ">= 3", value >= 3)
        to_baseline = ratios.get("this_to_baseline.log.year")
        if to_baseline is not None:
            value = to_baseline["messages_per_s"]
            checks["year_rate_to_baseline"] = (value, ">= 5", value >= 5)
        for name, case in spread["cases"].get("this", {}).get("log", {}).items():
            traced = case.get("strace")
            if traced is not None:
                # One write and one fsync a group, as the issue asks. A ``syncfs`` counts as
                # one sync call here, though it flushes the whole file system (``calls_by_file``
                # tells them apart).
                value = traced["store_syncs_per_batch"]
                checks[f"{name}_store_syncs_per_group_commit"] = (value, "== 1", value == 1)
                value = traced["store_writes_per_batch"]
                checks[f"{name}_store_writes_per_group_commit"] = (value, "== 1", value == 1)
                for key in ("wal_syncs_per_batch", "wal_writes_per_batch"):
                    value = traced.get(key)
                    if value is not None:
                        checks[f"{name}_{key[:-10]}_per_group_commit"] = (value, "== 1", value == 1)
            # On the producer's path: a group carrying only release markers (the 1-10 s case's
            # messages fall due while a slow machine still sends) has no fsync to count.
            value = case.get("wal_fsyncs_per_durable_group_commit_metrics")
            if value is not None:
                key = f"{name}_wal_fsyncs_per_durable_group_commit_metrics"
                checks[key] = (value, "== 1", value == 1)
            elif (value := case["fsyncs_per_group_commit_metrics"]) is not None:
                checks[f"{name}_fsyncs_per_group_commit_metrics"] = (value, "== 1", value == 1)
            value = case.get("disk_to_raw_checkpointed", case["disk_to_raw"])
            checks[f"{name}_disk_to_raw"] = (value, "<= 1.5", value <= 1.5)
    pending = results.get("restart_pending", {}).get("this", {}).get("log")
    if pending is not None:
        restart = pending["restart_after_kill"]
        n = results["restart_pending"]["pending"]
        limit = 3.0 if n <= 10_000_000 else 10.0
        for key in ("healthz_ok_s", "first_due_received_s"):
            value = restart[key]
            checks[f"restart_{n}_pending_{key}"] = (
                value,
                f"<= {limit:g}",
                value is not None and value <= limit,
            )
        if n > 10_000_000:
            value = restart["rss_mb"]
            checks[f"restart_{n}_pending_rss_mb"] = (value, "<= 2048", value <= 2048)
        value = pending["disk_to_raw"]
        checks[f"restart_{n}_pending_disk_to_raw"] = (value, "<= 1.5", value <= 1.5)
    return {k: {"value": v, "goal": g, "met": m} for k, (v, g, m) in checks.items()}


# --- the restart-pending part -------------------------------------------------------------------
async def fill(data_dir: Path, store: str, count: int) -> dict[str, Any]:
    """``count`` messages due over a year from an hour ahead (none falls due while measured),
    in due order, stored in-process as ``tarry serve --store STORE --data DATA_DIR`` keeps
    them; durability off while filling, then ``sync``."""
    target = await open_for_filling(data_dir, store)
    started = time.perf_counter()
    in_flight: list[asyncio.Future[Any]] = []
    raw = 0
    for batch in year_batches(count, 365 * DAY_MS, "due", lead_ms=3_600_000):
        raw += sum(len(m.body) + len(m.destination) + len(m.id) for m in batch)
        in_flight.append(asyncio.ensure_future(target.store(batch)))
        if len(in_flight) >= 4:
            await in_flight.pop(0)
    await asyncio.gather(*in_flight)
    seconds = time.perf_counter() - started
    await target.close()
    os.sync()
    return {"fill_messages_per_s": round(count / seconds), "raw_message_bytes": raw}


def fill_in_child(tree: Tree, data_dir: Path, store: str, count: int) -> dict[str, Any]:
    """``fill`` on ``tree``'s code, in a process of its own."""
    command = [sys.executable, __file__, "--child-fill", str(data_dir), "--child-store", store]
    command += ["--restart-pending", str(count)]
    done = subprocess.run(command, capture_output=True, text=True, env=tree.env)
    if done.returncode != 0:
        raise RuntimeError(f"fill on {tree.name}/{store} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout))


def restart_pending(tmp: Path, tree: Tree, store: str, count: int) -> dict[str, Any]:
    data_dir = tmp / f"pending-{tree.name}-{store}"
    result = fill_in_child(tree, data_dir, store, count)
    spawned = time.perf_counter()
    proc, url = start_server(data_dir, store, env=tree.env)
    try:
        wait_healthy(url)
        result["first_start_healthz_ok_s"] = round(time.perf_counter() - spawned, 3)
        result["first_start_rss_mb"] = round(rss_mb(proc.pid), 1)
        proc, url, result["restart_after_kill"] = kill_and_restart(proc, url, data_dir, store, tree)
        stats = httpx.get(url + "/v1/stats", timeout=300).json()
        result["scheduled_after_restart"] = stats["messages"]["scheduled"]
    finally:
        stop(proc)
    disk = disk_bytes(data_dir)["store"]
    result.update(
        pending=count,
        disk_bytes=disk,
        disk_to_raw=round(disk / result["raw_message_bytes"], 3),
        load_average=load(),
    )
    return result


def part_restart_pending(
    tmp: Path, trees: list[tuple[Tree, list[str]]], count: int
) -> dict[str, Any]:
    out: dict[str, Any] = {"pending": count}
    for tree, stores in trees:
        for store in stores:
            result = restart_pending(tmp, tree, store, count)
            out.setdefault(tree.name, {})[store] = result
            print(f"pending {tree.name} {store}: {json.dumps(result)}", file=sys.stderr)
            # Each fill takes its disk; the next needs it more than this one's files.
            _remove(tmp / f"pending-{tree.name}-{store}")
    key = "restart_after_kill"
    first = "first_due_received_s"
    this = out.get("this", {})
    if "log" in this and "sqlite" in this:
        out["this.log_to_sqlite_first_due_received_s"] = ratio(
            this["log"][key][first] or 0, this["sqlite"][key][first] or 0
        )
    base = out.get("baseline", {})
    if "log" in this and "log" in base:
        out["this_to_baseline.log_first_due_received_s"] = ratio(
            this["log"][key][first] or 0, base["log"][key][first] or 0
        )
    return out


def _remove(path: Path) -> None:
    subprocess.run(["rm", "-rf", str(path)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=["spread", "restart-pending"])
    parser.add_argument("--messages", type=int, default=100_000, help="messages a case")
    parser.add_argument("--clients", type=int, default=4, help="client threads (default 4)")
    parser.add_argument(
        "--client", choices=CLIENTS, default="stdlib", help="how they post (default stdlib)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="runs of the near and year cases each (default 5), on fresh servers, alternating"
        " their order; the year-to-near ratios are the medians of the runs' pairs",
    )
    parser.add_argument(
        "--repeat-stores",
        type=lambda t: t.split(","),
        default=["log"],
        help="the stores repeated (default log; the others run once)",
    )
    parser.add_argument(
        "--no-warm-up",
        action="store_true",
        help="no uncounted near case on each tree before the measured ones",
    )
    parser.add_argument(
        "--strace-batches",
        type=int,
        default=20,
        help="batches sent one at a time under strace to count fsyncs (0: no strace pass)",
    )
    parser.add_argument(
        "--restart-pending",
        type=int,
        default=1_000_000,
        help="messages pending over a year in the restart-pending part (the goal: 10,000,000)",
    )
    parser.add_argument(
        "--stores", type=lambda t: t.split(","), default=["log", "sqlite"], help="this tree's"
    )
    parser.add_argument(
        "--baseline-src", type=Path, help="a second source tree (a checkout or its src)"
    )
    parser.add_argument(
        "--baseline-commit",
        help="the baseline's commit, for the JSON, when DIR is not a git checkout (git archive)",
    )
    parser.add_argument(
        "--baseline-stores", type=lambda t: t.split(","), default=["log"], help="the baseline's"
    )
    parser.add_argument("--tmp", type=Path, help="where the data directories go (default /tmp)")
    parser.add_argument(
        "--remove-between",
        action="store_true",
        help="remove each repeated case's data at once, not at the end of the run",
    )
    parser.add_argument("--child-fill", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_fill is not None:
        filled = asyncio.run(fill(args.child_fill, args.child_store, args.restart_pending))
        print(json.dumps(filled))
        return
    this = Tree("this", tree_src(Path(__file__).resolve().parent.parent))
    trees = [(this, args.stores)]
    if args.baseline_src is not None:
        trees.append((Tree("baseline", tree_src(args.baseline_src)), args.baseline_stores))
    commits = {tree.name: _commit(tree.src) for tree, _ in trees}
    if args.baseline_commit is not None:
        commits["baseline"] = args.baseline_commit
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "loop_sleep_cpu_us": loop_sleep_cpu_us(),
        "trees": {tree.name: str(tree.src) for tree, _ in trees},
        "commits": commits,
        "load_average_at_start": load(),
    }
    with tempfile.TemporaryDirectory(dir=args.tmp) as name:
        tmp = Path(name)
        if args.only in (None, "spread"):
            spread = part_spread(
                tmp,
                trees,
                messages=args.messages // BATCH * BATCH,
                clients=args.clients,
                client=args.client,
                strace_batches=args.strace_batches,
                repeat=args.repeat,
                repeat_stores=tuple(args.repeat_stores),
                warm=not args.no_warm_up,
                remove_between=args.remove_between,
            )
            spread["ratios"] = spread_ratios(spread["cases"], spread["runs"])
            results["spread"] = spread
        if args.only in (None, "restart-pending"):
            results["restart_pending"] = part_restart_pending(tmp, trees, args.restart_pending)
    results["goals"] = goals(results)
    results["load_average_at_end"] = load()
    print(json.dumps(results, indent=2))


def _commit(src: Path) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or None


if __name__ == "__main__":
    main()
