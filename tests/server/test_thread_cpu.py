"""``tarry_thread_cpu_seconds_total``: the server's CPU time by thread, read from ``/proc``."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from tarry.server.metrics import Metrics
from tarry.server.thread_cpu import OTHER, ThreadCPU, thread_cpu_seconds

linux = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")


def _spin(seconds: float, spun: threading.Event, done: threading.Event) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    spun.set()
    done.wait(30)  # alive until the test has read its figure


@linux
def test_a_busy_thread_is_counted_under_its_own_name() -> None:
    before = thread_cpu_seconds()
    spun, done = threading.Event(), threading.Event()
    worker = threading.Thread(target=_spin, args=(0.3, spun, done), name="tarry-test-spin")
    worker.start()
    try:
        assert spun.wait(30)
        during = thread_cpu_seconds()
    finally:
        done.set()
        worker.join()
    assert during["tarry-test-spin"] >= 0.25
    # The main thread only waited meanwhile: the spin is not charged to it.
    main = threading.main_thread().name
    assert during[main] - before[main] < 0.1
    after = thread_cpu_seconds()
    # An exited thread's time stays in the process: it moves to "other".
    assert "tarry-test-spin" not in after
    assert after[OTHER] - before[OTHER] >= 0.25


@linux
def test_the_parts_add_up_to_the_process() -> None:
    seconds = thread_cpu_seconds()
    process = time.process_time()
    assert sum(seconds.values()) == pytest.approx(process, abs=0.1)


def test_nothing_is_exported_without_proc(tmp_path: Path) -> None:
    assert thread_cpu_seconds(tmp_path) == {}
    assert list(ThreadCPU(proc=tmp_path).collect()) == []


@linux
def test_metrics_export_it_and_other_never_goes_back(tmp_path: Path) -> None:
    text = generate_latest(Metrics().registry).decode()
    main = threading.main_thread().name
    assert f'tarry_thread_cpu_seconds_total{{thread="{main}"}}' in text
    assert 'tarry_thread_cpu_seconds_total{thread="other"}' in text
    # A process whose total reads less than before (a thread read before the total ran on,
    # then counted under its own name): the counter stays where it was.
    proc = tmp_path / "proc"
    (proc / "task").mkdir(parents=True)
    collector = ThreadCPU(proc=proc)
    stat = "1 (py thon) S " + " ".join(["0"] * 10)
    for total, expected in ((500, 5.0), (300, 5.0), (900, 9.0)):
        (proc / "stat").write_text(f"{stat} {total} 0 0 0\n")
        (family,) = collector.collect()
        values = {s.labels["thread"]: s.value for s in family.samples}
        assert values[OTHER] == pytest.approx(expected * 100 / os.sysconf("SC_CLK_TCK"))
