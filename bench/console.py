"""Issue 24: what one page view of the console costs the server with millions pending.

The store is filled in-process (``--pending`` messages due in order over ``--span-days`` from an
hour ahead, two destinations alternating, a correlation id each; durability off while filling,
then ``sync``), then a real ``tarry serve`` opens it and each view's API calls are timed from a
keep-alive client on loopback (so a figure is the server's time plus one local round trip):

- ``scheduled_first_page``: the scheduled view as it opens (``GET /v1/messages?state=scheduled
  &limit=50``);
- ``scheduled_next_pages``: paging on by cursor (``--pages`` pages);
- ``scheduled_jump``: a page from a due time half-way through the span (``due_after``);
- ``scheduled_destination``: the first page of one destination;
- ``scheduled_correlation``: the page of one correlation id (a message from the middle);
- ``overview_forecast``: ``GET /v1/stats/forecast``: its first answer, how long until every
  series is counted, and answers once counted;
  ``overview_calls_ms``: the overview's other calls, once each.

Goal (issue 24): a scheduled-view page ≤ 50 ms with 10,000,000 pending. Prints one JSON
document; progress on stderr. ``--pending 1000000`` for a small run."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from foundation import open_for_filling, start_server  # noqa: E402 - the sibling benchmark's helpers

from tarry.model.ids import IdGenerator  # noqa: E402
from tarry.model.message import Message  # noqa: E402
from tarry.model.time import SystemClock  # noqa: E402

DAY_MS = 86_400_000
BATCH = 5_000
PAGE = 50
DESTINATIONS = ("orders", "billing")


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def batches(count: int, span_ms: int, start_ms: int, now_ms: int) -> Any:
    ids = IdGenerator()
    step = max(1, span_ms // count)
    for first in range(0, count, BATCH):
        batch = []
        for i in range(first, min(count, first + BATCH)):
            due = start_ms + i * span_ms // count + (i * 7919) % step
            batch.append(
                Message(
                    id=ids.new_due(now_ms, due),
                    destination=DESTINATIONS[i % 2],
                    body=b'{"order": %d, "lines": [1, 2, 3]}' % i,
                    headers={"source": "bench"},
                    sent_at_ms=now_ms,
                    deliver_at_ms=due,
                    expires_at_ms=None,
                    correlation_id=f"c{i}",
                    updated_at_ms=now_ms,
                )
            )
        yield batch


async def fill(data_dir: Path, store: str, count: int, span_ms: int) -> dict[str, Any]:
    target = await open_for_filling(data_dir, store)
    now = SystemClock().now_ms()
    started = time.perf_counter()
    pending: list[asyncio.Future[Any]] = []
    done = 0
    for batch in batches(count, span_ms, now + 3_600_000, now):
        pending.append(asyncio.ensure_future(target.store(batch)))
        if len(pending) >= 4:
            await pending.pop(0)
        done += len(batch)
        if done % 1_000_000 == 0:
            note(f"  filled {done:,} ({done / (time.perf_counter() - started):,.0f}/s)")
    await asyncio.gather(*pending)
    seconds = time.perf_counter() - started
    await target.close()
    os.sync()
    return {"fill_s": round(seconds, 1), "fill_messages_per_s": round(count / seconds)}


def timed(http: httpx.Client, path: str, params: dict[str, Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    response = http.get(path, params=params)
    elapsed = (time.perf_counter() - started) * 1000
    response.raise_for_status()
    return elapsed, response.json()


def summary(times_ms: list[float]) -> dict[str, float]:
    ordered = sorted(times_ms)
    return {
        "median_ms": round(statistics.median(ordered), 2),
        "max_ms": round(ordered[-1], 2),
        "runs": len(ordered),
    }


def measure(url: str, *, pages: int, span_ms: int, count: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with httpx.Client(base_url=url, timeout=600) as http:
        view = {"state": "scheduled", "limit": PAGE}
        timed(http, "/healthz", {})
        firsts = [timed(http, "/v1/messages", view) for _ in range(5)]
        assert len(firsts[0][1]["items"]) == PAGE
        out["scheduled_first_page"] = summary([t for t, _ in firsts])
        cursor, times = firsts[0][1]["next_cursor"], []
        for _ in range(pages):
            elapsed, page = timed(http, "/v1/messages", {**view, "cursor": cursor})
            times.append(elapsed)
            cursor = page["next_cursor"]
        out["scheduled_next_pages"] = summary(times)
        middle = firsts[0][1]["items"][0]["deliver_at"] + span_ms // 2
        jumps = [timed(http, "/v1/messages", {**view, "due_after": middle}) for _ in range(5)]
        assert jumps[0][1]["items"][0]["deliver_at"] >= middle
        out["scheduled_jump"] = summary([t for t, _ in jumps])
        by_destination = [
            timed(http, "/v1/messages", {**view, "destination": "billing"}) for _ in range(5)
        ]
        assert {m["destination"] for m in by_destination[0][1]["items"]} == {"billing"}
        out["scheduled_destination"] = summary([t for t, _ in by_destination])
        # One correlation id from the middle: the log store reads a bounded stretch a page
        # and ends it early, so the user pages on until it is found.
        wanted, found, cursor, times = f"c{count // 2}", [], None, []
        while not found:
            params = {**view, "correlation_id": wanted, "cursor": cursor}
            elapsed, page = timed(http, "/v1/messages", params)
            times.append(elapsed)
            found, cursor = page["items"], page["next_cursor"]
            if cursor is None:
                break
        assert [m["correlation_id"] for m in found] == [wanted]
        out["scheduled_correlation"] = {
            **summary(times),
            "pages_until_found": len(times),
            "total_ms": round(sum(times), 1),
        }
        # The overview's other calls, once each (they count per queue, not per page).
        out["overview_calls_ms"] = {
            path: round(timed(http, path, {})[0], 2)
            for path in ("/v1/queues", "/v1/stats", "/v1/dead-letters", "/v1/stats/recent")
        }
        # The forecast: its first answer, then how long until every series is counted (a SQL
        # store counts in the background; the page shows "counting…" meanwhile).
        series = ("next_hour", "next_day", "next_30_days")
        first, forecast = timed(http, "/v1/stats/forecast", {})
        first_complete = all(forecast[name] is not None for name in series)
        asked = time.perf_counter()
        while any(forecast[name] is None for name in series):
            time.sleep(0.2)
            forecast = timed(http, "/v1/stats/forecast", {})[1]
        complete_s = time.perf_counter() - asked
        warm = [timed(http, "/v1/stats/forecast", {})[0] for _ in range(5)]
        out["overview_forecast"] = {
            "first_answer_ms": round(first, 2),
            "first_answer_complete": first_complete,
            "complete_after_s": round(complete_s, 2),
            "served": summary(warm),
            "counted_30_days": sum(forecast["next_30_days"]["counts"]),
        }
    return out


def run(store: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    data_dir = tmp / store
    span_ms = args.span_days * DAY_MS
    note(f"{store}: filling {args.pending:,} pending over {args.span_days} days")
    result = asyncio.run(fill(data_dir, store, args.pending, span_ms))
    proc, url = start_server(data_dir, store, env={**os.environ, "TARRY_JOURNAL__ENABLED": "false"})
    try:
        deadline = time.monotonic() + 600
        while httpx.get(url + "/healthz", timeout=60).json()["status"] != "ok":
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not become healthy")
            time.sleep(0.1)
        note(f"{store}: measuring")
        result.update(measure(url, pages=args.pages, span_ms=span_ms, count=args.pending))
    finally:
        proc.terminate()
        proc.wait(120)
        shutil.rmtree(data_dir, ignore_errors=True)
    page = result["scheduled_next_pages"]["median_ms"]
    result["goal_page_le_50_ms"] = {"value": page, "met": page <= 50}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pending", type=int, default=10_000_000)
    parser.add_argument("--span-days", type=int, default=30)
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--stores", default="log,sqlite")
    parser.add_argument("--tmp", default=None, help="where the stores are built (removed after)")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "pending": args.pending,
        "span_days": args.span_days,
        "page_size": PAGE,
        "load_average": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for store in args.stores.split(","):
            results[store] = run(store, args, Path(tmp))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
