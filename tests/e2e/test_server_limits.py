"""The server against big bodies, many sockets and silent clients, and serving TLS: a real
`tarry serve` subprocess, real sockets (issue 26, findings 6, 7 and 11's TLS half)."""

from __future__ import annotations

import asyncio
import os
import resource
import select
import socket
import ssl
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

import tarry
from tarry.config import load_config
from tarry.errors import InvalidArgument
from tarry.server.auth import check_bind_safety

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


def test_finding_06_a_million_item_batch_is_refused_before_its_items_are_built(server) -> None:
    pid = _pid(server)
    item = b'{"destination":"q","body":"x","delay_ms":1000}'
    body = b'{"messages":[' + b",".join([item] * 1_000_000) + b"]}"
    before = _rss_mb(pid)
    response = httpx.post(f"{server.url}/v1/messages/batch", content=body, timeout=60)
    grown = _rss_mb(pid) - before
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_argument" and error["max_batch"] == 10_000
    assert "got 1000000" in error["message"]
    # The body itself is read (47 MB); its million items built would take ~600 MB. Freed heap
    # is not always handed back to the system at once, so allow the body twice, not once.
    body_mb = len(body) / MB
    assert grown < 2 * body_mb, (
        f"the server's RSS grew by {grown:.0f} MB to refuse a {body_mb:.0f} MB batch"
    )
    # A batch within max_batch still works, with its commas and nested objects.
    queue = httpx.put(f"{server.url}/v1/queues/q")
    assert queue.status_code == 201
    ok = b'{"destination":"q","body":"a,b","delay_ms":1000,"headers":{"k":"v","l":"w"}}'
    accepted = httpx.post(
        f"{server.url}/v1/messages/batch",
        content=b'{"messages":[' + b",".join([ok] * 10_000) + b"]}",
        timeout=60,
    )
    assert accepted.status_code == 200
    assert all("id" in result for result in accepted.json()["results"])


def _raise_own_fd_limit(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _healthz_ms(url: str) -> float:
    """One ``GET /healthz`` on a fresh connection, in ms: connect, request, the whole answer.
    A bare socket, so the time is the server's and the network's: a new ``httpx.Client`` per
    probe spends tens of ms of this process's CPU building its TLS context first, which on a
    loaded machine alone passed 100 ms."""
    started = time.perf_counter()
    with socket.create_connection(_address(url), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: tarry\r\nconnection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    elapsed = (time.perf_counter() - started) * 1000
    if not answer.startswith(b"HTTP/1.1 200 "):
        raise httpx.RemoteProtocolError(f"/healthz answered {answer[:80]!r}")
    return elapsed


def _healthz_median_ms(url: str, *, probes: int = 9) -> tuple[float, list[float]]:
    times = [_healthz_ms(url) for _ in range(probes)]
    return statistics.median(times), times


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
    began = time.monotonic()
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            # From 127.0.0.2, its port chosen at connect: the sockets take no port of 127.0.0.1,
            # which a test running beside this one (scripts/test runs two) may have picked as
            # free and be about to listen on.
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_BIND_ADDRESS_NO_PORT, 1)
            sock.bind(("127.0.0.2", 0))
            try:
                sock.connect((host, port))
            except BlockingIOError:
                pass
            sockets.append(sock)
        # Timed from here: opening the sockets is this process's work (about 4 ms each on a
        # machine with a load of 9 on 2 cores), not the server's.
        started = time.monotonic()
        # The server works through its accept backlog; then a fresh client must be served fast.
        deadline = time.monotonic() + 30
        while True:
            try:
                _healthz_ms(server.url)
                break
            except (httpx.HTTPError, OSError):
                assert time.monotonic() < deadline, f"/healthz never answered{note}"
        median, times = _healthz_median_ms(server.url)
        if median >= 100:
            # Once more after a pause: a neighbour's burst of CPU on a shared machine can
            # slow one series; a server stalled by its sockets (the finding) stays slow.
            time.sleep(1)
            median, times = _healthz_median_ms(server.url)
        print(
            f"{count} idle sockets{note} (opened in {started - began:.1f} s): /healthz median "
            f"{median:.1f} ms, max {max(times):.1f} ms of {[round(t, 1) for t in times]}; "
            f"{len(server.stderr_lines)} log lines"
        )
        assert median < 100, f"/healthz took {times} ms{note}"
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
    # A prompt client is not affected, nor a request running past the deadline, pipelined
    # behind another or not.
    assert httpx.put(f"{server.url}/v1/queues/idle").status_code == 201
    waiting = b'POST /v1/queues/idle/receive HTTP/1.1\r\nhost: tarry\r\ncontent-length: 16\r\n\r\n{"wait_ms":2000}'
    with socket.create_connection(address) as pipelined:
        pipelined.sendall(b"GET /healthz HTTP/1.1\r\nhost: tarry\r\n\r\n" + waiting)
        pipelined.settimeout(10)
        answered = b""
        while answered.count(b"HTTP/1.1 200 ") < 2 or not answered.endswith(b'{"messages":[]}'):
            chunk = pipelined.recv(65536)
            assert chunk, f"closed while a request ran: {answered!r}"
            answered += chunk
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    assert sum("(header_timeout;" in line for line in server.stderr_lines) == 1, "one log line"


@pytest.mark.parametrize("parser", ["h11", "httptools"])
def test_finding_07_a_request_head_over_max_header_bytes_gets_400(make_server, parser) -> None:
    if parser == "httptools":
        pytest.importorskip("httptools", reason="tarry[fast] is not installed")
    server = make_server(f'[server]\nmax_header_bytes = 4096\nhttp_parser = "{parser}"\n')
    assert any(f"HTTP parser {parser}" in line for line in server.stderr_lines)
    with socket.create_connection(_address(server.url), timeout=10) as sock:
        # A head that has not ended after 5 KiB: refused without waiting for the rest.
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: tarry\r\nx-big: " + b"y" * 5120)
        head = _response(sock, timeout=5)
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    assert sum("(bad_request_head;" in line for line in server.stderr_lines) == 1


def _self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def _tarry(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tarry.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "TARRY_CA"},
    )


def test_finding_11_tls_serves_https_to_clients_that_trust_the_certificate(
    make_server, tmp_path: Path
) -> None:
    cert, key = _self_signed(tmp_path)
    server = make_server(f'[server]\ntls_cert = "{cert}"\ntls_key = "{key}"\n')
    assert server.url.startswith("https://127.0.0.1:")
    trusted = ssl.create_default_context(cafile=str(cert))
    assert httpx.get(f"{server.url}/healthz", verify=trusted).status_code == 200
    with pytest.raises(httpx.ConnectError):  # not trusted without the CA
        httpx.get(f"{server.url}/healthz")
    with pytest.raises(httpx.HTTPError):  # plain HTTP is not served
        httpx.get(server.url.replace("https://", "http://") + "/healthz")
    queue = _tarry("--url", server.url, "--ca", str(cert), "queue", "declare", "tls.q")
    assert queue.returncode == 0, queue.stderr
    sent = _tarry("--url", server.url, "--ca", str(cert), "send", "tls.q", "hello")
    assert sent.returncode == 0, sent.stderr
    untrusted = _tarry("--url", server.url, "send", "tls.q", "hello")
    assert untrusted.returncode == 3 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    with tarry.Client(server.url, ca=cert) as client:
        assert client.get_queue("tls.q").ready == 1

    async def over_async() -> int:
        async with tarry.AsyncClient(server.url, ca=cert) as client:
            return (await client.get_queue("tls.q")).ready

    assert asyncio.run(over_async()) == 1


def test_finding_11_tokens_beyond_loopback_need_tls_or_an_explicit_waiver(tmp_path: Path) -> None:
    tokens = {"auth": {"tokens": [{"token": "secret", "admin": ["*"]}]}}
    exposed = load_config(None, {"server": {"host": "0.0.0.0"}, **tokens})
    with pytest.raises(InvalidArgument, match="tls_cert"):
        check_bind_safety(exposed)
    waived = load_config(None, {"server": {"host": "0.0.0.0", "allow_plaintext": True}, **tokens})
    check_bind_safety(waived)
    cert, key = _self_signed(tmp_path)
    tls = {"host": "0.0.0.0", "tls_cert": str(cert), "tls_key": str(key)}
    check_bind_safety(load_config(None, {"server": tls, **tokens}))
    with pytest.raises(InvalidArgument, match="tls_key"):
        load_config(None, {"server": {"tls_cert": str(cert)}})
    # The server itself refuses to start that way.
    config = tmp_path / "exposed.toml"
    config.write_text('[server]\nhost = "0.0.0.0"\n[[auth.tokens]]\ntoken = "secret"\n')
    started = _tarry("serve", "--port", "0", "--data", str(tmp_path / "d"), "--config", str(config))
    assert started.returncode != 0 and "invalid_argument" in started.stderr
    assert "tls_cert" in started.stderr
