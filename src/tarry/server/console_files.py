"""``GET /console``: the browser console, static HTML, JavaScript and CSS shipped in the package
(``tarry/server/console/``). The page talks to the public HTTP API only, with the bearer token
the user types into it (kept in the tab's ``sessionStorage``, never sent here to be stored)."""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from starlette.responses import Response

from tarry.errors import NotFound

__all__ = ["router"]

router = APIRouter(tags=["console"])

_TYPES = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
_HEADERS = {
    # Only the page's own files run; every request goes to this server.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@cache
def _read(name: str) -> bytes:
    return resources.files("tarry.server").joinpath("console", name).read_bytes()


@router.get(
    "/console",
    summary="The browser console (HTML), using only this API",
    response_class=Response,
    responses={
        200: {
            "description": "the console page",
            "content": {"text/html": {"schema": {"type": "string"}}},
        }
    },
)
async def console() -> Response:
    return Response(_read("index.html"), media_type="text/html; charset=utf-8", headers=_HEADERS)


@router.get("/console/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    media_type = _TYPES.get(name)
    if media_type is None:
        raise NotFound(f"the console has no file {name!r}; open /console")
    return Response(_read(name), media_type=media_type, headers=_HEADERS)
