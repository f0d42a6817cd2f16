"""What every route needs: the engine, the caller, and a JSON body read with orjson."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request

from tarry.engine.api import EngineAPI
from tarry.errors import InvalidArgument
from tarry.server.auth import Principal, principal_for

__all__ = ["caller", "engine_of", "json_body", "json_object"]


def engine_of(request: Request) -> EngineAPI:
    engine: EngineAPI = request.app.state.engine
    return engine


def caller(request: Request) -> Principal:
    return principal_for(request, request.app.state.config.auth)


async def json_body(request: Request, *, default: Any = None) -> Any:
    raw = await request.body()
    if not raw.strip():
        if default is not None:
            return default
        raise InvalidArgument("the request needs a JSON body")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"the body is not valid JSON: {exc}") from None


async def json_object(request: Request, *, default: dict[str, Any] | None = None) -> dict[str, Any]:
    body = await json_body(request, default=default)
    if not isinstance(body, dict):
        raise InvalidArgument("the body must be a JSON object")
    return body
