"""How ``tarry serve`` logs: plain text lines (the default) or, with ``[server] log_format =
"json"`` (``--log-format json``, ``TARRY_SERVER__LOG_FORMAT=json``), one JSON object a line on
stderr: ``time`` (RFC 3339), ``level``, ``logger``, ``message``, and the fields a log call
names with ``extra=`` (``id`` of a message, ``destination``, ``queue``, ``count``, ...), plus
``exception`` with its traceback when there is one. uvicorn's own lines go the same way."""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson

from tarry.config import ServerConfig
from tarry.model.time import format_rfc3339

__all__ = ["JsonFormatter", "configure_logging"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: What every LogRecord has: anything else on a record came from ``extra=``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One log record as one line of JSON."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": format_rfc3339(int(record.created * 1000)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in data:
                data[key] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            data["exception"] = record.exc_text
        if record.stack_info:
            data["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(data, default=str).decode()


def configure_logging(server: ServerConfig) -> dict[str, Any] | None:
    """Set up the root logger for ``server.log_format``; returns the ``log_config`` to give
    uvicorn (None: uvicorn adds no handlers of its own and its lines reach the root logger)."""
    level = server.log_level.upper()
    if server.log_format == "json":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=level, handlers=[handler], force=True)
        return None
    logging.basicConfig(level=level, format=TEXT_FORMAT, stream=sys.stderr)
    from uvicorn.config import LOGGING_CONFIG

    return LOGGING_CONFIG
