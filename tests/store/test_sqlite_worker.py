"""The queue database's thread (``Worker``): jobs in order on one named thread, results and
errors handed back to the caller, and a job that fails does not end the thread."""

from __future__ import annotations

import threading

import pytest

from tarry.store.sqlite.worker import Worker


async def test_jobs_run_in_order_on_one_named_thread_and_hand_back_results() -> None:
    # Given a worker
    worker = Worker("tarry-db_0")
    seen: list[tuple[int, str]] = []

    def job(n: int) -> int:
        seen.append((n, threading.current_thread().name))
        return n * 10

    # When jobs are handed over, some without waiting
    for n in range(3):
        worker.put(lambda n=n: seen.append((n, threading.current_thread().name)))
    result = await worker.call(job, 3)
    worker.stop()
    # Then they ran in order on the worker's thread, and the call returned its result
    assert result == 30
    assert seen == [(n, "tarry-db_0") for n in range(4)]


async def test_an_error_reaches_the_caller_and_a_failing_job_does_not_end_the_thread() -> None:
    worker = Worker("tarry-db_0")

    def fails() -> None:
        raise ValueError("bad")

    worker.put(fails)  # nobody waits for it: logged, and the thread goes on
    with pytest.raises(ValueError, match="bad"):
        await worker.call(fails)
    assert await worker.call(lambda: "still here") == "still here"
    worker.stop()
