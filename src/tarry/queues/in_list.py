"""``column IN (...)`` over a list of values known only at run time (rows by key, receipts).

On SQLite the list is one JSON parameter read by ``json_each``: the statement's text is then
the same for every length, so it stays in the connection's cache of prepared statements. An
IN list of one placeholder a value is another statement for every length, prepared anew each
time (a consumer's receives and acks come in every size up to 1,000, more sizes than the cache
holds). PostgreSQL gets placeholders, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

__all__ = ["in_list"]


def in_list(conn: object, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
    """The condition ``column`` is one of ``values`` (ints or strings), and its parameters."""
    if getattr(conn, "dialect", None) is None:
        return f"{column} IN (SELECT value FROM json_each(?))", [orjson.dumps(values).decode()]
    return f"{column} IN ({', '.join('?' * len(values))})", list(values)
