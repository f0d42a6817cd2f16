"""``tarry stats``: counts by state, queues, dispatcher figures, health."""

from __future__ import annotations

import click

from tarry.cli.context import client, connection_options, reports_errors
from tarry.cli.output import json_option, print_json, table


@click.command()
@json_option
@connection_options
@click.pass_context
@reports_errors
def stats(ctx: click.Context, as_json: bool) -> None:
    """Show the server's counts and health."""
    data = client(ctx).stats()
    if as_json:
        print_json(data)
        return
    table("messages by state", ["state", "count"], list(data["messages"].items()))
    table("dispatcher", ["figure", "value"], list(data["dispatch"].items()))
    click.echo(
        f"health: {data['health']['status']}"
        + (f" (open: {', '.join(data['health']['open'])})" if data["health"]["open"] else "")
    )
