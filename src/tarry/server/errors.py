"""One exception handler: every error leaves as ``{"error": {"code", "message"}}`` (and the
error's details, if any) with the status of its code. Foreign errors (validation, routing,
bugs) are translated here, once."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from tarry.errors import Overloaded, TarryError
from tarry.server.responses import JSON

__all__ = ["error_response", "install_error_handlers"]

log = logging.getLogger(__name__)


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSON:
    return JSON({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def _allowed_methods(request: Request) -> list[str]:
    """Every method the OpenAPI document lists for this path (Starlette's 405 names only the
    first route's, where a path has one route per method)."""
    paths = request.app.openapi()["paths"]
    path = request.url.path
    if path in paths:  # a literal path is served by its own routes alone
        return sorted(m.upper() for m in paths[path])
    methods: set[str] = set()
    for template, operations in paths.items():
        if re.fullmatch(re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(template)), path):
            methods.update(m.upper() for m in operations)
    return sorted(methods)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(TarryError)
    async def tarry_error(request: Request, exc: TarryError) -> JSON:
        response = JSON({"error": exc.to_dict()}, status_code=exc.http_status)
        if isinstance(exc, Overloaded):
            response.headers["retry-after"] = str(exc.retry_after_s)
        if getattr(request.state, "body_unread", False):
            # Refused before its end: close rather than read (and throw away) the rest.
            response.headers["connection"] = "close"
        return response

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSON:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'] if p != 'body') or 'body'}: {err['msg']}"
            for err in exc.errors()
        )
        return error_response(400, "invalid_argument", f"invalid request: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSON:
        if exc.status_code == 404:
            return error_response(404, "not_found", f"no such path: {request.url.path}")
        if exc.status_code == 405:
            return error_response(
                405,
                "invalid_argument",
                f"{request.method} is not allowed on {request.url.path}",
                {"Allow": ", ".join(_allowed_methods(request))},
            )
        return error_response(exc.status_code, "invalid_argument", str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSON:
        log.exception("unexpected error")
        return error_response(500, "internal", f"internal error: {type(exc).__name__}")
