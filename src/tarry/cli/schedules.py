"""Schedule verbs: put, show, delete, ls (recurring messages from a cron expression)."""

from __future__ import annotations

from typing import Any

import click

from tarry.cli.context import client, connection_options, parsed, reports_errors
from tarry.cli.messages import header_pairs
from tarry.cli.output import json_option, mapping, print_json, table, when
from tarry.model.time import parse_duration_ms, parse_instant_ms


@click.group()
def schedule() -> None:
    """Recurring schedules: each cron occurrence becomes an ordinary scheduled message."""


def _show(info: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(info)
        return
    data = {
        "cron": info["cron"],
        "timezone": info["timezone"],
        "destination": info["destination"],
        "catch_up": info["catch_up"],
        "planned through": when(info["planned_through"]),
        "last error": info["last_error"] or "-",
        **{f"next {i + 1}": f"{o['local']}  {o['message_id']}" for i, o in enumerate(info["next"])},
    }
    mapping(f"schedule {info['name']}", data)


@schedule.command(name="put")
@click.argument("name")
@click.argument("body", required=False, default="")
@click.option("--cron", required=True, help="5 fields (m h dom mon dow), or 6 with seconds first.")
@click.option("--tz", "timezone", default="UTC", show_default=True, help="IANA time zone.")
@click.option("--to", "destination", required=True, help="The queue, topic or route.")
@click.option("--ttl", help="Each occurrence expires this long after its time, e.g. 10m.")
@click.option("-H", "--header", "headers", multiple=True, help="A header, key=value (repeatable).")
@click.option("--start", help="No occurrence before this time (RFC 3339 or epoch ms).")
@click.option("--end", help="No occurrence after this time (RFC 3339 or epoch ms).")
@click.option(
    "--catch-up",
    type=click.Choice(["skip", "once"]),
    help="Occurrences missed while tarry was down: drop them (skip, the default) or deliver one.",
)
@json_option
@connection_options
@click.pass_context
@reports_errors
def put(
    ctx: click.Context,
    name: str,
    body: str,
    cron: str,
    timezone: str,
    destination: str,
    ttl: str | None,
    headers: tuple[str, ...],
    start: str | None,
    end: str | None,
    catch_up: str | None,
    as_json: bool,
) -> None:
    """Create or replace schedule NAME, sending BODY to --to at every --cron time in --tz."""
    info = client(ctx).put_schedule(
        name,
        cron=cron,
        timezone=timezone,
        destination=destination,
        body=body,
        headers=header_pairs(headers),
        ttl=parsed(parse_duration_ms, ttl, field="--ttl") if ttl else None,
        start_at=parsed(parse_instant_ms, start, field="--start") if start else None,
        end_at=parsed(parse_instant_ms, end, field="--end") if end else None,
        catch_up=catch_up,
    )
    _show(info, as_json)


@schedule.command(name="show")
@click.argument("name")
@json_option
@connection_options
@click.pass_context
@reports_errors
def show(ctx: click.Context, name: str, as_json: bool) -> None:
    """A schedule and its next occurrences."""
    _show(client(ctx).get_schedule(name), as_json)


@schedule.command(name="delete")
@click.argument("name")
@connection_options
@click.pass_context
@reports_errors
def delete(ctx: click.Context, name: str) -> None:
    """Delete schedule NAME and cancel the occurrences it stored."""
    answer = client(ctx).delete_schedule(name)
    click.echo(f"schedule {name} deleted ({answer['cancelled']} stored occurrence(s) cancelled)")


@schedule.command(name="ls")
@json_option
@connection_options
@click.pass_context
@reports_errors
def ls(ctx: click.Context, as_json: bool) -> None:
    """All schedules."""
    items = client(ctx).list_schedules()
    if as_json:
        print_json(items)
        return
    table(
        "schedules",
        ["name", "cron", "timezone", "destination", "next"],
        [
            (s["name"], s["cron"], s["timezone"], s["destination"], s["next"][0]["local"])
            if s["next"]
            else (s["name"], s["cron"], s["timezone"], s["destination"], None)
            for s in items
        ],
    )
