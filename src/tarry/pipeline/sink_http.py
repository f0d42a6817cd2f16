"""The online sink (``--to URL``): executors post accepted rows to a running server's
``POST /v1/messages/batch``.

Map-only, like the offline sink: each task reads its own share of the input, screens it
(``screen.Screen``: the one pass of the rules; the rejects and the later repeats as reject rows,
the counts by verdict) and posts the rest. Nothing whole is
kept or shuffled. A task keeps ``in_flight`` posts going on one connection pool while it checks
the next rows, so its core and the server work at the same time, and the server's group commit
can share one fsync among them.

Idempotent through ``message_id`` (every row has one; rows without get a content hash), so a
retried batch, a re-run task or a rerun of the whole import stores nothing twice. Items the
server refuses with ``unavailable`` or ``destination_full`` are retried with exponential
back-off and jitter, a batch refused as ``overloaded`` after the ``Retry-After`` it
names; a batch that cannot reach the server at all is retried as a whole.
Whatever still fails after the last attempt comes back as a row with its error code, for the
rejects dataset.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from tarry.client._base import auth_headers, raise_for_error, unreachable
from tarry.dispatch.backoff import compute_backoff_ms
from tarry.errors import InvalidArgument, Overloaded, TarryError, Unavailable
from tarry.pipeline.dedupe import Repeats
from tarry.pipeline.screen import VERDICTS, Screen, kind_rows, spark_ddl
from tarry.pipeline.sources import ROW
from tarry.pipeline.validation import ImportRules

__all__ = ["COUNT", "REFUSED", "SENT_DDL", "SPAN", "SinkSettings", "sender"]

#: Per-send refusals worth another try (``overloaded``: the send's queue was behind).
RETRYABLE = frozenset({"unavailable", "destination_full", "overloaded"})
#: Outcomes of a sent row: the server stored it, or it already held that message_id.
CREATED, ALREADY_THERE = "created", "already_there"

#: What the sender yields, one row each: a ``COUNT`` of one post's rows with one outcome
#: (``code``: created or already_there; ``rows``; ``copies`` after fan-out), a ``SPAN``
#: (``partition``: a time partition an imported row falls into), a ``REFUSED`` row (the server
#: refused it after the last attempt: a reject, row, code, message, destination, message_id,
#: record, with ``rows`` = 1), and the screen's rows (``screen``: ``REJECT`` and
#: ``DUPLICATE_ROW`` with the reject fields, ``VERDICTS`` with the count in ``rows``).
COUNT, SPAN, REFUSED = "count", "span", "refused"
SENT_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("code", pa.string()),
        ("rows", pa.int64()),
        ("copies", pa.int64()),
        ("partition", pa.int64()),
        (ROW, pa.int64()),
        ("message", pa.string()),
        ("destination", pa.string()),
        ("message_id", pa.string()),
        ("record", pa.string()),
    ]
)
SENT_DDL = spark_ddl(SENT_SCHEMA)


@dataclass(frozen=True, slots=True)
class SinkSettings:
    url: str
    token: str | None = None
    #: Messages per POST (the server takes at most ``server.max_batch``, 10,000 by default; a
    #: post it refuses for its size alone is sent again in parts of its ``max_batch``).
    batch_size: int = 5_000
    #: Posts a task keeps going while it checks the next rows.
    in_flight: int = 2
    #: Attempts per item before it is given up as a reject.
    max_attempts: int = 8
    backoff_base_ms: int = 200
    backoff_max_ms: int = 10_000
    timeout_s: float = 60.0


Post = Callable[[pa.Array], list[dict[str, Any]]]


def _poster(settings: SinkSettings, http: httpx.Client) -> Post:
    #: Records per request: the server's ``max_batch`` once it refused a larger post for it.
    limit = settings.batch_size

    def post(records: pa.Array) -> list[dict[str, Any]]:
        nonlocal limit
        while True:
            size = max(1, min(limit, len(records)))
            try:
                results: list[dict[str, Any]] = []
                for start in range(0, len(records), size):
                    results += post_once(records.slice(start, size))
                return results
            except InvalidArgument as exc:
                max_batch = exc.details.get("max_batch")
                if not isinstance(max_batch, int) or not 0 < max_batch < size:
                    raise
                limit = max_batch  # refused for its size alone: sent again in parts that fit

    def post_once(records: pa.Array) -> list[dict[str, Any]]:
        # the records joined column-wise: no Python object per row on the way out
        rows = pa.ListArray.from_arrays(pa.array([0, len(records)], pa.int32()), records)
        body = b'{"messages":[' + pc.binary_join(rows, ",")[0].as_py().encode() + b"]}"
        try:
            response = http.post(
                "/v1/messages/batch", content=body, headers={"content-type": "application/json"}
            )
        except httpx.TransportError as exc:
            raise unreachable(settings.url, exc) from exc
        raise_for_error(response)
        results: list[dict[str, Any]] = orjson.loads(response.content)["results"]
        return results

    return post


def send_all(
    records: pa.Array, post: Post, settings: SinkSettings, sleep: Callable[[float], None]
) -> list[tuple[str, str | None]]:
    """Send ``records`` (one batch) until each is stored, known, or finally refused: one
    ``(outcome, message)`` per record, in order."""
    outcomes: list[tuple[str, str | None]] = [("unavailable", "not sent")] * len(records)
    pending = list(range(len(records)))
    for attempt in range(1, settings.max_attempts + 1):
        if attempt > 1:
            delay = compute_backoff_ms(
                attempt - 1,
                base_ms=settings.backoff_base_ms,
                max_ms=settings.backoff_max_ms,
                jitter=0.2,
                random_unit=random.random(),
            )
            sleep(delay / 1000)
        try:
            results = post(records if attempt == 1 else records.take(pa.array(pending)))
        except TarryError as exc:
            for i in pending:
                outcomes[i] = (exc.code, str(exc))
            if isinstance(exc, Overloaded):
                sleep(exc.retry_after_s)  # the server said when (Retry-After)
                continue
            if isinstance(exc, Unavailable):
                continue
            return outcomes  # refused as a whole (bad token, batch too large): no retry helps
        retry = []
        for i, result in zip(pending, results, strict=True):
            error = result.get("error")
            if error is None:
                outcomes[i] = (ALREADY_THERE if result.get("duplicate") else CREATED, None)
            else:
                outcomes[i] = (error.get("code", "unavailable"), error.get("message"))
                if outcomes[i][0] in RETRYABLE:
                    retry.append(i)
        pending = retry
        if not pending:
            break
    return outcomes


def _rows(kind: str, columns: dict[str, Any], n: int) -> pa.RecordBatch:
    return kind_rows(SENT_SCHEMA, kind, columns, n)


def _reported(
    chunk: pa.RecordBatch, outcomes: list[tuple[str, str | None]], spans: set[int]
) -> Iterator[pa.RecordBatch]:
    """One post's rows as ``SENT_SCHEMA`` rows: a ``COUNT`` per outcome, the refused rows one
    by one; the time partitions of its imported rows go into ``spans``."""
    codes = np.array([code for code, _ in outcomes], dtype=object)
    copies = pc.list_value_length(chunk.column("targets")).to_numpy(zero_copy_only=False)
    for outcome in (CREATED, ALREADY_THERE):
        mask = codes == outcome
        if mask.any():
            count = {"code": pa.array([outcome]), "rows": pa.array([int(mask.sum())])}
            yield _rows(COUNT, {**count, "copies": pa.array([int(copies[mask].sum())])}, 1)
    imported = (codes == CREATED) | (codes == ALREADY_THERE)
    spans.update(pc.unique(chunk.column("partition_ms").filter(pa.array(imported))).to_pylist())
    if not imported.all():
        refused = chunk.filter(pa.array(~imported))
        columns = {name: refused.column(name) for name in (ROW, "destination", "message_id")}
        columns["record"] = refused.column("record")
        columns["code"] = pa.array(codes[~imported].tolist(), pa.string())
        messages = [m for (_, m), ok in zip(outcomes, imported, strict=True) if not ok]
        columns["message"] = pa.array(messages, pa.string())
        columns["rows"] = pa.array(np.ones(refused.num_rows, np.int64))
        yield _rows(REFUSED, columns, refused.num_rows)


_SENT_COLUMNS = [ROW, "destination", "message_id", "record", "targets", "partition_ms"]


def sender(
    settings: SinkSettings, rules: ImportRules, repeats: Callable[[], Repeats]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function for ``mapInArrow`` over the input rows (``_row`` plus send-field columns):
    posts the accepted first rows of each key (see the module docstring) and yields
    ``SENT_SCHEMA`` rows. ``repeats`` gives the later rows of repeated keys (a broadcast
    variable's value)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        screen = Screen(rules, repeats(), every_record=True)
        spans: set[int] = set()
        waiting: deque[tuple[Future[list[tuple[str, str | None]]], pa.RecordBatch]] = deque()
        with (
            httpx.Client(
                base_url=settings.url.rstrip("/"),
                headers=auth_headers(settings.token),
                timeout=settings.timeout_s,
                limits=httpx.Limits(max_connections=settings.in_flight),
            ) as http,
            ThreadPoolExecutor(settings.in_flight, thread_name_prefix="tarry-sink") as pool,
        ):
            post = _poster(settings, http)
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                rejects, checked = screen.batch(batch)
                for kind, columns, n in rejects:
                    yield _rows(kind, columns, n)
                kept = checked.select(_SENT_COLUMNS)
                for start in range(0, kept.num_rows, settings.batch_size):
                    chunk = kept.slice(start, settings.batch_size)
                    work = pool.submit(send_all, chunk.column("record"), post, settings, time.sleep)
                    waiting.append((work, chunk))
                    while len(waiting) > settings.in_flight or (waiting and waiting[0][0].done()):
                        done, sent = waiting.popleft()
                        yield from _reported(sent, done.result(), spans)
            while waiting:
                done, sent = waiting.popleft()
                yield from _reported(sent, done.result(), spans)
        if spans:
            yield _rows(SPAN, {"partition": pa.array(sorted(spans), pa.int64())}, len(spans))
        codes, counts = screen.verdicts()
        yield _rows(VERDICTS, {"code": codes, "rows": counts}, len(codes))

    return run
