"""``tarry pipeline import --into DATA_DIR``: segment files in the log store's own format, adopted
by a real ``tarry serve`` at its next start, all or nothing, once per message."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from click.testing import CliRunner

from tarry.cli.main import cli

if TYPE_CHECKING:
    from tarry.pipeline.bulk_import import ImportOptions

pytestmark = pytest.mark.spark


def _import(path: Path, data: Path, rejects: Path) -> str:
    result = CliRunner().invoke(
        cli,
        ["pipeline", "import", str(path), "--into", str(data), "--rejects", str(rejects), "--json"],
    )
    assert result.exit_code == 0, result.output
    return result.output


def _messages(url: str, **params: str) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/v1/messages", params={**params, "limit": "1000"}).json()["items"]


def _import_in_quarters(spark: Any, options: ImportOptions, now: int) -> Any:
    """``run_import`` of ``options.input`` (one queue ``q``) read in four input splits, so that
    several tasks write the same partitions."""
    from tarry.model.validate import DestinationView, TargetView
    from tarry.pipeline.bulk_import import run_import

    view = {"q": DestinationView("q", "queue", (TargetView("q"),))}
    split = Path(options.input).stat().st_size // 4
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(split))
    try:
        return run_import(spark, options, now_ms=now, resolve_views=lambda _: view)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")


def test_offline_import_is_adopted_once_and_refused_when_damaged(
    spark: Any, make_server: Any, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    server = make_server(data_dir=data)
    for queue in ("o.q", "o.s1", "o.s2"):
        httpx.put(f"{server.url}/v1/queues/{queue}").raise_for_status()
    httpx.put(f"{server.url}/v1/topics/o.t").raise_for_status()
    for queue in ("o.s1", "o.s2"):
        httpx.put(f"{server.url}/v1/topics/o.t/subscriptions/{queue}").raise_for_status()
    soon = int(time.time() * 1000) + 20_000
    later = soon + 3 * 86_400_000
    rows = [
        {"destination": "o.q", "deliver_at": soon, "message_id": "n1", "body": "soon"},
        {"destination": "o.q", "deliver_at": later, "message_id": "n2"},
        {"destination": "o.t", "deliver_at": later, "message_id": "n3", "headers": '{"k":"v"}'},
        {"destination": "o.q", "deliver_at": later, "message_id": "n1"},  # a duplicate
        {"destination": "o.missing", "message_id": "n4"},
    ]
    (tmp_path / "in.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # The server keeps running: the catalog is read from its queues.db, the area is adopted at
    # the next start.
    out = _import(tmp_path / "in.json", data, tmp_path / "rej1")
    assert '"accepted": 3' in out and '"copies": 4' in out and '"duplicates": 1' in out
    assert '"unknown_destination": 1' in out
    assert len(list((data / "log" / "imports").iterdir())) == 1
    server.restart()
    assert not (data / "log" / "imports").exists() or not any((data / "log" / "imports").iterdir())
    n1 = _messages(server.url, message_id="n1")
    assert len(n1) == 1 and n1[0]["deliver_at"] == soon and n1[0]["state"] == "scheduled"
    n3 = _messages(server.url, message_id="n3")
    assert sorted((m["destination"], m["topic"]) for m in n3) == [("o.s1", "o.t"), ("o.s2", "o.t")]
    assert n3[0]["headers"] == {"k": "v"}
    assert httpx.get(f"{server.url}/healthz").json()["status"] == "ok"

    # The same import again (and a repeat send over HTTP): nothing is stored twice.
    _import(tmp_path / "in.json", data, tmp_path / "rej2")
    server.restart()
    again = httpx.post(f"{server.url}/v1/messages", json={"destination": "o.q", "message_id": "n2"})
    assert again.status_code == 200  # the imported message's de-duplication key holds
    assert len(_messages(server.url, destination="o.q")) == 2
    assert len(_messages(server.url, message_id="n3")) == 2

    # A damaged import is refused as a whole, and named in /healthz.
    more = [
        {"destination": "o.q", "deliver_at": later, "message_id": "m1"},
        {"destination": "o.t", "deliver_at": later + 1, "message_id": "m2"},
    ]
    (tmp_path / "more.json").write_text("".join(json.dumps(r) + "\n" for r in more))
    _import(tmp_path / "more.json", data, tmp_path / "rej3")
    area = next((data / "log" / "imports").iterdir())
    segment = next(area.rglob("*.log"))
    raw = bytearray(segment.read_bytes())
    raw[-3] ^= 0xFF
    segment.write_bytes(bytes(raw))
    server.restart()
    assert (
        _messages(server.url, message_id="m1") == []
        and _messages(server.url, message_id="m2") == []
    )
    health = httpx.get(f"{server.url}/healthz").json()
    assert health["status"] == "degraded"
    assert any("import refused" in d and "checksum" in d for d in health["damaged"])

    # The message due soon is delivered from the adopted segment, not early.
    got = httpx.post(
        f"{server.url}/v1/queues/o.q/receive", json={"max": 1, "wait_ms": 20_000}, timeout=30
    ).json()["messages"]
    if not got:  # under load the first wait may end just before the due time
        got = httpx.post(
            f"{server.url}/v1/queues/o.q/receive", json={"max": 1, "wait_ms": 10_000}, timeout=30
        ).json()["messages"]
    assert [m["body"] for m in got] == ["soon"]
    assert int(time.time() * 1000) >= soon


def test_offline_import_drops_repeats_across_tasks_and_sorts_each_file(
    spark: Any, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tarry.pipeline.bulk_import import ImportOptions
    from tarry.pipeline.sink_log import LogSinkSettings
    from tarry.store.log.record import Record, decode_message, scan

    # Given 200 rows in four row groups, the last 50 repeating the first 50 (other tasks read
    # them), due times out of order over a few partitions
    now, width = 1_800_000_000_000, 60_000
    n = 200
    ids = [f"m{i % 150}" for i in range(n)]
    delays = [(i * 7919) % (5 * width) for i in range(n)]
    table = pa.table(
        {
            "destination": ["q"] * n,
            "message_id": ids,
            "delay_ms": delays,
            "body": [f"row {i}" for i in range(n)],
        }
    )
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=50)
    area = tmp_path / "data" / "log" / "imports" / "import-test"
    options = ImportOptions(
        input=tmp_path / "in.parquet",
        rejects_dir=tmp_path / "rejects",
        log_sink=LogSinkSettings(area=area, granularity_ms=width, now_ms=now),
        plan_dir=tmp_path / "plan",
        partition_ms=width,
    )
    # When imported with small input splits (one task per row group)
    summary = _import_in_quarters(spark, options, now)
    # Then the repeats are counted and rejected, naming the row each repeats
    assert (summary.rows_read, summary.accepted, summary.duplicates) == (200, 150, 50)
    assert summary.copies == 150 and summary.partitions == 5
    rejects = pq.read_table(tmp_path / "rejects").to_pylist()
    assert sorted(json.loads(r["record"])["body"] for r in rejects) == sorted(
        f"row {i}" for i in range(150, 200)
    )
    kept_rows = set()
    for reject in rejects:  # ``row`` is Spark's row id (the task in its high bits)
        assert reject["code"] == "duplicate"
        kept_rows.add(int(reject["message"].split("repeats input row ")[1].split(";")[0]))
    assert len(kept_rows) == 50 and not kept_rows & {r["row"] for r in rejects}
    # And the files, from more than one task, hold each first row once, each sorted by due time
    files = sorted(area.rglob("*.log"))
    assert len({f.name.split(".")[1].split("-")[0] for f in files}) > 1  # <partition>.<task>-<i>
    bodies = []
    for path in files:
        messages = [
            decode_message(r.payload)[0] for r in scan(path.read_bytes()) if isinstance(r, Record)
        ]
        due = [m.deliver_at_ms for m in messages]
        assert due == sorted(due) and len({d // width for d in due}) == 1
        bodies += [m.body for m in messages]
    assert sorted(bodies) == sorted(f"row {i}".encode() for i in range(150))
    # And the plan, asked for beside the files, holds the same first rows
    plan = pq.read_table(tmp_path / "plan").to_pylist()
    assert sorted(json.loads(r["record"])["body"] for r in plan) == sorted(
        f"row {i}" for i in range(150)
    )


def test_offline_import_keeps_the_first_accepted_row_of_each_key_given_or_derived(
    spark: Any, tmp_path: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tarry.model.validate import DestinationView, TargetView
    from tarry.pipeline.bulk_import import ImportOptions, run_import
    from tarry.pipeline.records import decode_row, derived_message_id
    from tarry.pipeline.sink_log import LogSinkSettings

    # Given a key first held by a refused row, rows without a message_id (derived from their
    # content), a given id equal to a derived one, and the same id for another destination
    now, width = 1_800_000_000_000, 60_000
    derived = derived_message_id(decode_row({"destination": "q", "body": "x", "delay_ms": 1000}))
    rows: list[dict[str, Any]] = [
        {"destination": "q", "message_id": "a", "delay_ms": 5000, "ttl_ms": 1},  # expiry_error
        {"destination": "q", "message_id": "a", "delay_ms": 2000},  # the first accepted "a"
        {"destination": "q", "message_id": "a", "delay_ms": 3000},  # repeats row 1
        {"destination": "q", "body": "x", "delay_ms": 1000},  # derived id
        {"destination": "q", "body": "x", "delay_ms": 1000},  # repeats row 3
        {"destination": "q", "message_id": derived, "delay_ms": 4000},  # repeats row 3
        {"destination": "r", "message_id": "a", "delay_ms": 2000},  # another key
        {"destination": "q", "message_id": "b", "delay_ms": 2000},
    ]
    schema = pa.schema(
        [("destination", pa.string()), ("message_id", pa.string()), ("body", pa.string())]
        + [("delay_ms", pa.int64()), ("ttl_ms", pa.int64())]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp_path / "in.parquet")
    area = tmp_path / "data" / "log" / "imports" / "import-test"
    options = ImportOptions(
        input=tmp_path / "in.parquet",
        rejects_dir=tmp_path / "rejects",
        log_sink=LogSinkSettings(area=area, granularity_ms=width, now_ms=now),
        partition_ms=width,
    )
    views = {name: DestinationView(name, "queue", (TargetView(name),)) for name in ("q", "r")}
    # When imported offline
    summary = run_import(spark, options, now_ms=now, resolve_views=lambda _: views)
    # Then the first accepted row of each key is imported and every later one is a duplicate
    # naming it (one input split: the rows' ids are their positions)
    assert (summary.rows_read, summary.accepted, summary.duplicates) == (8, 4, 3)
    assert summary.rejected == {"expiry_error": 1} and summary.copies == 4
    rejects = sorted(pq.read_table(tmp_path / "rejects").to_pylist(), key=lambda r: r["row"])
    assert [(r["row"], r["code"], r["message_id"]) for r in rejects] == [
        (0, "expiry_error", "a"),
        (2, "duplicate", "a"),
        (4, "duplicate", derived),
        (5, "duplicate", derived),
    ]
    assert ["repeats input row 1" in rejects[1]["message"]] + [
        "repeats input row 3" in r["message"] for r in rejects[2:]
    ] == [True, True, True]
    assert all(r["record"] for r in rejects)


def test_offline_import_without_a_message_id_column_drops_identical_rows(
    spark: Any, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    from tarry.model.validate import DestinationView, TargetView
    from tarry.pipeline.bulk_import import ImportOptions, run_import
    from tarry.pipeline.sink_log import LogSinkSettings

    # Given CSV rows with no message_id column, two of them the same
    now, width = 1_800_000_000_000, 60_000
    (tmp_path / "in.csv").write_text("destination,delay_ms,body\nq,1000,x\nq,1000,y\nq,1000,x\n")
    options = ImportOptions(
        input=tmp_path / "in.csv",
        rejects_dir=tmp_path / "rejects",
        log_sink=LogSinkSettings(
            area=tmp_path / "data" / "log" / "imports" / "import-test",
            granularity_ms=width,
            now_ms=now,
        ),
        partition_ms=width,
    )
    view = {"q": DestinationView("q", "queue", (TargetView("q"),))}
    # When imported offline
    summary = run_import(spark, options, now_ms=now, resolve_views=lambda _: view)
    # Then the repeat of the first row (same content, so the same derived id) is dropped
    assert (summary.rows_read, summary.accepted, summary.duplicates) == (3, 2, 1)
    [reject] = pq.read_table(tmp_path / "rejects").to_pylist()
    assert reject["code"] == "duplicate" and reject["message_id"].startswith("imp-")
    assert json.loads(reject["record"])["body"] == "x"


def test_a_year_of_due_times_imported_offline_fills_the_store_s_own_few_partitions(
    spark: Any, tmp_path: Path
) -> None:
    import asyncio

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tarry.model.state import MessageState
    from tarry.pipeline.bulk_import import ImportOptions
    from tarry.pipeline.sink_log import LogSinkSettings
    from tarry.store.log import LogStore
    from tarry.store.log.layout import Layout
    from tarry.store.log.record import Record, decode_message, scan

    # Given 3,000 rows due over a year (and a few within minutes), read by several tasks, for
    # a store of 5-minute partitions (105,120 of them for a year, one each)
    now, width, year = 1_800_000_000_000, 300_000, 365 * 86_400_000
    n = 3_000
    delays = np.random.default_rng(5).integers(1_000, year, n)
    delays[:5] = [1_000, 2_000, 60_000, 600_000, 7_200_000]
    table = pa.table(
        {
            "destination": ["q"] * n,
            "message_id": [f"y{i}" for i in range(n)],
            "delay_ms": pa.array(delays, pa.int64()),
        }
    )
    pq.write_table(table, tmp_path / "in.parquet", row_group_size=n // 4)
    root = tmp_path / "data" / "log"
    area = root / "imports" / "import-year"
    options = ImportOptions(
        input=tmp_path / "in.parquet",
        rejects_dir=tmp_path / "rejects",
        log_sink=LogSinkSettings(area=area, granularity_ms=width, now_ms=now),
        partition_ms=width,
    )
    # When imported offline, in four input splits
    summary = _import_in_quarters(spark, options, now)
    # Then the files fill the partitions the store's write path gives them, a few hundred
    layout = Layout(width)
    want = {layout.key_for(now + int(d), now) for d in delays}
    assert summary.accepted == n and summary.partitions == len(want) < 250
    # each in the area itself, named for its partition (no directory a partition)
    assert not [d for d in area.iterdir() if d.is_dir()]
    assert {Layout.parse_name(f.name.split(".")[0]) for f in area.glob("*.log")} == want
    written = {
        m.id: m.deliver_at_ms
        for path in area.rglob("*.log")
        for m in (
            decode_message(r.payload)[0] for r in scan(path.read_bytes()) if isinstance(r, Record)
        )
    }
    assert len(written) == n

    async def adopted_and_released() -> None:
        # And a store adopts them: every message found, counted once
        store = LogStore(root, granularity_ms=width)
        await store.open()
        assert not area.exists() and set(store.partitions) == want
        assert await store.count_scheduled() == n
        for message_id, due in written.items():
            found = await store.get(message_id)
            assert found is not None and found.deliver_at_ms == due
        # And a kill -9 after the adoption loses none and doubles none (a checkpoint has them)
        store._opened = False
        store.files.close()
        store._executor.shutdown(wait=True)
        store = LogStore(root, granularity_ms=width)
        await store.open()
        assert store.state.replayed_records == 0 and await store.count_scheduled() == n
        # And each is released once as time passes over the year, when due and not before
        released: dict[str, int] = {}
        previous = now
        for step in range(1, 101):
            at = now + step * (year + 2_000) // 100
            while batch := await store.fetch_due(at, limit=1_000, lease_ms=year):
                assert all(previous < m.deliver_at_ms <= at for m in batch)
                released.update((m.message_id or "", m.deliver_at_ms) for m in batch)
                await store.remove([m.id for m in batch], state=MessageState.DELIVERED, now_ms=at)
            previous = at
        assert released == {f"y{i}": now + int(d) for i, d in enumerate(delays)}
        assert await store.check() == []
        await store.close()

    asyncio.run(adopted_and_released())
