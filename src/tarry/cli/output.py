"""Printing: rich tables for people, JSON (``--json``) for scripts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click
import orjson
from rich.console import Console
from rich.table import Table

from tarry.model.time import format_rfc3339

console = Console()
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def print_json(data: Any) -> None:
    click.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


def when(ms: int | None) -> str:
    return "-" if ms is None else format_rfc3339(ms)


#: The narrowest a column that may wrap is drawn.
_NARROWEST = 4


def table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    keep: Sequence[str] = (),
) -> None:
    """A table for people. Columns named in ``keep`` (ids a user copies) are never cut or
    wrapped; the others wrap rather than lose text. A terminal too narrow for that gets one
    block per row instead: the kept values on a line of their own, the rest below."""
    cells = [["-" if v is None else str(v) for v in row] for row in rows]
    widths = {
        c: max([len(c), *(len(row[i]) for row in cells)])
        for i, c in enumerate(columns)
        if c in keep
    }
    needed = sum(widths.get(c, _NARROWEST) for c in columns) + 3 * len(columns) + 1
    if keep and console.width < needed:
        console.print(title, style="bold")
        for row in cells:
            click.echo("  ".join(v for c, v in zip(columns, row, strict=True) if c in keep))
            for column, value in zip(columns, row, strict=True):
                if column not in keep:
                    click.echo(f"  {column}: {value}")
        return
    grid = Table(title=title)
    for column in columns:
        if column in keep:
            grid.add_column(column, no_wrap=True, min_width=widths[column])
        else:
            grid.add_column(column, overflow="fold")
    for row in cells:
        grid.add_row(*row)
    console.print(grid)


def mapping(title: str, data: dict[str, Any]) -> None:
    table(title, ["field", "value"], [(k, v) for k, v in data.items()])


#: Fields of the API's answers that hold instants (epoch ms on the wire).
_INSTANTS = frozenset(
    {"deliver_at", "expires_at", "sent_at", "time", "created_at", "last_used", "updated_at"}
)


def readable(data: dict[str, Any]) -> dict[str, Any]:
    """An answer of the API as ``tarry show`` prints it: instants as RFC 3339, headers one
    ``key=value`` a line, each death on a line of its own."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key in _INSTANTS and isinstance(value, int) and not isinstance(value, bool):
            out[key] = when(value)
        elif key == "headers" and isinstance(value, dict):
            out[key] = "\n".join(f"{k}={v}" for k, v in value.items()) or "-"
        elif key == "deaths" and isinstance(value, list):
            out[key] = "\n".join(_death(d) for d in value) or "-"
        elif isinstance(value, list):
            out[key] = ", ".join(str(v) for v in value) or "-"
        else:
            out[key] = value
    return out


def _death(death: dict[str, Any]) -> str:
    at = when(death["time"]) if isinstance(death.get("time"), int) else death.get("time")
    return (
        f"{death.get('reason')} in {death.get('queue')} at {at}, {death.get('count')}x "
        f"(sent to {death.get('destination')})"
    )
