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


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    grid = Table(title=title)
    for column in columns:
        grid.add_column(column)
    for row in rows:
        grid.add_row(*("-" if v is None else str(v) for v in row))
    console.print(grid)


def mapping(title: str, data: dict[str, Any]) -> None:
    table(title, ["field", "value"], [(k, v) for k, v in data.items()])
