"""JSON responses rendered with orjson (the send paths return thousands of results at once)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

__all__ = ["JSON"]


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
