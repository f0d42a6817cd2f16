"""The online sink: executors post accepted rows to a running server's ``POST /v1/messages/batch``.

Idempotent through ``message_id`` (every row has one; rows without get a content hash), so a
retried batch or a rerun of the whole import stores nothing twice. Items the server refuses with
``unavailable`` or ``destination_full`` are retried with exponential back-off and jitter; a batch
that cannot reach the server at all is retried as a whole. Whatever still fails after the last
attempt comes back as a row with its error code, for the rejects dataset.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pyarrow as pa

from tarry.client._base import auth_headers, raise_for_error, unreachable
from tarry.dispatch.backoff import compute_backoff_ms
from tarry.errors import TarryError, Unavailable

__all__ = ["SENT_DDL", "SinkSettings", "sender"]

RETRYABLE = frozenset({"unavailable", "destination_full"})
#: Outcomes of a sent row: the server stored it, or it already held that message_id.
CREATED, ALREADY_THERE = "created", "already_there"

SENT_SCHEMA = pa.schema(
    [
        ("_row", pa.int64()),
        ("destination", pa.string()),
        ("message_id", pa.string()),
        ("outcome", pa.string()),
        ("message", pa.string()),
        ("record", pa.string()),
    ]
)
SENT_DDL = (
    "_row long, destination string, message_id string, outcome string, message string, "
    "record string"
)


@dataclass(frozen=True, slots=True)
class SinkSettings:
    url: str
    token: str | None = None
    #: Messages per POST (the server takes at most ``server.max_batch``, 10,000 by default).
    batch_size: int = 1_000
    #: Attempts per item before it is given up as a reject.
    max_attempts: int = 8
    backoff_base_ms: int = 200
    backoff_max_ms: int = 10_000
    timeout_s: float = 60.0


Post = Callable[[list[bytes]], list[dict[str, Any]]]


def _poster(settings: SinkSettings, http: httpx.Client) -> Post:
    def post(records: list[bytes]) -> list[dict[str, Any]]:
        body = b'{"messages":[' + b",".join(records) + b"]}"
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
    records: list[bytes], post: Post, settings: SinkSettings, sleep: Callable[[float], None]
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
            results = post([records[i] for i in pending])
        except TarryError as exc:
            for i in pending:
                outcomes[i] = (exc.code, str(exc))
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


def sender(
    settings: SinkSettings,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function for ``mapInArrow`` over (``_row``, destination, message_id, record) rows:
    one row out per row in, with its outcome (``created``, ``already_there`` or an error code)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        with httpx.Client(
            base_url=settings.url.rstrip("/"),
            headers=auth_headers(settings.token),
            timeout=settings.timeout_s,
        ) as http:
            post = _poster(settings, http)
            for batch in batches:
                for start in range(0, batch.num_rows, settings.batch_size):
                    chunk = batch.slice(start, settings.batch_size)
                    records = [r.encode() for r in chunk.column("record").to_pylist()]
                    outcomes = send_all(records, post, settings, time.sleep)
                    yield pa.RecordBatch.from_pydict(
                        {
                            "_row": chunk.column("_row"),
                            "destination": chunk.column("destination"),
                            "message_id": chunk.column("message_id"),
                            "outcome": [o for o, _ in outcomes],
                            "message": [m for _, m in outcomes],
                            "record": chunk.column("record"),
                        },
                        schema=SENT_SCHEMA,
                    )

    return run
