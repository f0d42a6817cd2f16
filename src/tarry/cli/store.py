"""``tarry store inspect DIR`` and ``tarry store verify DIR``: offline views of a log store
directory (the data directory or its ``log`` subdirectory). They read files only; they never
change them, so they are safe next to a running server."""

from __future__ import annotations

from pathlib import Path

import click

from tarry.cli.output import json_option, print_json, table, when


@click.group()
def store() -> None:
    """Inspect and verify a log store directory (offline)."""


@store.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--granularity-ms",
    type=int,
    default=300_000,
    show_default=True,
    help="The store's partition width ([store] granularity_ms).",
)
@json_option
def inspect(directory: Path, granularity_ms: int, as_json: bool) -> None:
    """Print partitions, counts, sizes and the snapshot state."""
    from tarry.store.log.tools import inspect as run

    data = run(directory, granularity_ms=granularity_ms)
    if as_json:
        print_json(data)
        return
    table(
        f"partitions in {data['directory']}",
        ["partition", "from", "to", "segments", "bytes", "messages", "pending"],
        [
            (
                r["partition"],
                when(r["start_ms"]),
                when(r["end_ms"]),
                r["segments"],
                r["bytes"],
                r["messages"],
                r["pending"],
            )
            for r in data["partitions"]
        ],
    )
    snap = data["snapshot"]
    click.echo(
        f"pending: {data['pending']}  bytes: {data['bytes']}  snapshot: "
        + (
            "none"
            if snap is None
            else f"#{snap['seq']} at {when(snap['created_ms'])}, {snap['parts']} parts, "
            f"{snap['part_bytes']} bytes, indexed partitions {snap['indexed_partitions']}"
        )
        + f"  replayed after it: {data['replayed_records']} records"
    )
    for problem in data["problems"]:
        click.echo(f"problem: {problem}", err=True)


@store.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@json_option
def verify(directory: Path, as_json: bool) -> None:
    """Check every record checksum and snapshot part; exit 1 when anything is damaged."""
    from tarry.store.log.tools import verify as run

    data = run(directory)
    if as_json:
        print_json(data)
    else:
        click.echo(
            f"{data['segments']} segments, {data['records']} records, "
            f"{data['manifests']} snapshot manifests checked in {data['directory']}"
        )
        for problem in data["problems"]:
            click.echo(f"damaged: {problem}", err=True)
        click.echo("ok" if data["ok"] else f"{len(data['problems'])} problems found")
    if not data["ok"]:
        raise SystemExit(1)
