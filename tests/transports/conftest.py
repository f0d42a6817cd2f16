"""A real RabbitMQ for each test: a fresh virtual host of its own (so names such as ``nsb.v2``
cannot collide with other tests or other users of the shared broker), deleted afterwards."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pika
import pytest


@dataclass
class Broker:
    vhost: str

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:5672/{quote(self.vhost, safe='')}"

    def blocking(self) -> pika.BlockingConnection:
        """A plain pika connection: the client of a user who knows nothing of tarry."""
        params = pika.URLParameters(self.url)
        return pika.BlockingConnection(params)

    def get(self, queue: str, timeout_s: float = 5.0) -> tuple[Any, Any, bytes]:
        """Plain pika ``basic.get`` until a message arrives: (method, properties, body)."""
        deadline = time.monotonic() + timeout_s
        with self.blocking() as connection:
            channel = connection.channel()
            while time.monotonic() < deadline:
                method, properties, body = channel.basic_get(queue, auto_ack=True)
                if method is not None:
                    return method, properties, body
                time.sleep(0.05)
        raise AssertionError(f"nothing arrived in {queue} within {timeout_s} s")

    def count(self, queue: str) -> int:
        with self.blocking() as connection:
            channel = connection.channel()
            return int(channel.queue_declare(queue, passive=True).method.message_count)


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def broker() -> Iterator[Broker]:
    if shutil.which("rabbitmqctl") is None:
        pytest.fail("rabbitmqctl is needed to give each RabbitMQ test its own virtual host")
    vhost = f"tarry-test-{uuid.uuid4().hex[:10]}"
    rabbitmqctl("add_vhost", vhost)
    try:
        rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        yield Broker(vhost)
    finally:
        rabbitmqctl("delete_vhost", vhost)


@pytest.fixture
async def make_engine(tmp_path):
    """A started engine on a real SQLite file and the real clock (RabbitMQ's clock is real)."""
    from tarry.config import load_config
    from tarry.engine.core import Engine

    engines = []

    async def factory(overrides):
        base = {"server": {"data_dir": str(tmp_path / f"data-{len(engines)}")}}
        base["journal"] = {"enabled": False}
        merged = {**base, **overrides}
        merged["server"] = {**base["server"], **overrides.get("server", {})}
        config = load_config(None, merged)
        engine = Engine.from_config(config)
        await engine.start()
        engines.append(engine)
        return engine

    yield factory
    for engine in engines:
        await engine.stop()
