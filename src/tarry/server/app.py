"""The composition root: builds the engine from the configuration, mounts the routes, and runs
uvicorn on a socket it binds itself (so ``--port 0`` works and the chosen port is printed)."""

from __future__ import annotations

import gc
import logging
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
import uvicorn
from fastapi import FastAPI

import tarry
from tarry.config import TarryConfig
from tarry.engine.api import EngineAPI
from tarry.server.auth import check_bind_safety
from tarry.server.diagnostics import install_stack_dump
from tarry.server.errors import install_error_handlers
from tarry.server.metrics import Metrics
from tarry.server.openapi import install_openapi
from tarry.server.responses import JSON
from tarry.server.routes import health, messages, policies, queues, topics

__all__ = ["create_app", "serve", "tune_runtime"]

log = logging.getLogger("tarry")


def create_app(config: TarryConfig, *, engine: EngineAPI | None = None) -> FastAPI:
    if engine is None:
        from tarry.engine.core import Engine

        engine = Engine.from_config(config)
    metrics = Metrics()
    engine.add_listener(metrics.record, many=metrics.record_many)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        install_stack_dump()
        try:
            yield
        finally:
            await engine.stop()

    app = FastAPI(
        title="tarry",
        version=tarry.__version__,
        description="Durable delayed-message delivery: a message is kept safely and delivered "
        "at its time, never early.",
        default_response_class=JSON,
        lifespan=lifespan,
    )
    app.state.engine = engine
    app.state.config = config
    app.state.metrics = metrics
    install_error_handlers(app)
    install_openapi(app)
    for module in (messages, queues, topics, policies, health):
        app.include_router(module.router)
    return app


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit this: without it a response written as headers + body waits
    # for the client's delayed ACK (40 ms) on every keep-alive request.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def tune_runtime() -> None:
    """The interpreter settings ``tarry serve`` runs with (the benches too, to measure what
    the server does), once its start-up objects exist."""
    # Fewer, later collections: a server holding many short-lived message objects otherwise
    # pays for frequent full collections as tail latency. Start-up objects are frozen out.
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    # The queue database's and the log writer's threads run Python too: when the event loop
    # wants the GIL back (a timer due, a socket ready), it waits up to the switch interval
    # (5 ms by default) for them to yield. 1 ms bounds that stall well under the release
    # lateness goal, at the cost of a few more switches.
    sys.setswitchinterval(0.001)


def serve(config: TarryConfig) -> None:
    """Run the server until SIGINT/SIGTERM. Raises ``TarryError`` for an unsafe or bad config."""
    check_bind_safety(config)
    logging.basicConfig(
        level=config.server.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    log.info("configuration: %s", orjson.dumps(config.redacted()).decode())
    app = create_app(config)
    tune_runtime()
    sock = _bind(config.server.host, config.server.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    server = uvicorn.Server(
        uvicorn.Config(app, log_level=config.server.log_level, access_log=False, lifespan="on")
    )

    startup = server.startup

    async def announce(sockets: list[socket.socket] | None = None) -> None:
        await startup(sockets=sockets)
        if server.started:
            print(f"tarry serving on http://{shown}:{port}", flush=True)

    server.startup = announce  # type: ignore[method-assign]
    server.run(sockets=[sock])
