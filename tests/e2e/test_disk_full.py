"""A real `tarry serve` whose data directory is a 20 MB tmpfs: the disk fills up, producers are
refused (503, nothing stored) and /healthz says why from the first refusal; once space is freed
sends are accepted again within 2 s, without a restart, and every acknowledged message is
delivered once.

Mounting needs root (or CAP_SYS_ADMIN): where it is refused the test skips loudly, and fails
under ``TARRY_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tarry.errors import Unavailable
from tarry.model.ids import IdGenerator
from tarry.model.message import Message
from tarry.store.log import LogStore
from tarry.store.log.tools import verify
from tests.conftest import REQUIRE_SERVICES
from tests.e2e.test_serve_and_crash import receive_all

# What the filler frees must outlast what the server writes once it heals: the consumer's
# receive and ack rewrite each SQLite row, body included, into the WAL, and the journal writes
# the lines it buffered. With 12 MB freed of 20 the SQLite case filled the disk again.
DISK_MB = 40
FILLER_MB = 32
BODY_BYTES = 20_000


@pytest.fixture
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh tmpfs of ``DISK_MB`` (or the size its indirect parameter asks for), unmounted
    afterwards (request it before ``make_server``, so the servers on it stop first)."""
    size_mb = getattr(request, "param", DISK_MB)
    mount = tmp_path / "disk"
    mount.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mount)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=30)
        refusal = result.stderr.strip() if result.returncode else None
    except OSError as exc:
        refusal = str(exc)
    if refusal is not None:
        message = f"cannot mount a {size_mb} MB tmpfs (needs root or CAP_SYS_ADMIN): {refusal}"
        if REQUIRE_SERVICES:
            pytest.fail(f"TARRY_REQUIRE_SERVICES=1 and {message}", pytrace=False)
        pytest.skip(f"SKIPPED LOUDLY: {message}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _send(client: httpx.Client, number: int) -> httpx.Response:
    # Every other message waits a little in the store; the rest go to the queue at once.
    return client.post(
        "/v1/messages",
        json={
            "destination": "q",
            "body": f"{number:06d}" + "x" * BODY_BYTES,
            "delay_ms": 300 if number % 2 else 0,
        },
    )


@pytest.mark.parametrize("engine", ["log", "sqlite"])
def test_finding_08_a_full_disk_heals_without_a_restart_and_loses_nothing(
    small_disk: Path, make_server, engine: str
) -> None:
    # Given a server on a small disk, a filler file taking FILLER_MB of it
    filler = small_disk / "filler"
    filler.write_bytes(bytes(FILLER_MB * 1024 * 1024))
    server = make_server(data_dir=small_disk / "data", args=["--store", engine])
    acked: dict[str, int] = {}
    refusals: list[httpx.Response] = []
    with httpx.Client(base_url=server.url, timeout=30) as client:
        client.put("/v1/queues/q", json={}).raise_for_status()
        # When producers send until the disk is full
        number = 0
        first_health = None
        while len(refusals) < 5 and number < 2_000:
            response = _send(client, number)
            if response.status_code == 201:
                acked[response.json()["id"]] = number
            else:
                refusals.append(response)
                if first_health is None:
                    first_health = client.get("/healthz").json()
            number += 1
        # Then each refusal is a 503 unavailable saying why, and health is degraded at once
        assert acked and len(refusals) == 5, (len(acked), number)
        for refused in refusals:
            assert refused.status_code == 503
            error = refused.json()["error"]
            assert error["code"] == "unavailable"
            assert "disk full" in error["message"] and "retry later" in error["message"]
        assert first_health is not None
        assert first_health["status"] == "degraded", first_health
        assert "store" in first_health["open"]
        assert "disk full" in first_health["reasons"]["store"]
        # When space is freed
        filler.unlink()
        freed = time.monotonic()
        while True:
            response = _send(client, number)
            if response.status_code == 201:
                break
            assert time.monotonic() - freed < 2, response.text
            time.sleep(0.05)
        # Then sends are accepted again within 2 s, and the store breaker closes
        accepted_after_s = time.monotonic() - freed
        acked[response.json()["id"]] = number
        for extra in range(number + 1, number + 20):
            response = _send(client, extra)
            assert response.status_code == 201, response.text
            acked[response.json()["id"]] = extra
        deadline = time.monotonic() + 5
        while client.get("/healthz").json()["status"] != "ok":
            assert time.monotonic() < deadline, client.get("/healthz").json()
            time.sleep(0.1)
    # And every acknowledged message is delivered, none twice, and no refused one
    got = receive_all(server.url, "q", len(acked), timeout_s=60)
    ids = [m["id"] for m, _ in got]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(acked)
    assert sorted(int(m["body"][:6]) for m, _ in got) == sorted(acked.values())
    assert receive_all(server.url, "q", 1, timeout_s=1) == []
    print(
        f"{engine}: {len(acked)} acknowledged, {len(refusals)} refused, accepted again "
        f"{accepted_after_s:.2f} s after space was freed"
    )


_ids, _NOW = IdGenerator(), 1_700_000_000_000


def message(number: int) -> Message:
    """A message of about 50 KB due in a minute, its number at the start of its body."""
    return Message(
        id=_ids.new_due(_NOW, _NOW + 60_000),
        destination="q",
        body=f"{number:06d}".encode() + bytes(50_000),
        headers={},
        sent_at_ms=_NOW,
        deliver_at_ms=_NOW + 60_000,
        expires_at_ms=None,
        updated_at_ms=_NOW,
    )


async def fill(store: LogStore) -> list[str]:
    """Store messages one at a time until the disk refuses one; the ids kept."""
    kept: list[str] = []
    with pytest.raises(Unavailable, match="disk full"):
        for number in range(1_000):
            kept.append((await store.store([message(number)]))[0].message.id)
    assert kept
    return kept


@pytest.mark.parametrize("small_disk", [4], indirect=True)
async def test_finding_08_a_failed_append_is_cut_back_and_the_next_one_succeeds(
    small_disk: Path,
) -> None:
    """The log store alone: a write that fills the disk fails with ``StorageFault``, leaves no
    partial record behind once space is back, and the store writes again without reopening."""
    # Given a log store on a 4 MB disk, a filler file taking 3 MB of it (freed, it leaves room
    # for the partition's copy of what the write-ahead log holds)
    filler = small_disk / "filler"
    filler.write_bytes(bytes(3 * 1024 * 1024))
    root = small_disk / "log"
    store = LogStore(root, fsync="always")
    await store.open()
    # When messages are stored until the disk is full
    kept = await fill(store)
    [partition] = store.partitions.values()
    assert partition.sizes == partition.written  # the failed reservation was given back
    # Then once space is freed the next append succeeds, right after the last good record
    filler.unlink()
    store.files.flush()  # what the WAL holds, written to the partition behind it
    [segment] = sorted((root / "parts").glob("p-*.seg-*.log"))
    later = message(999)
    await store.store([later])
    store.files.flush()
    assert segment.stat().st_size == sum(partition.written)
    assert await store.count_scheduled() == len(kept) + 1
    # And a restart that checks every file finds exactly those records, and no damage
    await store.close()
    (root / "CLEAN").unlink()
    assert verify(root)["problems"] == []
    store = LogStore(root)
    await store.open()
    assert await store.count_scheduled() == len(kept) + 1
    assert await store.check() == []
    await store.close()


@pytest.mark.parametrize("small_disk", [2], indirect=True)
async def test_finding_08_a_store_closed_on_a_full_disk_reopens_sound(small_disk: Path) -> None:
    # Given a log store whose disk is full after a refused append
    filler = small_disk / "filler"
    filler.write_bytes(bytes(1024 * 1024))
    root = small_disk / "log"
    store = LogStore(root, fsync="always")
    await store.open()
    kept = await fill(store)
    with contextlib.suppress(Unavailable):
        await store.probe()  # cuts the failed append back
    top_up = small_disk / "top-up"  # and what that freed is taken too
    fd = os.open(top_up, os.O_WRONLY | os.O_CREAT)
    with pytest.raises(OSError):
        while True:
            os.write(fd, bytes(4096))
    os.close(fd)
    # When it is closed there (its final snapshot cannot be written) and opened again
    await store.close()
    assert not (root / "CLEAN").exists()  # so the next start checks every file
    filler.unlink()
    top_up.unlink()
    store = LogStore(root)
    await store.open()
    # Then it holds exactly what it acknowledged, undamaged, and takes writes
    assert await store.count_scheduled() == len(kept)
    await store.store([message(999)])
    assert await store.check() == []
    await store.close()
    assert verify(root)["problems"] == []
