"""``tarry pipeline import`` end to end: generated input → Spark (the model's rules in the
executors) → a real ``tarry serve`` → rejects on disk; then the same import again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tarry.cli.main import cli
from tarry.client import Client
from tarry.pipeline.bulk_import import ImportOptions, run_import
from tarry.pipeline.catalog import views_from_server
from tarry.pipeline.sink_http import SinkSettings

pytestmark = pytest.mark.spark

TOKENS = """
[[auth.tokens]]
token = "admin-secret"
send = ["*"]
receive = ["*"]
admin = ["*"]

[[auth.tokens]]
token = "alice-secret"
send = ["a.*"]
receive = ["a.*"]
"""
ADMIN = {"authorization": "Bearer admin-secret"}
HOUR = timedelta(hours=1)


def _setup(url: str) -> None:
    with httpx.Client(base_url=url, headers=ADMIN) as http:
        for name, args in [
            ("a.q", {}),
            ("a.s1", {}),
            ("a.s2", {}),
            ("a.off", {"put_enabled": False}),
            ("a.tiny", {"max_message_bytes": 4}),
            ("a.one", {"max_length": 1, "overflow": "reject_publish"}),
            ("b.q", {}),
        ]:
            http.put(f"/v1/queues/{name}", json=args).raise_for_status()
        http.put("/v1/topics/a.t").raise_for_status()
        for queue in ("a.s1", "a.s2"):
            http.put(f"/v1/topics/a.t/subscriptions/{queue}").raise_for_status()
        http.post("/v1/messages", json={"destination": "a.one", "body": "fills"}).raise_for_status()


def _input(path: Path, start: datetime) -> list[str | None]:
    """The rows, and the code each should end with (None: imported)."""
    later = start + HOUR
    rows: list[tuple[dict[str, Any], str | None]] = [
        ({"channel": "a.q", "send_time": later, "message_id": "r0"}, None),
        ({"channel": "a.q", "send_time": later, "message_id": "r0", "body": "again"}, "duplicate"),
        ({"channel": "a.t", "send_time": later + HOUR, "message_id": "r2"}, None),
        ({"channel": "a.nowhere", "message_id": "r3"}, "unknown_destination"),
        ({"channel": "a.off", "message_id": "r4"}, "put_disabled"),
        ({"channel": "a.tiny", "body": "too long", "message_id": "r5"}, "message_too_large"),
        (
            {"channel": "a.q", "send_time": later, "delay_ms": 5, "message_id": "r6"},
            "invalid_argument",
        ),
        ({"channel": "a.q", "delay_ms": 10_000, "ttl_ms": 10, "message_id": "r7"}, "expiry_error"),
        (
            {"channel": "a.q", "delay_ms": 1_000, "group_id": "g", "message_id": "r8"},
            "options_error",
        ),
        ({"channel": "b.q", "delay_ms": 1_000, "message_id": "r9"}, "not_authorized"),
        ({"channel": "a.one", "delay_ms": 1_000, "message_id": "r10"}, "destination_full"),
        ({"channel": "a.q", "headers": "{nope", "message_id": "r11"}, "invalid_argument"),
        ({"channel": "a.q", "send_time": later, "body": "no id", "headers": '{"k":"v"}'}, None),
        ({"channel": "bad name!", "message_id": "r13"}, "invalid_argument"),
        ({"channel": "a.q", "delay_ms": 7_200_000, "ttl_ms": 9_000_000, "message_id": "r14"}, None),
    ]
    columns = ["channel", "send_time", "body", "delay_ms", "ttl_ms", "message_id", "group_id"]
    columns += ["headers"]
    data = {c: [r.get(c) for r, _ in rows] for c in columns}
    data["note"] = ["ignored"] * len(rows)
    schema = pa.schema(
        [
            ("channel", pa.string()),
            ("send_time", pa.timestamp("us", tz="UTC")),
            ("body", pa.string()),
            ("delay_ms", pa.int64()),
            ("ttl_ms", pa.int64()),
            ("message_id", pa.string()),
            ("group_id", pa.string()),
            ("headers", pa.string()),
            ("note", pa.string()),
        ]
    )
    pq.write_table(pa.Table.from_pydict(data, schema=schema), path)
    return [code for _, code in rows]


def test_import_into_a_real_server_then_rerun(
    spark: Any, make_server: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    server = make_server(TOKENS)
    _setup(server.url)
    stats = httpx.get(f"{server.url}/v1/stats", headers=ADMIN).json()
    scheduled_before = stats["messages"]["scheduled"]
    start = datetime.now(UTC).replace(microsecond=0)
    now_ms = int(start.timestamp() * 1000)
    expected = _input(tmp_path / "in.parquet", start)
    client = Client(server.url, token="alice-secret")
    request.addfinalizer(client.close)

    def run(rejects: str) -> Any:
        options = ImportOptions(
            input=tmp_path / "in.parquet",
            rejects_dir=tmp_path / rejects,
            mapping={"destination": "channel", "deliver_at": "send_time"},
            sink=SinkSettings(
                url=server.url, token="alice-secret", max_attempts=3, backoff_base_ms=20
            ),
            plan_dir=tmp_path / "plan",
        )
        return run_import(
            spark,
            options,
            now_ms=now_ms,
            resolve_views=lambda names: views_from_server(client, names),
        )

    summary = run("rejects")
    assert summary.rows_read == 15
    assert summary.ignored_columns == ["note"]
    assert summary.accepted == 4 and summary.created == 4 and summary.already_there == 0
    assert summary.duplicates == 1
    assert summary.copies == 5  # a.t fans out to a.s1 and a.s2
    assert summary.partitions == 2  # the hours of start + 1 h (r0, r12) and start + 2 h (r2, r14)
    want: dict[str, int] = {}
    for code in expected:
        if code not in (None, "duplicate"):
            want[code] = want.get(code, 0) + 1
    assert summary.rejected == want

    rejects = pq.read_table(tmp_path / "rejects").to_pylist()
    got = {r["row"]: r["code"] for r in rejects}
    assert got == {i: c for i, c in enumerate(expected) if c is not None}
    for reject in rejects:
        assert reject["message"] and reject["record"]
    by_row = {r["row"]: r for r in rejects}
    assert "repeats input row 0" in by_row[1]["message"]
    assert by_row[9]["message"].startswith("this token may not send to 'b.q'")

    with httpx.Client(base_url=server.url, headers=ADMIN) as http:
        copies = http.get("/v1/messages", params={"message_id": "r2"}).json()["items"]
        assert sorted((m["destination"], m["topic"]) for m in copies) == [
            ("a.s1", "a.t"),
            ("a.s2", "a.t"),
        ]
        assert copies[0]["deliver_at"] == now_ms + 2 * 3_600_000
        r0 = http.get("/v1/messages", params={"message_id": "r0"}).json()["items"]
        assert len(r0) == 1 and r0[0]["size"] == 0  # the first row won, not "again"
        scheduled = http.get("/v1/stats").json()["messages"]["scheduled"]
        assert scheduled - scheduled_before == 5  # r0, r12, r14 and r2's two copies

        plan = pq.read_table(tmp_path / "plan").to_pylist()
        assert sorted(r["queue"] for r in plan) == ["a.q", "a.q", "a.q", "a.s1", "a.s2"]

        again = run("rejects-2")  # the same import again: nothing new is stored
        assert again.created == 0 and again.already_there == 4
        assert again.rejected == summary.rejected
        assert http.get("/v1/stats").json()["messages"]["scheduled"] == scheduled


def test_cli_imports_csv(spark: Any, server: Any, tmp_path: Path) -> None:
    httpx.put(f"{server.url}/v1/queues/reminders").raise_for_status()
    (tmp_path / "in.csv").write_text(
        "who,when,text,extra\n"
        "reminders,2031-05-01T09:00:00Z,hello,x\n"
        "reminders,2031-05-01T09:30:00+00:00,again,x\n"
        "reminders,tomorrow,bad,x\n"
    )
    runner = CliRunner()
    result = runner.invoke(
        cli,
        [
            "pipeline",
            "import",
            str(tmp_path / "in.csv"),
            "--map",
            "destination=who,deliver_at=when",
            "--map",
            "body=text",
            "--to",
            server.url,
            "--rejects",
            str(tmp_path / "rej"),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert '"accepted": 2' in result.output and '"invalid_argument": 1' in result.output
    items = httpx.get(f"{server.url}/v1/messages", params={"destination": "reminders"}).json()
    assert [m["deliver_at"] for m in items["items"]] == [1935392400000, 1935394200000]

    refused = runner.invoke(cli, ["pipeline", "import", str(tmp_path / "in.csv")])
    assert refused.exit_code == 2 and "give --to URL" in refused.output
