"""What the engine's life needs of the process: one owner per data directory (a lock file),
background loops that never silently stop, and the optional parts it starts with (the event
journal, the AMQP ingress), imported only when configured."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from tarry.config import TarryConfig
from tarry.engine.principal import Principal
from tarry.engine.types import MayAccess
from tarry.errors import Unavailable
from tarry.model.time import Clock
from tarry.transports.build import rabbitmq_module

if TYPE_CHECKING:
    from tarry.journal.writer import Journal
    from tarry.transports.amqp_ingress import AmqpIngress

__all__ = ["ingress_sends", "lock_data_dir", "open_journal", "start_ingress", "supervise"]

log = logging.getLogger("tarry.engine.core")


def lock_data_dir(data_dir: Path) -> IO[str]:
    """Take ``data_dir``'s lock file for this process (it holds our pid), or raise
    ``Unavailable`` naming the directory when another process has it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    handle = open(data_dir / "tarry.lock", "a+")  # noqa: SIM115 - held for the process life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise Unavailable(
            f"another tarry process is using {data_dir}; stop it or choose another --data"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def supervise(loop_fn: Callable[[], Coroutine[Any, Any, None]]) -> asyncio.Task[None]:
    """Run a background loop for the engine's life. A loop must never end by itself; if one
    does (a bug, or a stray cancellation from a library), it is logged and started again, so
    a node never silently stops dispatching while it still answers HTTP."""

    async def supervised() -> None:
        while True:
            try:
                await loop_fn()
                log.error("background loop %s returned; starting it again", loop_fn.__name__)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():  # stop() cancelled it
                    raise
                # Nobody cancelled this task: a library raised CancelledError at us.
                log.error(
                    "background loop %s got a stray cancellation; starting it again",
                    loop_fn.__name__,
                    exc_info=True,
                )
            except Exception:
                log.exception("background loop %s failed; starting it again", loop_fn.__name__)
            await asyncio.sleep(1.0)

    return asyncio.get_running_loop().create_task(supervised(), name=f"tarry-{loop_fn.__name__}")


def open_journal(config: TarryConfig, clock: Clock) -> Journal:
    """The event journal under the data directory, named for this node."""
    from tarry.journal.writer import Journal

    return Journal(
        config.server.data_dir / "journal",
        config.journal,
        clock=clock,
        node=config.journal.node or socket.gethostname(),
    )


class ScopedSendBatch(Protocol):
    """The engine's ``send_batch``: sends checked with ``may_send`` (None: no auth)."""

    def __call__(
        self, items: Sequence[Mapping[str, Any]], *, may_send: MayAccess | None = None
    ) -> Awaitable[Sequence[object]]: ...


def ingress_sends(
    config: TarryConfig, send_batch: ScopedSendBatch
) -> Callable[[Sequence[Mapping[str, Any]]], Awaitable[Sequence[object]]]:
    """``send_batch`` as the AMQP ingress calls it: with ``rabbitmq.ingress_token``, each message
    is checked as a send of that token (``Principal.may_send`` in the send rules, as the HTTP
    API checks a request's token); without tokens, unchecked."""
    token = config.ingress_token_config
    may_send = Principal(token).may_send if token is not None else None
    return partial(send_batch, may_send=may_send)


async def start_ingress(config: TarryConfig, send_batch: ScopedSendBatch) -> AmqpIngress:
    """Consume sends from RabbitMQ into ``send_batch`` (needs the ``rabbitmq`` extra), scoped
    to the ingress's token (``ingress_sends``)."""
    rabbitmq_module()
    from tarry.transports.amqp_ingress import AmqpIngress

    ingress = AmqpIngress(config.rabbitmq, send_batch=ingress_sends(config, send_batch))
    await ingress.start()
    return ingress
