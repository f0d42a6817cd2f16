"""Recurring schedules in the catalog database (``queues.db``, the SQLite file, or the
PostgreSQL database every node shares): one row per schedule, written in portable SQL.

A row holds the definition (JSON, as ``tarry.model.schedule.Schedule.to_dict`` writes it), its
``revision_ms`` (when this definition was put: a replaced schedule starts a new revision), how far
its occurrences are stored (``planned_through_ms``), and the lease of the node topping it up
(``owner``, ``lease_until_ms``). Every write that depends on what a node read names the revision
(and the lease), so a node that read an older state changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from tarry.store.sql import SqlConnection

__all__ = [
    "ScheduleRow",
    "advance",
    "delete_schedule",
    "read_schedule",
    "read_schedules",
    "save_schedule",
    "take_lease",
]

_COLUMNS = (
    "name, definition, revision_ms, created_at_ms, planned_through_ms, finished, owner, "
    "lease_until_ms, last_error"
)


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    name: str
    definition: dict[str, Any]
    revision_ms: int
    created_at_ms: int
    planned_through_ms: int
    finished: bool
    owner: str | None
    lease_until_ms: int
    last_error: str | None


def _row(values: Any) -> ScheduleRow:
    name, definition, revision, created, through, finished, owner, lease, error = values
    return ScheduleRow(
        str(name),
        orjson.loads(definition),
        int(revision),
        int(created),
        int(through),
        bool(finished),
        owner,
        int(lease),
        error,
    )


def read_schedule(conn: SqlConnection, name: str) -> ScheduleRow | None:
    found = conn.execute(f"SELECT {_COLUMNS} FROM schedules WHERE name = ?", (name,)).fetchone()
    return None if found is None else _row(found)


def read_schedules(conn: SqlConnection, *, due_by_ms: int | None = None) -> list[ScheduleRow]:
    """Every schedule by name; with ``due_by_ms``, only those not finished whose stored
    occurrences end before it (they need a top-up)."""
    if due_by_ms is None:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM schedules ORDER BY name")
    else:
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM schedules WHERE finished = 0 AND planned_through_ms <= ? "
            "ORDER BY name",
            (due_by_ms,),
        )
    return [_row(r) for r in rows]


def save_schedule(
    conn: SqlConnection, name: str, definition: dict[str, Any], *, now_ms: int
) -> tuple[ScheduleRow | None, ScheduleRow]:
    """Create or replace schedule ``name``; returns (the row before, the row now). An equal
    definition keeps its row as it is; another one starts a new revision, planned from now."""
    before = read_schedule(conn, name)
    if before is not None and before.definition == definition:
        return before, before
    text = orjson.dumps(definition).decode()
    if before is None:
        conn.execute(
            f"INSERT INTO schedules ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, 0, NULL, 0, NULL)",
            (name, text, now_ms, now_ms, now_ms),
        )
    else:
        revision = max(now_ms, before.revision_ms + 1)
        conn.execute(
            "UPDATE schedules SET definition = ?, revision_ms = ?, planned_through_ms = ?, "
            "finished = 0, owner = NULL, lease_until_ms = 0, last_error = NULL WHERE name = ?",
            (text, revision, now_ms, name),
        )
    after = read_schedule(conn, name)
    assert after is not None
    return before, after


def delete_schedule(conn: SqlConnection, name: str) -> ScheduleRow | None:
    """Remove schedule ``name``; returns the row it had (None: there was none)."""
    before = read_schedule(conn, name)
    if before is not None:
        conn.execute("DELETE FROM schedules WHERE name = ?", (name,))
    return before


def take_lease(
    conn: SqlConnection, row: ScheduleRow, *, node: str, now_ms: int, until_ms: int
) -> bool:
    """Make ``node`` the one topping up ``row``'s revision until ``until_ms``: True when no other
    node holds a live lease on it (a concurrent taker waits for this row's lock, then finds the
    lease taken)."""
    cursor = conn.execute(
        "UPDATE schedules SET owner = ?, lease_until_ms = ? WHERE name = ? AND revision_ms = ? "
        "AND (owner IS NULL OR owner = ? OR lease_until_ms <= ?)",
        (node, until_ms, row.name, row.revision_ms, node, now_ms),
    )
    return int(cursor.rowcount) == 1


def advance(
    conn: SqlConnection,
    row: ScheduleRow,
    *,
    node: str,
    planned_through_ms: int,
    finished: bool,
    last_error: str | None,
) -> str:
    """Record a top-up of ``row``'s revision by ``node``. Returns ``"ok"``, ``"lease_lost"``
    (another node took over: it stores the same occurrences again, de-duplicated) or ``"gone"``
    (the schedule was deleted or replaced meanwhile)."""
    cursor = conn.execute(
        "UPDATE schedules SET planned_through_ms = CASE WHEN planned_through_ms > ? "
        "THEN planned_through_ms ELSE ? END, finished = ?, last_error = ? "
        "WHERE name = ? AND revision_ms = ? AND owner = ?",
        (
            planned_through_ms,
            planned_through_ms,
            int(finished),
            last_error,
            row.name,
            row.revision_ms,
            node,
        ),
    )
    if int(cursor.rowcount) == 1:
        return "ok"
    now = read_schedule(conn, row.name)
    return "lease_lost" if now is not None and now.revision_ms == row.revision_ms else "gone"
