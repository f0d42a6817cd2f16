"""What the queue database holds, counted for operators: messages by state (``/v1/stats``), a
queue's ready and in-flight messages (``GET /v1/queues/{name}``), and a dead-letter queue's
messages grouped by their first death (the console's dead-letter view)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson

from tarry.queues.txn import QUEUED_STATES
from tarry.store.sql import SqlConnection

__all__ = ["by_state", "death_groups", "ready_and_in_flight", "with_never_died"]


def by_state(conn: SqlConnection) -> dict[str, int]:
    """Messages per state (of those the queue database holds)."""
    return {s: n for s, n in conn.execute("SELECT state, count(*) FROM messages GROUP BY state")}


def ready_and_in_flight(conn: SqlConnection, queue: str, now_ms: int) -> tuple[int, int]:
    """``queue``'s messages visible at ``now_ms`` (ready) and those hidden (in flight)."""
    ready = in_flight = 0
    for state in QUEUED_STATES:
        visible, hidden = conn.execute(
            "SELECT coalesce(sum(CASE WHEN visible_at_ms <= ? THEN 1 ELSE 0 END), 0), "
            "coalesce(sum(CASE WHEN visible_at_ms > ? THEN 1 ELSE 0 END), 0) "
            f"FROM messages WHERE queue = ? AND state = '{state}'",
            (now_ms, now_ms, queue),
        ).fetchone()
        ready, in_flight = ready + int(visible), in_flight + int(hidden)
    return ready, in_flight


def with_never_died(groups: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """``death_groups`` with ``count`` more messages that never died (rows held elsewhere:
    the local queues kept in memory hold only such), in the group of empty strings."""
    if not count:
        return groups
    # ``death_groups`` is sorted by (reason, destination): the empty strings' group is first.
    if groups and (groups[0]["reason"], groups[0]["original_destination"]) == ("", ""):
        return [{**groups[0], "count": groups[0]["count"] + count}, *groups[1:]]
    never = {"reason": "", "original_destination": "", "count": count, "oldest": 0, "newest": 0}
    return [never, *groups]


def death_groups(conn: SqlConnection, queue: str) -> list[dict[str, Any]]:
    counts: Counter[tuple[str, str]] = Counter()
    oldest: dict[tuple[str, str], int] = {}
    newest: dict[tuple[str, str], int] = {}
    # One query per state, each written so that SQLite reads its partial index of the queue's
    # ready (or in-flight) rows: ``state IN (...)`` made it read the whole table.
    rows = [
        row
        for state in ("ready", "delivered")
        for row in conn.execute(
            f"SELECT deaths FROM messages WHERE queue = ? AND state = '{state}'", (queue,)
        )
    ]
    for (deaths,) in rows:
        first = orjson.loads(deaths)[0] if deaths else {}
        key = (str(first.get("reason", "")), str(first.get("destination", "")))
        died = int(first.get("time", 0))
        counts[key] += 1
        oldest[key] = min(oldest.get(key, died), died)
        newest[key] = max(newest.get(key, died), died)
    return [
        {
            "reason": reason,
            "original_destination": destination,
            "count": count,
            "oldest": oldest[(reason, destination)],
            "newest": newest[(reason, destination)],
        }
        for (reason, destination), count in sorted(counts.items())
    ]
