"""``PendingReceives`` on a real SQLite queue database: a claim written as its receive would have
written it, an ack of a claim, writing by age, and undo back to a savepoint."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tarry.store.sqlite.database import _connect
from tarry.store.sqlite.pending_receives import PendingReceives
from tarry.store.sqlite.schema import migrate

NOW = 1_700_000_000_000


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = _connect(str(tmp_path / "queues.db"))
    migrate(conn, queues_only=True)
    for i in range(1, 5):
        conn.execute(
            "INSERT INTO messages (id, destination, state, body, headers, sent_at_ms, "
            "deliver_at_ms, on_undeliverable, persistent, queue, seq, visible_at_ms, "
            "updated_at_ms) VALUES (?, 'q', 'ready', x'61', '{}', ?, ?, 'dead_letter', 1, "
            "'q', ?, ?, ?)",
            (f"{NOW:013d}m{i:012d}", NOW, NOW, i, NOW, NOW),
        )
    yield conn
    conn.close()


def _rows(conn: sqlite3.Connection) -> dict[int, tuple[object, ...]]:
    return {
        row[0]: row[1:]
        for row in conn.execute(
            "SELECT rowid, state, receipt, visible_at_ms, delivery_count, redelivered, "
            "updated_at_ms, body FROM messages ORDER BY rowid"
        )
    }


def test_a_claim_is_written_as_its_receive_would_have_written_it(conn) -> None:
    claims = PendingReceives()
    claims.claim("r1", "q", [1, 2], visible_at_ms=NOW + 30_000, received_at_ms=NOW + 5)
    assert len(claims) == 2 and claims.claimed_in("q") == {1, 2} and claims.claimed_in("x") == set()
    assert claims.holds(1, "r1.1") and not claims.holds(1, "r2.1") and not claims.holds(3, "r1.3")
    assert _rows(conn)[1][0] == "ready"  # nothing written yet
    claims.write_all(conn)
    rows = _rows(conn)
    assert rows[1] == ("delivered", "r1.1", NOW + 30_000, 1, 0, NOW + 5, b"a")
    assert rows[2] == ("delivered", "r1.2", NOW + 30_000, 1, 0, NOW + 5, b"a")
    assert rows[3][0] == "ready"
    assert len(claims) == 0 and claims.oldest_since() is None


def test_an_ack_writes_claimed_rows_acked_and_lets_go_of_them(conn) -> None:
    claims = PendingReceives()
    claims.claim("r1", "q", [1, 2, 3], visible_at_ms=NOW + 30_000, received_at_ms=NOW)
    assert claims.ack(conn, "q", [1, 3], now_ms=NOW + 9) == 2
    assert claims.claimed_in("q") == {2}
    rows = _rows(conn)
    assert rows[1] == ("acked", None, NOW + 30_000, 1, 0, NOW + 9, None)
    assert rows[3] == ("acked", None, NOW + 30_000, 1, 0, NOW + 9, None)
    assert rows[2][0] == "ready"
    # Of another queue: nothing changes, and the caller sees it from the count.
    assert claims.ack(conn, "other", [2], now_ms=NOW + 9) == 0


def test_claims_are_written_by_age_oldest_first(conn) -> None:
    claims = PendingReceives(write_after_s=0.2)
    claims.claim("old", "q", [1], visible_at_ms=NOW + 30_000, received_at_ms=NOW)
    claims.claim("new", "q", [2], visible_at_ms=NOW + 30_000, received_at_ms=NOW)
    old, new = claims._claims["old"], claims._claims["new"]
    old.since, new.since = 100.0, 100.5
    assert claims.oldest_since() == 100.0
    claims.write_older(conn, now=100.1)
    assert claims.claimed_in("q") == {1, 2}
    claims.write_older(conn, now=100.3)
    assert claims.claimed_in("q") == {2}
    assert claims.oldest_since() == 100.5
    claims.write_older(conn, now=100.7)
    assert len(claims) == 0
    assert [r[0] for r in _rows(conn).values()] == ["delivered", "delivered", "ready", "ready"]


def test_undo_to_a_mark_restores_what_changed_since(conn) -> None:
    claims = PendingReceives()
    claims.claim("r1", "q", [1, 2], visible_at_ms=NOW + 30_000, received_at_ms=NOW)
    claims.commit()
    mark = claims.mark()
    conn.execute("SAVEPOINT w")
    claims.ack(conn, "q", [1], now_ms=NOW)
    claims.claim("r2", "q", [3], visible_at_ms=NOW + 30_000, received_at_ms=NOW)
    claims.write_all(conn)
    assert len(claims) == 0
    conn.execute("ROLLBACK TO w")
    conn.execute("RELEASE w")
    claims.undo_to(mark)
    assert claims.claimed_in("q") == {1, 2}
    assert claims.holds(1, "r1.1") and claims.holds(2, "r1.2") and not claims.holds(3, "r2.3")
    assert all(row[0] == "ready" for row in _rows(conn).values())
    # The transaction's own claim is undone by going back to its start.
    claims.claim("r3", "q", [4], visible_at_ms=NOW + 30_000, received_at_ms=NOW)
    claims.undo_to(0)
    assert claims.claimed_in("q") == {1, 2}
