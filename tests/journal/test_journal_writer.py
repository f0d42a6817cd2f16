"""The journal's lines, one event at a time or a batch at a time (as the engine gives them)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import orjson

from tarry.config import JournalConfig
from tarry.journal.lines import encode_lines
from tarry.journal.writer import Journal
from tarry.model.events import Event, EventRun
from tarry.model.message import DeathReason, Message, plain_message
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


def _as_dict_line(event: Event, node: str) -> bytes:
    """A line as the format defines it: ``orjson.dumps`` of the keys in order."""
    name, m, time_ms, queue, reason = event
    late = name in ("released", "delivered", "received", "expired")
    return orjson.dumps(
        {
            "event": name,
            "time": time_ms,
            "node": node,
            "id": m.id,
            "destination": m.destination,
            "topic": m.topic,
            "queue": queue,
            "message_id": m.message_id,
            "correlation_id": m.correlation_id,
            "sent_at": m.sent_at_ms,
            "deliver_at": m.deliver_at_ms,
            "expires_at": m.expires_at_ms,
            "size": len(m.body),
            "failures": m.failures,
            "reason": reason,
            "lateness_ms": time_ms - m.deliver_at_ms if late else None,
        },
        None,
        orjson.OPT_APPEND_NEWLINE,
    )


def test_each_line_is_byte_for_byte_the_dict_form_whatever_the_text_holds() -> None:
    # Given events whose texts need escaping, hold % signs and non-ASCII, and an enum reason
    odd = Message(
        id="m3",
        destination="q.%d",
        body=b"xyz",
        headers={},
        sent_at_ms=3,
        deliver_at_ms=30,
        expires_at_ms=None,
        message_id="naïve \\ %s \u2028",
        correlation_id="",
        topic="t",
        failures=2,
    )
    events = [
        *_events(),
        ("dead_lettered", odd, 40, "q.%d", DeathReason.EXPIRED),
        ("expired", odd, 41, None, "ttl %"),
    ]
    # When they are encoded as one batch
    data, lines, dropped = encode_lines(events, "node-ü")
    # Then every line is what orjson makes of the line's dict, in order
    assert data == b"".join(_as_dict_line(event, "node-ü") for event in events)
    assert (lines, dropped) == (len(events), 0)


def test_an_event_that_cannot_be_encoded_is_dropped_alone(tmp_path: Path) -> None:
    # Given a batch where one message id is not valid Unicode (a lone surrogate)
    bad = plain_message("\ud800", "q", b"", 1, 10, None)
    events = [*_events()[:2], ("scheduled", bad, 1, None, None), *_events()[2:]]
    journal = Journal(tmp_path, JournalConfig(), clock=ManualClock(), node="n")
    # When the journal records the batch
    journal.record_many(events)
    journal.close()
    # Then the other events are written and the bad one counted as dropped
    assert [line["id"] for line in _lines(tmp_path)] == ["m1", "m1", "m2", "m2"]
    assert journal.written == 4 and journal.dropped == 1


def test_a_run_of_one_event_writes_the_lines_of_its_events() -> None:
    # Given the same change for many messages, as one run and as separate events
    messages = [plain_message(f"m{i}", "q", b"a" * i, 1, 10 + i, 99) for i in range(5)]
    run = EventRun("released", messages, 20, "q")
    # When both are encoded
    # Then they give the same lines, and a slice of the run is a run of the same change
    assert encode_lines(run, "n") == encode_lines(list(run), "n")
    assert list(run[1:3]) == [("released", m, 20, "q", None) for m in messages[1:3]]
    assert run[4] == ("released", messages[4], 20, "q", None) and len(run) == 5
    # And the same change later (its templates kept from the first run) writes its own time
    later = EventRun("released", messages[::-1], 21, "q")
    assert encode_lines(later, "n") == encode_lines(list(later), "n")
    assert b'"time":21,' in encode_lines(later, "n")[0]


def test_a_run_of_mixed_messages_writes_each_line_as_its_dict_whatever_the_text_holds() -> None:
    # Given runs whose messages mix plain ones (no optional field) with ones that set each
    # optional field, another destination, text needing escapes and % signs, and one id that
    # is not valid Unicode
    def plain(i: int, destination: str = "q.%d") -> Message:
        return plain_message(f"m{i}", destination, b"b" * i, 5, 50 + i, None)

    odd = [
        Message("o1", "q.%d", b"", {}, 5, 60, 70, message_id="id %s \u2028"),
        Message("o2", "q.%d", b"x", {}, 5, 61, None, correlation_id='c "%d"'),
        Message("o3", "q.%d", b"xy", {}, 5, 62, None, topic="t.%s"),
        Message("o4", "q.%d", b"xyz", {}, 5, 63, None, failures=3),
        plain(7, "other.ü"),
        plain_message("\ud800", "q.%d", b"", 5, 64, None),
    ]
    messages = [plain(0), *odd[:3], plain(1), *odd[3:], plain(2)]
    for run in (
        EventRun("scheduled", messages, 5),
        EventRun("released", messages, 90, "q.%d"),
        EventRun("dead_lettered", messages, 91, "q.%d", DeathReason.EXPIRED),
        EventRun("expired", messages, 92, None, "ttl %"),
    ):
        # When each run is encoded whole
        data, lines, dropped = encode_lines(run, "node-%s-ü")
        # Then every line is what orjson makes of its dict, in order; the bad one is dropped
        kept = [event for event in run if event[1].id != "\ud800"]
        assert data == b"".join(_as_dict_line(event, "node-%s-ü") for event in kept)
        assert (lines, dropped) == (len(kept), 1)
    assert encode_lines(EventRun("scheduled", [], 1), "n") == (b"", 0, 0)


async def test_a_run_stopped_while_its_thread_writes_loses_no_line_and_keeps_their_order(
    tmp_path: Path,
) -> None:
    # Given a journal whose background loop hands a slow write to its thread
    journal = Journal(tmp_path, JournalConfig(flush_ms=1), clock=ManualClock(), node="n")
    write = journal._write
    started = threading.Event()

    def slow(data: bytearray, lines: int) -> tuple[int, int]:
        started.set()
        time.sleep(0.2)
        return write(data, lines)

    journal._write = slow  # type: ignore[method-assign]
    messages = [plain_message(f"m{i}", "q", b"", 1, 10, None) for i in range(6)]
    journal.record_many(EventRun("scheduled", messages[:3], 1))
    task = asyncio.create_task(journal.run())
    while not started.is_set():
        await asyncio.sleep(0.01)
    # When more lines come while that write is under way, and the loop is cancelled then
    journal.record_many(EventRun("scheduled", messages[3:], 2))
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    journal.close()
    # Then every line is in the file once, in order, and counted
    assert [line["id"] for line in _lines(tmp_path)] == [m.id for m in messages]
    assert journal.written == 6 and journal.dropped == 0
