"""The schedules' catalog rows on a real SQLite file: revisions, the top-up lease, and a record
that names a lease or revision no longer in force changing nothing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tarry.queues.schedule_rows import (
    advance,
    delete_schedule,
    read_schedule,
    read_schedules,
    save_schedule,
    take_lease,
)
from tarry.store.sqlite.schema import migrate

DEFINITION = {"cron": "* * * * *", "timezone": "UTC", "destination": "q"}


def database(tmp_path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(tmp_path / "queues.db", isolation_level=None)
    migrate(conn)
    return conn


def test_an_equal_definition_keeps_its_revision_and_another_starts_a_new_one(
    tmp_path: Path,
) -> None:
    conn = database(tmp_path)
    before, row = save_schedule(conn, "tick", DEFINITION, now_ms=1_000)
    assert before is None and (row.revision_ms, row.planned_through_ms) == (1_000, 1_000)
    again, same = save_schedule(conn, "tick", dict(DEFINITION), now_ms=2_000)
    assert again == same == row
    old, new = save_schedule(conn, "tick", {**DEFINITION, "body": "x"}, now_ms=2_000)
    assert old == row and new.revision_ms == 2_000 and new.definition["body"] == "x"


def test_one_node_at_a_time_holds_the_lease_and_a_stale_record_changes_nothing(
    tmp_path: Path,
) -> None:
    conn = database(tmp_path)
    _, row = save_schedule(conn, "tick", DEFINITION, now_ms=1_000)
    # A takes the lease; B cannot while it lives, and can once it lapsed
    assert take_lease(conn, row, node="A", now_ms=1_000, until_ms=5_000)
    assert take_lease(conn, row, node="A", now_ms=2_000, until_ms=6_000)  # renewed
    assert not take_lease(conn, row, node="B", now_ms=5_999, until_ms=9_000)
    assert take_lease(conn, row, node="B", now_ms=6_000, until_ms=10_000)
    # A's record after B took over changes nothing; B's moves the plan, never backwards
    assert advance(conn, row, node="A", planned_through_ms=9, finished=False, last_error=None) == (
        "lease_lost"
    )
    ok = advance(conn, row, node="B", planned_through_ms=60_000, finished=False, last_error=None)
    assert ok == "ok"
    ok = advance(conn, row, node="B", planned_through_ms=30_000, finished=False, last_error="e")
    assert ok == "ok"
    now = read_schedule(conn, "tick")
    assert now is not None and (now.planned_through_ms, now.last_error) == (60_000, "e")
    assert [r.name for r in read_schedules(conn, due_by_ms=60_000)] == ["tick"]
    assert read_schedules(conn, due_by_ms=59_999) == []
    # A record for a revision replaced or deleted meanwhile says so
    save_schedule(conn, "tick", {**DEFINITION, "body": "new"}, now_ms=7_000)
    assert advance(conn, row, node="B", planned_through_ms=1, finished=False, last_error=None) == (
        "gone"
    )
    assert not take_lease(conn, row, node="B", now_ms=70_000, until_ms=80_000)
    assert delete_schedule(conn, "tick") is not None and delete_schedule(conn, "tick") is None
