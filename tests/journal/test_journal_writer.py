"""The journal's lines, one event at a time or a batch at a time (as the engine gives them)."""

from __future__ import annotations

from pathlib import Path

import orjson

from tarry.config import JournalConfig
from tarry.journal.writer import Journal
from tarry.model.events import Event
from tarry.model.message import Message, plain_message
from tarry.model.time import ManualClock


def _events() -> list[Event]:
    plain = plain_message("m1", "q", b"abc", 1, 10, None)
    full = Message(
        id="m2",
        destination="q",
        body=b"",
        headers={"h": "v"},
        sent_at_ms=2,
        deliver_at_ms=20,
        expires_at_ms=99,
        message_id='a "quoted" id\n',
        correlation_id="c",
    )
    return [
        ("scheduled", plain, 1, None, None),
        ("released", plain, 12, "q", None),
        ("dead_lettered", full, 30, "q", "expired"),
        ("received", full, 25, "q", None),
    ]


def _lines(directory: Path) -> list[dict[str, object]]:
    return [
        orjson.loads(line)
        for path in sorted(directory.glob("*.jsonl*"))
        for line in path.read_bytes().splitlines()
    ]


def test_a_batch_writes_the_lines_its_events_one_by_one_would(tmp_path: Path) -> None:
    clock = ManualClock()
    one = Journal(tmp_path / "one", JournalConfig(), clock=clock, node="n")
    many = Journal(tmp_path / "many", JournalConfig(), clock=clock, node="n")
    for event in _events():
        one.record(*event)
    many.record_many(_events()[:1])
    many.record_many(_events()[1:])
    one.close()
    many.close()
    lines = _lines(tmp_path / "one")
    assert lines == _lines(tmp_path / "many")
    assert [line["event"] for line in lines] == [
        "scheduled",
        "released",
        "dead_lettered",
        "received",
    ]
    assert lines[1]["lateness_ms"] == 2 and lines[0]["lateness_ms"] is None
    assert lines[2]["message_id"] == 'a "quoted" id\n' and lines[2]["reason"] == "expired"
    assert many.written == 4 and many.dropped == 0
