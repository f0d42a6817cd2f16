"""``tarry redrive QUEUE``: send a queue's dead letters back where they came from, chunk after
chunk (``max`` per request, ``next_cursor`` to go on), with a progress readout."""

from __future__ import annotations

from collections import Counter
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tarry.cli.context import client, connection_options, parsed, reports_errors
from tarry.cli.output import json_option, print_json
from tarry.model.time import parse_duration_ms, parse_instant_ms

#: Dead letters moved per request.
PER_REQUEST = 1000


@click.command()
@click.argument("queue")
@click.option(
    "--reason",
    type=click.Choice(["expired", "rejected", "maxlen", "delivery_failed"]),
    help="Only dead letters that died for this reason.",
)
@click.option("--original-destination", help="Only dead letters that died there.")
@click.option("--dead-after", help="Only those that died at or after this time.")
@click.option("--dead-before", help="Only those that died before this time.")
@click.option("--id", "ids", multiple=True, help="Only this dead letter (repeatable).")
@click.option("--to", help="Send them here instead of where each came from.")
@click.option("--delay", help="Deliver them after this long: 250ms, 5s, 10m, 2h, 3d.")
@click.option("--max", "most", type=int, help="Move at most this many.")
@json_option
@connection_options
@click.pass_context
@reports_errors
def redrive(
    ctx: click.Context,
    queue: str,
    reason: str | None,
    original_destination: str | None,
    dead_after: str | None,
    dead_before: str | None,
    ids: tuple[str, ...],
    to: str | None,
    delay: str | None,
    most: int | None,
    as_json: bool,
) -> None:
    """Move the dead letters of QUEUE back to the destination each came from."""
    if most is not None and most < 1:
        raise click.BadParameter("--max must be 1 or more", param_hint="--max")
    filters: dict[str, Any] = dict(
        original_destination=original_destination,
        reason=reason,
        dead_after=parsed(parse_instant_ms, dead_after, field="--dead-after")
        if dead_after
        else None,
        dead_before=parsed(parse_instant_ms, dead_before, field="--dead-before")
        if dead_before
        else None,
        to=to,
        delay=parsed(parse_duration_ms, delay, field="--delay") if delay else None,
    )
    c = client(ctx)
    moved, skipped = 0, Counter[str]()
    if ids:
        for start in range(0, len(ids), 1000):
            answer = c.redrive(queue, ids=ids[start : start + 1000], **filters)
            moved += answer["moved"]
            skipped.update(answer["skipped_reasons"])
    else:
        # The dead letters there now bound the bar; with a filter fewer may move.
        total = c.get_queue(queue).ready if most is None else most
        with Progress(
            TextColumn("redriving {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            transient=True,
            disable=as_json,
        ) as progress:
            task = progress.add_task(queue, total=total or None, rate="")
            cursor = None
            while most is None or moved < most:
                step = PER_REQUEST if most is None else min(PER_REQUEST, most - moved)
                answer = c.redrive(queue, max=step, cursor=cursor, **filters)
                moved += answer["moved"]
                skipped.update(answer["skipped_reasons"])
                elapsed = progress.tasks[0].elapsed or 0.0
                rate = f"{moved / elapsed:,.0f}/s" if elapsed > 0 else ""
                progress.update(task, completed=moved, rate=rate)
                cursor = answer.get("next_cursor")
                if cursor is None:
                    break
    if as_json:
        print_json(
            {"moved": moved, "skipped": sum(skipped.values()), "skipped_reasons": dict(skipped)}
        )
        return
    why = ", ".join(f"{code} {n}" for code, n in sorted(skipped.items()))
    click.echo(f"moved {moved}, skipped {sum(skipped.values())}" + (f" ({why})" if why else ""))
