"""``tarry serve``: run the server on the embedded store (no external service needed), or as
one node of several sharing a PostgreSQL store (``--store postgres --dsn ...``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tarry.errors import TarryError


@click.command()
@click.option(
    "--data",
    "data_dir",
    type=click.Path(path_type=Path),
    help="Data directory (default ./tarry-data).",
)
@click.option("--host", help="Address to bind (default 127.0.0.1; others need [[auth.tokens]]).")
@click.option("--port", type=int, help="TCP port (default 7420; 0 picks a free one and prints it).")
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="A tarry.toml file.")
@click.option(
    "--store",
    type=click.Choice(["log", "sqlite", "memory", "postgres"]),
    help="Delayed-message store (default log: time-partitioned logs).",
)
@click.option("--dsn", help="For --store postgres: postgresql://user@host:5432/dbname.")
@click.option("--auto-declare/--no-auto-declare", default=None, help="Create queues on first send.")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="Log lines as plain text (default) or one JSON object each ([server] log_format).",
)
def serve(
    data_dir: Path | None,
    host: str | None,
    port: int | None,
    config_path: Path | None,
    store: str | None,
    dsn: str | None,
    auto_declare: bool | None,
    log_format: str | None,
) -> None:
    """Run the tarry server until interrupted."""
    from tarry.config import load_config
    from tarry.server.app import serve as run

    server: dict[str, Any] = {}
    if data_dir is not None:
        server["data_dir"] = str(data_dir)
    if host is not None:
        server["host"] = host
    if port is not None:
        server["port"] = port
    if auto_declare is not None:
        server["auto_declare"] = auto_declare
    if log_format is not None:
        server["log_format"] = log_format
    overrides: dict[str, Any] = {"server": server}
    if store is not None:
        overrides["store"] = {"engine": store}
    if dsn is not None:
        overrides.setdefault("store", {})["dsn"] = dsn
    try:
        run(load_config(config_path, overrides))
    except TarryError as exc:
        raise click.ClickException(f"{exc.code}: {exc.message}") from None
