"""The server against big bodies, many sockets and silent clients, and serving TLS: a real
`tarry serve` subprocess, real sockets (issue 26, findings 6, 7 and 11's TLS half)."""

from __future__ import annotations

import resource
import select
import socket
import statistics
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

MB = 1024 * 1024


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/<pid>/status")


def _response(sock: socket.socket, *, timeout: float) -> bytes:
    """What the server answered before ``timeout`` (b"" if nothing)."""
    sock.settimeout(timeout)
    received = b""
    try:
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    except TimeoutError:
        pass
    return received


def _pid(server) -> int:  # type: ignore[no-untyped-def]
    assert server.process is not None
    return int(server.process.pid)


def test_finding_06_a_100_mb_post_is_refused_from_its_content_length_unread(server) -> None:
    pid = _pid(server)
    before = _rss_mb(pid)
    with socket.create_connection(_address(server.url), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/messages HTTP/1.1\r\nhost: tarry\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % (100 * MB)
        )
        head = _response(sock, timeout=5)
        assert head.startswith(b"HTTP/1.1 413 "), f"no 413 before the body was sent: {head!r}"
        assert b"connection: close" in head.lower()
        # The client sends the body anyway: the server has closed, so little of it gets in.
        sent = 0
        chunk = b"x" * MB
        try:
            while sent < 100 * MB:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
    assert sent < 100 * MB, "the server kept reading a body it had refused"
    grown = _rss_mb(pid) - before
    assert grown < 50, f"the server's RSS grew by {grown:.0f} MB for a refused body"
    assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_finding_06_a_chunked_body_is_refused_once_it_passes_the_limit(server) -> None:
    pid = _pid(server)
    before = _rss_mb(pid)
    limit = 6 * 4 * MB + 64 * 1024  # 6 x max_message_bytes + the envelope allowance
    with socket.create_connection(_address(server.url), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/messages HTTP/1.1\r\nhost: tarry\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        # Exactly one byte over the limit and no end: a server that reads to the end waits.
        sent, piece = 0, 64 * 1024
        while sent <= limit:
            size = min(piece, limit + 1 - sent)
            sock.sendall(b"%x\r\n%s\r\n" % (size, b"x" * size))
            sent += size
        head = _response(sock, timeout=5)
    assert head.startswith(b"HTTP/1.1 413 "), f"no 413 for a streamed body: {head[:200]!r}"
    assert b"connection: close" in head.lower()

    # 100 MB streamed without a length: the server stops taking it soon after the limit.
    with socket.create_connection(_address(server.url), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/messages HTTP/1.1\r\nhost: tarry\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        streamed = _stream_until_refused(sock, total=100 * MB)
    assert streamed < 100 * MB, "the server kept reading a streamed body past its limit"
    grown = _rss_mb(pid) - before
    assert grown < 50, f"the server's RSS grew by {grown:.0f} MB for refused streamed bodies"
    assert sum("(body_too_large;" in line for line in server.stderr_lines) == 1, "one log line"


def _stream_until_refused(sock: socket.socket, *, total: int) -> int:
    """Send up to ``total`` body bytes in 1 MB chunks until the server answers or closes;
    how many were sent."""
    chunk = b"x" * MB
    frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    sent = 0
    try:
        while sent < total:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            sock.sendall(frame)
            sent += len(chunk)
    except OSError:
        pass
    return sent


def _raise_own_fd_limit(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _healthz_ms(url: str) -> float:
    """One ``GET /healthz`` on a fresh connection, in ms."""
    started = time.perf_counter()
    response = httpx.get(f"{url}/healthz", timeout=10)
    assert response.status_code == 200
    return (time.perf_counter() - started) * 1000


@pytest.mark.slow
def test_finding_07_twenty_thousand_idle_sockets_neither_hang_the_server_nor_flood_its_log(
    make_server,
) -> None:
    wanted = 20_000
    # The test process's own files (pytest, the server's pipes) need some of its descriptors.
    allowed = _raise_own_fd_limit(wanted + 200) - 200
    count = min(wanted, allowed)
    note = "" if count == wanted else f" (only {count}: this process's hard RLIMIT_NOFILE)"
    # The server starts with the usual soft limit of 1024 open files (hard limit unchanged),
    # which 20,000 sockets exceed unless it raises the limit and caps its connections.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        server = make_server()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    host, port = _address(server.url)
    started = time.monotonic()
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect((host, port))
            except BlockingIOError:
                pass
            sockets.append(sock)
        # The server works through its accept backlog; then a fresh client must be served fast.
        deadline = time.monotonic() + 30
        while True:
            try:
                _healthz_ms(server.url)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, f"/healthz never answered{note}"
        times = [_healthz_ms(server.url) for _ in range(5)]
        print(f"{count} idle sockets{note}: /healthz {[round(t, 1) for t in times]} ms")
        assert statistics.median(times) < 100, f"/healthz took {times} ms{note}"
    finally:
        for sock in sockets:
            sock.close()
    assert time.monotonic() - started < 60
    assert _healthz_ms(server.url) < 1000
    lines = len(server.stderr_lines)
    assert lines < 50, f"{lines} log lines for {count} idle sockets{note}:\n" + "".join(
        server.stderr_lines[-10:]
    )
    assert any("(connection_cap;" in line for line in server.stderr_lines)


def _closed_within(sock: socket.socket, seconds: float, *, dribble: bytes = b"") -> float:
    """Seconds until the server closed ``sock`` (sending ``dribble`` a byte at a time)."""
    started = time.monotonic()
    sock.settimeout(0.2)
    sent = 0
    while time.monotonic() - started < seconds:
        try:
            if not sock.recv(4096):
                return time.monotonic() - started
        except TimeoutError:
            pass
        except ConnectionResetError:
            return time.monotonic() - started
        if sent < len(dribble):
            try:
                sock.send(dribble[sent : sent + 1])
            except OSError:
                return time.monotonic() - started
            sent += 1
    raise AssertionError(f"the connection was still open after {seconds} s")


def test_finding_07_a_connection_without_a_request_head_is_closed_after_the_header_timeout(
    make_server,
) -> None:
    server = make_server("[server]\nheader_timeout_ms = 1000\nkeep_alive_ms = 30000\n")
    address = _address(server.url)
    with socket.create_connection(address) as silent:
        assert 0.8 < _closed_within(silent, 10) < 5
    slow_head = b"GET /healthz HTTP/1.1\r\nhost: tarry\r\n" + b"x-slow: " + b"y" * 100
    with socket.create_connection(address) as slow:
        assert 0.8 < _closed_within(slow, 10, dribble=slow_head) < 5
    # After a response, the next request's head is held to the same deadline.
    with socket.create_connection(address) as kept:
        kept.sendall(b"GET /healthz HTTP/1.1\r\nhost: tarry\r\n\r\n")
        assert _response(kept, timeout=5).startswith(b"HTTP/1.1 200 ")
        time.sleep(0.2)  # the rest of the response
        kept.settimeout(0)
        try:
            kept.recv(65536)
        except BlockingIOError:
            pass
        assert _closed_within(kept, 10, dribble=slow_head) < 5
    # A prompt client is not affected.
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    assert sum("(header_timeout;" in line for line in server.stderr_lines) == 1, "one log line"


def test_finding_07_a_request_head_over_max_header_bytes_gets_400(make_server) -> None:
    server = make_server("[server]\nmax_header_bytes = 4096\n")
    with socket.create_connection(_address(server.url), timeout=10) as sock:
        # A head that has not ended after 5 KiB: refused without waiting for the rest.
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: tarry\r\nx-big: " + b"y" * 5120)
        head = _response(sock, timeout=5)
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    assert sum("(bad_request_head;" in line for line in server.stderr_lines) == 1
