"""Message verbs: send, ls, show, cancel, reschedule, consume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import orjson
from rich.progress import Progress

from tarry.cli.context import client, connection_options, parsed, reports_errors
from tarry.cli.output import json_option, mapping, print_json, readable, table, when
from tarry.errors import InvalidArgument, TarryError
from tarry.model.time import parse_duration_ms, parse_instant_ms


def header_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    headers = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            parsed(_raise, f"header {pair!r} must be written key=value")
        headers[key] = value
    return headers


def _raise(message: str) -> None:
    raise InvalidArgument(message)


@click.command()
@click.argument("destination", required=False)
@click.argument("body", required=False)
@click.option("--delay", help="Deliver after this long: 250ms, 5s, 10m, 2h, 3d.")
@click.option("--at", "at", help="Deliver at this time: RFC 3339 or epoch ms.")
@click.option("--ttl", help="Expire this long after sending (must not be shorter than --delay).")
@click.option("-H", "--header", "headers", multiple=True, help="A header, key=value (repeatable).")
@click.option(
    "--id", "message_id", help="Idempotency key: a repeat to the same destination stores nothing."
)
@click.option("--correlation-id", help="Correlation id carried to the consumer.")
@click.option("--reply-to", help="Queue that receives the reports.")
@click.option(
    "--report",
    multiple=True,
    type=click.Choice(["expiration", "exception"]),
    help="Report to --reply-to (repeatable).",
)
@click.option("--group-id", help="Message group (refused together with a delay: options_error).")
@click.option("--retain", is_flag=True, help="Retained publication (refused with a delay).")
@click.option("--discard", is_flag=True, help="Discard instead of dead-lettering if undeliverable.")
@click.option(
    "--body-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Read the body from a file.",
)
@click.option(
    "--file",
    "batch_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Send a JSON-lines file of messages in batches.",
)
@connection_options
@click.pass_context
@reports_errors
def send(
    ctx: click.Context,
    destination: str | None,
    body: str | None,
    delay: str | None,
    at: str | None,
    ttl: str | None,
    headers: tuple[str, ...],
    message_id: str | None,
    correlation_id: str | None,
    reply_to: str | None,
    report: tuple[str, ...],
    group_id: str | None,
    retain: bool,
    discard: bool,
    body_file: Path | None,
    batch_file: Path | None,
) -> None:
    """Schedule a message to DESTINATION and print its id (or send a --file of JSON lines)."""
    if batch_file is not None:
        _send_file(ctx, batch_file)
        return
    if destination is None:
        parsed(_raise, "name a DESTINATION (or give --file)")
    payload: bytes | str = body_file.read_bytes() if body_file else (body or "")
    result = client(ctx).send(
        destination or "",
        payload,
        delay=parsed(parse_duration_ms, delay, field="--delay") if delay else None,
        deliver_at=parsed(parse_instant_ms, at, field="--at") if at else None,
        ttl=parsed(parse_duration_ms, ttl, field="--ttl") if ttl else None,
        headers=header_pairs(headers),
        message_id=message_id,
        correlation_id=correlation_id,
        reply_to=reply_to,
        report=report or None,
        on_undeliverable="discard" if discard else None,
        group_id=group_id,
        retain=retain or None,
    )
    click.echo(result.id)


def _send_file(ctx: click.Context, path: Path, batch: int = 1000) -> None:
    lines = [line for line in path.read_bytes().splitlines() if line.strip()]
    accepted = duplicates = 0
    rejected: dict[str, int] = {}
    with Progress(transient=True) as progress:
        task = progress.add_task("sending", total=len(lines))
        for start in range(0, len(lines), batch):
            chunk = [orjson.loads(line) for line in lines[start : start + batch]]
            for result in client(ctx).send_batch(chunk):
                if isinstance(result, TarryError):
                    rejected[result.code] = rejected.get(result.code, 0) + 1
                elif result.duplicate:
                    duplicates += 1
                else:
                    accepted += 1
            progress.advance(task, len(chunk))
    click.echo(
        f"accepted {accepted}, duplicates {duplicates}, rejected {sum(rejected.values())}"
        + "".join(f", {code} {n}" for code, n in sorted(rejected.items()))
    )


@click.command(name="ls")
@click.option("--destination", help="Only this destination.")
@click.option("--state", help="Only this state (scheduled, ready, delivered, ...).")
@click.option("--correlation-id", help="Only this correlation id.")
@click.option("--due-after", help="Due at or after this time.")
@click.option("--due-before", help="Due before this time.")
@click.option("--limit", type=int, default=100, show_default=True, help="Page size.")
@click.option("--all", "all_pages", is_flag=True, help="Follow every page.")
@json_option
@connection_options
@click.pass_context
@reports_errors
def ls(
    ctx: click.Context,
    destination: str | None,
    state: str | None,
    correlation_id: str | None,
    due_after: str | None,
    due_before: str | None,
    limit: int,
    all_pages: bool,
    as_json: bool,
) -> None:
    """List messages ordered by due time."""
    filters: dict[str, Any] = dict(
        destination=destination,
        state=state,
        correlation_id=correlation_id,
        due_after=parsed(parse_instant_ms, due_after, field="--due-after") if due_after else None,
        due_before=parsed(parse_instant_ms, due_before, field="--due-before")
        if due_before
        else None,
        limit=limit,
    )
    c = client(ctx)
    items = list(c.iter_messages(**filters)) if all_pages else c.list(**filters).items
    if as_json:
        print_json([m.raw for m in items])
        return
    table(
        "messages",
        ["id", "destination", "state", "deliver_at", "expires_at"],
        [(m.id, m.destination, m.state, when(m.deliver_at), when(m.expires_at)) for m in items],
        keep=["id"],
    )


@click.command()
@click.argument("message_id")
@json_option
@connection_options
@click.pass_context
@reports_errors
def show(ctx: click.Context, message_id: str, as_json: bool) -> None:
    """Show one message's metadata and state."""
    info = client(ctx).get(message_id)
    if as_json:
        print_json(info.raw)
    else:
        mapping(f"message {message_id}", readable(info.raw))


@click.command()
@click.argument("message_id")
@connection_options
@click.pass_context
@reports_errors
def cancel(ctx: click.Context, message_id: str) -> None:
    """Cancel a scheduled message."""
    result = client(ctx).cancel(message_id)
    click.echo(f"{result['id']} {result['state']}")


@click.command()
@click.argument("message_id")
@click.option("--delay", help="New delay from now.")
@click.option("--at", "at", help="New due time.")
@connection_options
@click.pass_context
@reports_errors
def reschedule(ctx: click.Context, message_id: str, delay: str | None, at: str | None) -> None:
    """Move a scheduled message to another time."""
    if (delay is None) == (at is None):
        parsed(_raise, "give exactly one of --delay or --at")
    info = client(ctx).reschedule(
        message_id,
        delay=parsed(parse_duration_ms, delay, field="--delay") if delay else None,
        deliver_at=parsed(parse_instant_ms, at, field="--at") if at else None,
    )
    click.echo(f"{info.id} due {when(info.deliver_at)}")


@click.command()
@click.argument("queue")
@click.option(
    "--count", type=int, default=1, show_default=True, help="Stop after this many messages."
)
@click.option(
    "--wait", default="5s", show_default=True, help="Give up after waiting this long for a message."
)
@click.option("--visibility", help="How long a taken message stays invisible before redelivery.")
@click.option("--no-ack", is_flag=True, help="Leave the messages unacknowledged.")
@json_option
@connection_options
@click.pass_context
@reports_errors
def consume(
    ctx: click.Context,
    queue: str,
    count: int,
    wait: str,
    visibility: str | None,
    no_ack: bool,
    as_json: bool,
) -> None:
    """Receive messages from QUEUE, print them, and acknowledge them."""
    wait_ms = parsed(parse_duration_ms, wait, field="--wait")
    visibility_ms = (
        parsed(parse_duration_ms, visibility, field="--visibility") if visibility else None
    )
    c = client(ctx)
    taken = 0
    # A batch is acked with the next receive (one request), the last one on its own.
    to_ack: list[str] | None = None
    with Progress(transient=True, disable=count <= 50) as progress:
        task = progress.add_task(f"consuming {queue}", total=count)
        while taken < count:
            batch = c.receive(
                queue,
                max=min(1000, count - taken),
                wait=min(wait_ms, 20_000),
                visibility=visibility_ms,
                ack=to_ack,
            )
            to_ack = None
            if not batch:
                break
            for m in batch:
                if as_json:
                    print_json(
                        {
                            "id": m.id,
                            "body": m.text,
                            "headers": m.headers,
                            "deliver_at": m.deliver_at,
                            "redelivered": m.redelivered,
                            "deaths": m.deaths,
                        }
                    )
                else:
                    click.echo(f"{m.id}\t{when(m.deliver_at)}\t{m.text}")
            if not no_ack:
                to_ack = [m.receipt for m in batch]
            taken += len(batch)
            progress.advance(task, len(batch))
    if to_ack:
        c.ack(queue, to_ack)
    if taken == 0:
        click.echo(f"no message in {queue} within {wait}", err=True)
