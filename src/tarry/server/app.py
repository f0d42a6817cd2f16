"""The composition root: builds the engine from the configuration, mounts the routes, and runs
uvicorn on a socket it binds itself (so ``--port 0`` works and the chosen port is printed)."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import logging
import math
import resource
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pyarrow as pa
import uvicorn
from fastapi import FastAPI

import tarry
from tarry.config import TarryConfig
from tarry.engine.api import EngineAPI
from tarry.server import console_files
from tarry.server.auth import check_bind_safety
from tarry.server.connections import ConnectionGuard
from tarry.server.deps import BodyLimits
from tarry.server.diagnostics import install_stack_dump
from tarry.server.errors import install_error_handlers
from tarry.server.fast_lane import FastLane, LaneFirstAPI
from tarry.server.logs import configure_logging
from tarry.server.metrics import Metrics
from tarry.server.openapi import install_openapi
from tarry.server.recent import RecentActivity
from tarry.server.refusals import RefusalLog
from tarry.server.responses import JSON
from tarry.server.routes import (
    health,
    messages,
    overview,
    policies,
    queues,
    redrive,
    routes,
    schedules,
    topics,
)

__all__ = ["create_app", "event_loop_and_parser", "serve", "tune_runtime"]

log = logging.getLogger("tarry")


def create_app(config: TarryConfig, *, engine: EngineAPI | None = None) -> FastAPI:
    if engine is None:
        from tarry.engine.core import Engine

        engine = Engine.from_config(config)
    metrics = Metrics()
    engine.add_listener(metrics.record, many=metrics.record_many)
    recent = RecentActivity()
    engine.add_listener(recent.record, many=recent.record_many)
    refusals = RefusalLog(log)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        _count_accept_failures(asyncio.get_running_loop(), refusals)
        await engine.start()
        install_stack_dump()
        app.open_lane()
        try:
            yield
        finally:
            await engine.stop()

    lane = FastLane(queue_routes=queues.CONSUMER_ROUTES, routes=messages.PRODUCER_ROUTES)
    app = LaneFirstAPI(
        lane=lane,
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
    app.state.recent = recent
    app.state.refusals = refusals
    app.state.body_limits = BodyLimits.from_config(config.server)
    install_error_handlers(app)
    install_openapi(app)
    routers = (messages, queues, redrive, topics, policies, routes, schedules, health, overview)
    for module in (*routers, console_files):
        app.include_router(module.router)
    return app


def _count_accept_failures(loop: asyncio.AbstractEventLoop, refusals: RefusalLog) -> None:
    """asyncio logs a traceback for every accept() that fails for want of file descriptors;
    count those as refusals instead."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == "socket.accept() out of system resource":
            refusals.note("accept_failed", f"accept() failed: {context.get('exception')}")
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)


class _RefusalFilter(logging.Filter):
    """uvicorn warns once per refused request (a bad or oversized head, over the concurrency
    limit, an upgrade it cannot do): those lines go through the refusal counter."""

    KINDS = (
        ("Invalid HTTP request received.", "bad_request_head"),
        ("Exceeded concurrency limit.", "concurrency_limit"),
        ("Unsupported upgrade request.", "unsupported_upgrade"),
        ("No supported WebSocket library detected.", "unsupported_upgrade"),
    )

    def __init__(self, refusals: RefusalLog) -> None:
        super().__init__()
        self._refusals = refusals

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        for prefix, kind in self.KINDS:
            if message.startswith(prefix):
                self._refusals.note(kind, f"uvicorn: {prefix}")
                return False
        return True


# File descriptors kept for the store, the journal and the routes besides client connections.
RESERVED_FDS = 256


def _connection_cap(wanted: int) -> int:
    """Raise the open-file limit to its hard limit and return how many connections fit in it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, wanted + RESERVED_FDS)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    fits = max(1, soft - RESERVED_FDS)
    if wanted > fits:
        log.warning(
            "server.max_connections = %d does not fit the open-file limit of %d; using %d "
            "(raise the limit with ulimit -n or LimitNOFILE=)",
            wanted,
            soft,
            fits,
        )
        return fits
    return wanted


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


def event_loop_and_parser(loop: str, parser: str) -> tuple[str, str]:
    """What ``tarry serve`` runs on: uvloop and httptools when installed (``tarry[fast]``,
    uvicorn's ``standard`` extra) and ``auto``; asyncio and h11 otherwise."""
    if loop == "auto":
        loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    if parser == "auto":
        parser = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return loop, parser


def tune_runtime() -> None:
    """The interpreter settings ``tarry serve`` runs with (the benches too, to measure what
    the server does), once its start-up objects exist."""
    # pyarrow's first conversion of a Python list imports pandas (to look for its types in
    # it): here, at start-up, and frozen with the rest, not inside the first big send batch.
    pa.array([0])
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
    log_config = configure_logging(config.server)
    # httpx logs every request at INFO with its whole URL: a line per webhook delivery, and a
    # route URL's credentials in clear. Its warnings still show.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, log.getEffectiveLevel()))
    log.info("configuration: %s", orjson.dumps(config.redacted()).decode())
    app = create_app(config)
    tune_runtime()
    settings = config.server
    guard = ConnectionGuard(
        max_connections=_connection_cap(settings.max_connections),
        header_timeout_s=settings.header_timeout_ms / 1000,
        refusals=app.state.refusals,
    )
    loop, parser = event_loop_and_parser(settings.event_loop, settings.http_parser)
    log.info("event loop %s, HTTP parser %s", loop, parser)
    sock = _bind(settings.host, settings.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if settings.tls else "http"
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level=settings.log_level,
            log_config=log_config,
            access_log=False,
            lifespan="on",
            http=guard.protocol(parser, max_header_bytes=settings.max_header_bytes),
            loop=loop,
            # uvicorn counts every open connection against this; the guard keeps them at
            # max_connections, so uvicorn's own 503 is only a backstop.
            limit_concurrency=guard.max_connections + 1,
            timeout_keep_alive=math.ceil(settings.keep_alive_ms / 1000),
            h11_max_incomplete_event_size=settings.max_header_bytes,
            ssl_certfile=settings.tls_cert,
            ssl_keyfile=settings.tls_key,
        )
    )
    logging.getLogger("uvicorn.error").addFilter(_RefusalFilter(app.state.refusals))

    startup = server.startup

    async def announce(sockets: list[socket.socket] | None = None) -> None:
        await startup(sockets=sockets)
        if server.started:
            print(f"tarry serving on {scheme}://{shown}:{port}", flush=True)

    server.startup = announce  # type: ignore[method-assign]
    server.run(sockets=[sock])
