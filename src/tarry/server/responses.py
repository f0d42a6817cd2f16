"""JSON responses rendered with orjson (the send paths return thousands of results at once)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse

__all__ = ["JSON"]


# A JSONResponse, so the OpenAPI document says JSON of the routes' declared models.
class JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
