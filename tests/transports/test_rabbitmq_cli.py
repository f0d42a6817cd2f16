"""``tarry rabbitmq declare|bind|send`` against the real RabbitMQ (the command as users run it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.transports.conftest import Broker

pytestmark = pytest.mark.rabbitmq


def tarry(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tarry.cli.main", "rabbitmq", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_declare_bind_and_send_from_the_command_line(broker: Broker) -> None:
    url = ["--url", broker.url, "--prefix", "cli"]
    # Given the topology, declared twice (idempotent), and an endpoint queue bound to it
    for _ in range(2):
        declared = tarry("declare", *url, "--queue-type", "classic")
        assert declared.returncode == 0, declared.stderr
    assert json.loads(declared.stdout)["max_delay_s"] == (1 << 28) - 1
    with broker.blocking() as connection:
        connection.channel().queue_declare("shipping", durable=True)
    bound = tarry("bind", "shipping", *url)
    assert bound.returncode == 0, bound.stderr
    assert json.loads(bound.stdout)["key"] == "#.shipping"

    # When a message is sent with a 37 s delay
    sent = tarry("send", "shipping", "parcel", "--delay", "37s", "-H", "k=v", *url)
    assert sent.returncode == 0, sent.stderr
    # Then it waits in level 5, then 2, then 0 (37 = 32 + 4 + 1) and sits in level 5 now
    out = json.loads(sent.stdout)
    assert out["exchange"] == "cli.delay-level-05"
    assert out["routing_key"] == "0." * 22 + "1.0.0.1.0.1.shipping"
    assert out["waits_in"] == ["cli.delay-level-05", "cli.delay-level-02", "cli.delay-level-00"]
    assert broker.count("cli.delay-level-05") == 1

    # And the errors have their codes and exit statuses
    too_long = tarry("send", "shipping", "x", "--delay", f"{1 << 28}s", *url)
    assert too_long.returncode == 2 and too_long.stderr.startswith("invalid_argument:")
    missing = tarry("bind", "ghost", *url)
    assert missing.returncode == 1 and missing.stderr.startswith("unknown_destination:")
    other_type = tarry("declare", *url, "--queue-type", "quorum")
    assert other_type.returncode == 1 and other_type.stderr.startswith("precondition_failed:")
    away = tarry("declare", "--url", "amqp://guest:guest@127.0.0.1:1/", "--prefix", "x")
    assert away.returncode == 3 and away.stderr.startswith("unavailable:")
