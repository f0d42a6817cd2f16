"""Against a real `tarry serve` on the log store: damaged files are named, the rest is served,
garbage is never delivered; and the kill -9 crash test of bench/crash.py, short."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import httpx
import pytest

from tarry.store.log.layout import Layout
from tests.e2e.test_serve_and_crash import receive_all

SMALL_SEGMENTS = '[store]\nengine = "log"\nsegment_bytes = 4096\n'
BENCH = Path(__file__).resolve().parents[2] / "bench" / "crash.py"


def send_batch(url: str, count: int, delay_ms: int) -> dict[str, str]:
    with httpx.Client(base_url=url, timeout=30) as client:
        client.put("/v1/queues/q", json={}).raise_for_status()
        batch = [
            {"destination": "q", "body": f"{i:04d}" + "x" * 600, "delay_ms": delay_ms}
            for i in range(count)
        ]
        response = client.post("/v1/messages/batch", json={"messages": batch})
        response.raise_for_status()
        return {
            r["id"]: item["body"] for r, item in zip(response.json()["results"], batch, strict=True)
        }


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_flipped_byte_in_a_closed_segment_is_named_and_the_rest_is_delivered(
    make_server, tmp_path
) -> None:
    # Given 20 messages over several small segments, and a stopped server
    server = make_server(SMALL_SEGMENTS)
    sent = send_batch(server.url, 20, delay_ms=2500)
    server.stop()
    segments = sorted((server.data_dir / "log" / "parts").glob("p-*.seg-*.log"))
    assert len(segments) > 2
    # When a byte inside a message of the first (closed) segment is flipped and it restarts
    flip(segments[0], 200)
    server.start()
    # Then every undamaged message arrives intact, the damaged one never, and health names it
    got = receive_all(server.url, "q", len(sent) - 1, timeout_s=30)
    assert {m["id"]: m["body"] for m, _ in got}.items() <= sent.items()
    assert len(got) == len(sent) - 1
    health = httpx.get(server.url + "/healthz").json()
    assert health["status"] == "degraded"
    assert any(str(segments[0]) in line for line in health["damaged"])


def test_a_damaged_snapshot_part_is_named_and_everything_is_rebuilt_from_the_log(
    make_server,
) -> None:
    # Given messages held in an indexed partition, snapshotted at a clean stop
    server = make_server(SMALL_SEGMENTS)
    sent = send_batch(server.url, 20, delay_ms=1500)
    server.stop()
    parts = sorted((server.data_dir / "log" / "snapshots").glob("snap-*/part-*"))
    assert parts
    # When a byte of a snapshot part is flipped and the server restarts
    flip(parts[0], 0)
    server.start()
    # Then it names the part, and delivers everything from the log
    health = httpx.get(server.url + "/healthz").json()
    assert any(str(parts[0]) in line for line in health["damaged"])
    got = receive_all(server.url, "q", len(sent), timeout_s=30)
    assert sorted(m["id"] for m, _ in got) == sorted(sent)


def test_finding_09_damage_in_a_far_partition_is_reported_at_once_after_a_clean_restart(
    make_server,
) -> None:
    # Given messages due in one hour and in two (the later partition is read by nobody before
    # then: the dispatcher indexes only the earliest), and a clean stop
    server = make_server()
    sent = send_batch(server.url, 10, delay_ms=3_600_000)
    sent |= send_batch(server.url, 10, delay_ms=7_200_000)
    server.stop()
    assert (server.data_dir / "log" / "CLEAN").exists()  # the restart trusts the snapshot
    # (sorted by start: the later one is coarser, ``tarry.store.log.layout``)
    segments = sorted(
        (server.data_dir / "log" / "parts").glob("p*-*.seg-*.log"),
        key=lambda p: Layout.parse_segment(p.name) or (0, 0),
    )
    assert len({(Layout.parse_segment(p.name) or (0, 0))[0] for p in segments}) == 2
    segment = segments[-1]
    # When a byte inside one of those messages is flipped and the server starts again
    flip(segment, 300)
    server.start()
    # Then /healthz names the damaged file within a couple of seconds, and /metrics counts it
    deadline = time.monotonic() + 3
    while True:
        health = httpx.get(server.url + "/healthz").json()
        if health["damaged"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert health["status"] == "degraded", health
    assert [line for line in health["damaged"] if str(segment) in line], health
    metrics = httpx.get(server.url + "/metrics").text
    assert "tarry_store_damaged 1.0" in metrics.splitlines()
    # And the other messages are still kept
    stats = httpx.get(server.url + "/v1/stats").json()
    assert stats["messages"]["scheduled"] == len(sent)


@pytest.mark.slow
@pytest.mark.parametrize("plain", [False, True], ids=["message-ids", "plain"])
def test_kill_9_five_times_under_load_loses_nothing_and_duplicates_nothing(
    tmp_path, plain: bool
) -> None:
    """With ``message_id``s (resent batches de-duplicated) and without (plain messages: a batch
    left unanswered by a kill is not resent, so the check is that nothing comes twice)."""
    spec = importlib.util.spec_from_file_location("bench_crash", BENCH)
    assert spec is not None and spec.loader is not None
    crash = importlib.util.module_from_spec(spec)
    sys.modules["bench_crash"] = crash  # dataclasses look their module up while defining
    spec.loader.exec_module(crash)
    started = time.monotonic()
    result = crash.run(kills=5, data_dir=tmp_path, gap_s=(0.2, 0.8), max_delay_ms=1000, plain=plain)
    assert result["ok"], result
    assert result["accepted"] > 0 and result["received_distinct"] == result["accepted"]
    assert time.monotonic() - started < 100
