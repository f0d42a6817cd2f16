"""tarry opens a data directory an older tarry wrote: the log store's queue database (schema
version 2, rows keyed by ``id``) is rebuilt keyed in release order, and every message in it is
found, received, acked and dead-lettered as before.

``old_data/log-a6089f4`` was written by tarry at commit a6089f4 with
``old_data/make_log_a6089f4.py`` (clock at 1,700,000,000,000 ms, then 1 s later): queues
``orders`` (dead-lettering to ``orders.dead``) and ``orders.dead``; in ``orders`` the message
``acked`` (acked), ``inflight`` (received, its receipt kept in ``sent.json``), ``ready``
(``message_id`` order-42, received and put back), ``rejected`` (received), ``due`` (released
after its 1 s delay); ``future`` is still scheduled in the log, due an hour later.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from tarry.store.sqlite.schema import is_keyed


@pytest.fixture
def engine_store() -> str:
    return "log"


@pytest.fixture
def old_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(Path(__file__).parent / "old_data" / "log-a6089f4", data)
    return data


def _keyed(path: Path) -> bool:
    conn = sqlite3.connect(path)
    try:
        return is_keyed(conn)
    finally:
        conn.close()


async def test_an_older_queue_database_is_rebuilt_and_keeps_every_message(
    make_engine, clock, old_dir: Path
) -> None:
    # Given the data directory of an older tarry, its queue database keyed by id
    sent = json.loads((old_dir / "sent.json").read_text())
    assert not _keyed(old_dir / "queues.db")
    clock.advance(2000)

    # When this tarry starts on it
    engine = await make_engine(data_dir=old_dir)

    # Then the queue database is keyed in release order, and every message is found by id
    assert _keyed(old_dir / "queues.db")
    names = [name for name in sent if name != "inflight_receipt"]
    states = {name: (await engine.get_message(sent[name])).state.value for name in names}
    assert states == {
        "acked": "acked",
        "inflight": "delivered",
        "ready": "ready",
        "rejected": "delivered",
        "due": "ready",
        "future": "scheduled",
    }
    # a receipt handed out before the rebuild still acks
    assert (await engine.ack("orders", [sent["inflight_receipt"]]))["acked"] == 1
    assert (await engine.get_message(sent["inflight"])).state.value == "acked"
    # a repeated message_id still finds the released message (no second copy)
    again = await engine.send({"destination": "orders", "body": "x", "message_id": "order-42"})
    assert (again.id, again.created) == (sent["ready"], False)
    # the ready messages come in their old order
    got = await engine.receive("orders", max_messages=10)
    assert [d.message.id for d in got] == [sent["ready"], sent["due"]]

    # When the scheduled message falls due
    clock.advance(3_600_000)
    assert await engine.dispatcher.run_once() is True

    # Then it is released once, after the old ones, and can be dead-lettered by rejection
    assert await engine.dispatcher.run_once() is False
    # (the ones received before are visible again by now: their visibility timeouts ended)
    got = await engine.receive("orders", max_messages=10)
    [future] = [d for d in got if d.message.id == sent["future"]]
    assert sorted(d.message.id for d in got) == sorted(
        sent[name] for name in ("ready", "rejected", "due", "future")
    )
    await engine.nack("orders", [future.receipt], requeue=False)
    assert (await engine.get_message(sent["future"])).state.value == "dead_lettered"
    [dead] = await engine.receive("orders.dead")
    assert dead.message.headers["tarry-original-id"] == sent["future"]
