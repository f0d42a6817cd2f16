"""``tarry pipeline report`` over a small journal from two nodes, checked against numbers worked
out by hand (in the comments)."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tarry.cli.main import cli
from tarry.pipeline.analytics import report_tables, run_report

pytestmark = pytest.mark.spark

H0 = 1_800_000_000_000  # a whole hour
H = 3_600_000
NOW = H0 + 2 * H
KEYS = (
    "event time node id destination topic queue message_id correlation_id sent_at deliver_at "
    "expires_at size failures reason lateness_ms"
).split()


def line(event: str, time: int, mid: str, dest: str, deliver_at: int, node: str = "a") -> bytes:
    record: dict[str, Any] = dict.fromkeys(KEYS)
    late = event in ("released", "delivered", "received", "expired")
    record.update(
        event=event,
        time=time,
        node=node,
        id=mid,
        destination=dest,
        queue=dest,
        sent_at=H0,
        deliver_at=deliver_at,
        size=3,
        failures=0,
        lateness_ms=time - deliver_at if late else None,
    )
    return orjson.dumps(record) + b"\n"


def journals(root: Path) -> None:
    a = [
        # qa, hour H0: released with lateness 50, 200, 10 (m1, m2, m3) and 30 (m6, node b)
        line("scheduled", H0 + 1_000, "m1", "qa", H0 + 10_000),
        line("released", H0 + 10_050, "m1", "qa", H0 + 10_000),
        line("received", H0 + 10_500, "m1", "qa", H0 + 10_000),
        line("acked", H0 + 11_000, "m1", "qa", H0 + 10_000),
        line("scheduled", H0 + 2_000, "m2", "qa", H0 + 20_000),
        line("released", H0 + 20_200, "m2", "qa", H0 + 20_000),
        line("expired", H0 + 30_000, "m2", "qa", H0 + 20_000),
        line("scheduled", H0 + 3_000, "m3", "qa", H0 + 30_000),
        line("released", H0 + 30_010, "m3", "qa", H0 + 30_000),
        line("dead_lettered", H0 + 40_000, "m3", "qa", H0 + 30_000),
        line("scheduled", H0 + 4_000, "m4", "qa", H0 + 50_000),
        line("cancelled", H0 + 5_000, "m4", "qa", H0 + 50_000),
        # qb, hour H0 + 1 h: m5 released 1000 ms late and acked
        line("scheduled", H0 + H + 1_000, "m5", "qb", H0 + H + 2_000),
        line("released", H0 + H + 3_000, "m5", "qb", H0 + H + 2_000),
        line("received", H0 + H + 3_100, "m5", "qb", H0 + H + 2_000),
        line("acked", H0 + H + 3_200, "m5", "qb", H0 + H + 2_000),
    ]
    b = [
        line("scheduled", H0 + 500, "m6", "qa", H0 + 6_000, "b"),
        line("released", H0 + 6_030, "m6", "qa", H0 + 6_000, "b"),
        line("received", H0 + 6_100, "m6", "qa", H0 + 6_000, "b"),
        line("acked", H0 + 6_200, "m6", "qa", H0 + 6_000, "b"),
        # pending: m7 due in 90 s, m10 overdue, m11 due in 40 days (qa, hour H0)
        line("scheduled", H0 + 100, "m7", "qa", NOW + 90_000, "b"),
        line("scheduled", H0 + 200, "m10", "qa", NOW - 60_000, "b"),
        line("scheduled", H0 + 300, "m11", "qa", NOW + 40 * 24 * H, "b"),
        # pending in qb, hour H0 + 1 h: m8 due in 2 days 5 min; m9 moved to 30 min from now
        line("scheduled", H0 + H + 500, "m8", "qb", NOW + 48 * H + 300_000, "b"),
        line("scheduled", H0 + H + 600, "m9", "qb", NOW + 5 * H, "b"),
        line("rescheduled", H0 + H + 700, "m9", "qb", NOW + 1_800_000, "b"),
    ]
    (root / "node-a" / "journal").mkdir(parents=True)
    (root / "node-a" / "journal" / "journal-1-a.jsonl").write_bytes(b"".join(a))
    (root / "node-b").mkdir()
    torn = b'{"event":"acked","ti'  # a crash's torn last line: skipped, never half-read
    (root / "node-b" / "journal-2-b.jsonl.open").write_bytes(b"".join(b) + torn)


def test_report_numbers_match_the_hand_count(spark: Any, tmp_path: Path) -> None:
    journals(tmp_path)
    out = tmp_path / "out"
    paths = [tmp_path / "node-a" / "journal" / "journal-1-a.jsonl"]
    paths.append(tmp_path / "node-b" / "journal-2-b.jsonl.open")
    summary = run_report(spark, paths, out, now_ms=NOW)
    assert summary["events"] == 26 and summary["files"] == 2
    assert (summary["pending"], summary["overdue"]) == (5, 1)  # m7 m8 m9 m10 m11; m10

    hourly = {
        (r["destination"], r["hour_ms"]): r for r in pq.read_table(out / "hourly").to_pylist()
    }
    assert set(hourly) == {("qa", H0), ("qb", H0 + H)}
    qa = hourly["qa", H0]
    counts = {e: qa[e] for e in ("scheduled", "released", "received", "acked", "expired")}
    assert counts == {"scheduled": 8, "released": 4, "received": 2, "acked": 2, "expired": 1}
    assert (qa["dead_lettered"], qa["cancelled"], qa["cancellations"]) == (1, 1, 1)
    # lateness of the releases, sorted: 10, 30, 50, 200 → nearest rank p50 = 2nd, p95 = p99 = 4th
    late = [qa[f"lateness_{p}_ms"] for p in ("p50", "p95", "p99", "max")]
    assert late == [30, 200, 200, 200]
    # ended in that hour: 2 acked + 1 expired + 1 dead-lettered + 1 cancelled = 5
    assert (qa["ended"], qa["expiry_rate"], qa["dead_letter_rate"]) == (5, 0.2, 0.2)
    qb = hourly["qb", H0 + H]
    assert (qb["scheduled"], qb["released"], qb["acked"], qb["rescheduled"]) == (3, 1, 1, 1)
    assert [qb[f"lateness_{p}_ms"] for p in ("p50", "p95", "p99", "max")] == [1000] * 4
    assert (qb["expiry_rate"], qb["dead_letter_rate"]) == (0.0, 0.0)

    minute = pq.read_table(out / "forecast_minute").to_pylist()
    assert minute == [
        {"minute_ms": NOW + 60_000, "due": 1},
        {"minute_ms": NOW + 1_800_000, "due": 1},
    ]
    hour = pq.read_table(out / "forecast_hour").to_pylist()
    assert hour == [{"hour_ms": NOW, "due": 2}, {"hour_ms": NOW + 48 * H, "due": 1}]
    outcomes = {r["event"]: r["count"] for r in pq.read_table(out / "outcomes").to_pylist()}
    assert outcomes == {
        "scheduled": 11,
        "released": 5,
        "received": 3,
        "acked": 3,
        "expired": 1,
        "dead_lettered": 1,
        "cancelled": 1,
        "rescheduled": 1,
    }
    lateness = pq.read_table(out / "lateness").to_pylist()
    assert [(r["hour_ms"], r["lateness_max_ms"], r["releases"]) for r in lateness] == [
        (H0, 200, 4),
        (H0 + H, 1000, 1),
    ]

    html = (out / "report.html").read_text()
    assert html.count("<svg") == 4 and "http://" not in html.replace("http://www.w3.org", "")
    assert "<script" not in html and "qa" in html


def test_cli_report_reads_data_directories(spark: Any, tmp_path: Path) -> None:
    journals(tmp_path)
    result = CliRunner().invoke(
        cli,
        [
            "pipeline",
            "report",
            "--data",
            str(tmp_path / "node-a"),
            "--journal",
            str(tmp_path / "node-b"),
            "--out",
            str(tmp_path / "out"),
            "--now",
            str(NOW),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert '"events": 26' in result.output and '"pending": 5' in result.output
    empty = CliRunner().invoke(
        cli, ["pipeline", "report", "--journal", str(tmp_path / "out"), "--out", str(tmp_path)]
    )
    assert empty.exit_code == 2 and "no journal files found" in empty.output


def test_forecast_edges_follow_due_times_not_minute_buckets(spark: Any, tmp_path: Path) -> None:
    # Given "now" in the middle of a minute, and pending messages on either side of each edge
    now = NOW + 30_000
    day, month = 24 * H, 30 * 24 * H
    dues = {
        "p1": now - 10_000,  # overdue, in now's minute
        "p2": now + 10_000,  # in now's minute, ahead
        "p3": now + day - 5_000,  # the last minute of the 24 h
        "p4": now + day + 5_000,  # the same minute, past the 24 h: hours only
        "p7": now + month - 1_000,  # the last hour of the 30 days
        "p8": now + month,  # the same hour, past the 30 days: nowhere
    }
    lines = [line("scheduled", H0, mid, "qa", due) for mid, due in dues.items()]
    # p5: rescheduled twice in one millisecond: the greater due time counts, as ties always did
    lines += [line("scheduled", H0, "p5", "qa", now + 5 * H)]
    lines += [line("rescheduled", H0 + 9, "p5", "qa", due) for due in (NOW + 2 * H, NOW + 3 * H)]
    # p6: pending without a due time: counted as pending, in no forecast
    lines.append(
        line("scheduled", H0, "p6", "qa", 0).replace(b'"deliver_at":0', b'"deliver_at":null')
    )
    path = tmp_path / "journal-1-a.jsonl"
    path.write_bytes(b"".join(lines))
    keys = ("spark.sql.inMemoryColumnarStorage.compressed", "spark.sql.files.minPartitionNum")
    before = {key: spark.conf.get(key, None) for key in keys}

    # When the report runs
    summary = run_report(spark, [path], tmp_path / "out", now_ms=now)

    # Then each message is counted by its due time against the 24 h and 30 day windows
    assert (summary["pending"], summary["overdue"]) == (8, 1)
    minute = pq.read_table(tmp_path / "out" / "forecast_minute").to_pylist()
    assert minute == [
        {"minute_ms": NOW, "due": 1},
        {"minute_ms": NOW + 3 * H, "due": 1},
        {"minute_ms": NOW + day, "due": 1},
    ]
    hour = pq.read_table(tmp_path / "out" / "forecast_hour").to_pylist()
    assert hour == [
        {"hour_ms": NOW, "due": 1},
        {"hour_ms": NOW + 3 * H, "due": 1},
        {"hour_ms": NOW + day, "due": 2},
        {"hour_ms": NOW + month, "due": 1},
    ]
    # and the session's settings are as they were
    assert {key: spark.conf.get(key, None) for key in keys} == before


def nearest_rank(values: list[int], p: float) -> int:
    """The smallest value with at least p of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p * len(ordered))) - 1]


def test_percentiles_are_exact_nearest_rank_for_large_groups_with_ties(spark: Any) -> None:
    # Two destinations in one hour, one of them with 30,000 releases (beyond what an approximate
    # percentile keeps exactly), many ties and a long tail; releases without a lateness and other
    # kinds of event count but take no part in the percentiles; a null destination is a group.
    rng = random.Random(5)
    rows: list[tuple[int, int, str, str | None, int, int | None]] = []
    latenesses: dict[str | None, list[int]] = {"qa": [], "qb": [], None: []}
    for destination, count in (("qa", 30_000), ("qb", 7), (None, 3)):
        for i in range(count):
            late = int(rng.expovariate(1 / 20)) if i % 100 else rng.randrange(5_000, 90_000)
            step = 3 if i % 2 else 4  # released, delivered
            rows.append((step, H0 + i, f"{destination}-{i}", destination, H0, late))
            latenesses[destination].append(late)
    rows.append((3, H0 + 1, "x", "qa", H0, None))  # a release with no lateness: not a rank
    rows.append((0, H0 + 2, "y", "qa", H0, None))  # scheduled
    events = spark.createDataFrame(
        rows,
        "step byte, time long, id string, destination string, deliver_at long, lateness_ms long",
    )
    tables = report_tables(events, now_ms=NOW)
    hourly = {r["destination"]: r for r in _collect(tables["hourly"])}
    for destination, values in latenesses.items():
        got = hourly[destination]
        expected = [nearest_rank(values, p) for p in (0.5, 0.95, 0.99)] + [max(values)]
        assert [got[f"lateness_{p}_ms"] for p in ("p50", "p95", "p99", "max")] == expected
        assert got["releases"] == len(values)
    assert hourly["qa"]["released"] == 15_001 and hourly["qa"]["scheduled"] == 1
    (overall,) = _collect(tables["lateness"])
    everything = [v for values in latenesses.values() for v in values]
    expected = [nearest_rank(everything, p) for p in (0.5, 0.95, 0.99)] + [max(everything)]
    assert [overall[f"lateness_{p}_ms"] for p in ("p50", "p95", "p99", "max")] == expected
    assert overall["releases"] == len(everything)


def _collect(frame: Any) -> list[dict[str, Any]]:
    return [row.asDict() for row in frame.collect()]
