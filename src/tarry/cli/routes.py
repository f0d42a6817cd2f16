"""Route verbs: destinations outside tarry (HTTP webhooks, RabbitMQ) put, shown, listed and
deleted at run time, and a fresh webhook secret."""

from __future__ import annotations

import base64
import secrets as random_secrets
from pathlib import Path
from typing import Any

import click
import orjson

from tarry.cli.context import client, connection_options, parsed, reports_errors
from tarry.cli.messages import header_pairs
from tarry.cli.output import json_option, mapping, print_json, table
from tarry.errors import InvalidArgument
from tarry.model.route_rules import SECRET_PREFIX
from tarry.model.time import parse_duration_ms


@click.group()
def route() -> None:
    """Routes: destinations outside tarry (HTTP webhooks, RabbitMQ), changed at run time."""


def _settings(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``--set key=value``: the value as JSON when it is JSON (numbers, true), else text."""
    out: dict[str, Any] = {}
    for key, value in header_pairs(pairs).items():
        try:
            out[key] = orjson.loads(value)
        except orjson.JSONDecodeError:
            out[key] = value
    return out


def _secrets(given: tuple[str, ...], from_file: str | None) -> list[str] | None:
    found = list(given)
    if from_file is not None:
        try:
            text = Path(from_file).read_text()
        except OSError as exc:
            parsed(_refuse, f"--secrets-from {from_file}: {exc.strerror}")
            raise
        found += [line.strip() for line in text.splitlines() if line.strip()]
    return found or None


def _refuse(message: str) -> None:
    raise InvalidArgument(message)


@route.command(name="put")
@click.argument("name")
@click.argument("target", metavar="URL")
@click.option(
    "--transport",
    type=click.Choice(["http", "rabbitmq"]),
    default="http",
    show_default=True,
    help="How to deliver: POST to an http(s):// URL, or publish to an amqp(s):// broker.",
)
@click.option(
    "--secret",
    "secret",
    multiple=True,
    help="A whsec_ signing secret (repeat to rotate: new and old sign together).",
)
@click.option(
    "--secrets-from",
    help="A file with one whsec_ secret per line (keeps them off the command line).",
)
@click.option("--timeout", help="Delivery timeout, e.g. 5s.")
@click.option("-H", "--header", "headers", multiple=True, help="A header, key=value (repeatable).")
@click.option("--rate-per-s", type=float, help="Most deliveries per second to this route.")
@click.option("--concurrency", type=int, help="Most deliveries under way at once.")
@click.option("--retries", type=int, help="Delivery attempts after the first.")
@click.option("--retry-backoff", help="First retry delay, e.g. 1s.")
@click.option("--on-failure-report-to", help="A destination told when a message is dead-lettered.")
@click.option(
    "--dead-letter-to",
    help="A local queue for this route's failed deliveries (default: tarry.error).",
)
@click.option(
    "--set",
    "settings",
    multiple=True,
    help="Any other route field, key=value (JSON or text), e.g. mode=native.",
)
@json_option
@connection_options
@click.pass_context
@reports_errors
def put(
    ctx: click.Context,
    name: str,
    transport: str,
    target: str,
    secret: tuple[str, ...],
    secrets_from: str | None,
    timeout: str | None,
    headers: tuple[str, ...],
    rate_per_s: float | None,
    concurrency: int | None,
    retries: int | None,
    retry_backoff: str | None,
    on_failure_report_to: str | None,
    dead_letter_to: str | None,
    settings: tuple[str, ...],
    as_json: bool,
) -> None:
    """Create or replace route NAME to URL; in force at once, kept across restarts."""
    given = {
        "secrets": _secrets(secret, secrets_from),
        "timeout": parsed(parse_duration_ms, timeout, field="--timeout") if timeout else None,
        "headers": header_pairs(headers) or None,
        "rate_per_s": rate_per_s,
        "concurrency": concurrency,
        "retries": retries,
        "retry_backoff": parsed(parse_duration_ms, retry_backoff, field="--retry-backoff")
        if retry_backoff
        else None,
        "on_failure_report_to": on_failure_report_to,
        "dead_letter_to": dead_letter_to,
    }
    # --set gives any field; a named option given as well wins.
    fields = {**_settings(settings), **{k: v for k, v in given.items() if v is not None}}
    info = client(ctx).put_route(name, transport=transport, url=target, **fields)
    if as_json:
        print_json(info)
    else:
        click.echo(f"route {info['name']} {info['transport']} {info['url']}")


@route.command(name="show")
@click.argument("name")
@json_option
@connection_options
@click.pass_context
@reports_errors
def show(ctx: click.Context, name: str, as_json: bool) -> None:
    """A route's settings (secrets as fingerprints, credentials hidden)."""
    info = client(ctx).get_route(name)
    if as_json:
        print_json(info)
    else:
        mapping(f"route {name}", info)


@route.command(name="delete")
@click.argument("name")
@click.option(
    "--force", is_flag=True, help="Dead-letter the messages waiting for it instead of refusing."
)
@connection_options
@click.pass_context
@reports_errors
def delete(ctx: click.Context, name: str, force: bool) -> None:
    """Delete route NAME (in_use while messages wait for it, unless --force)."""
    answer = client(ctx).delete_route(name, force=force)
    dead = answer.get("dead_lettered", 0)
    click.echo(
        f"route {name} deleted" + (f", {dead} waiting message(s) dead-lettered" if dead else "")
    )


@route.command(name="ls")
@json_option
@connection_options
@click.pass_context
@reports_errors
def ls(ctx: click.Context, as_json: bool) -> None:
    """Every route this token may see."""
    routes = client(ctx).list_routes()
    if as_json:
        print_json(routes)
        return
    table(
        "routes",
        ["name", "transport", "url", "secrets", "source"],
        [
            (r["name"], r["transport"], r["url"], len(r.get("secrets", [])), r.get("source"))
            for r in routes
        ],
    )


@route.command(name="secret")
def secret() -> None:
    """Print a new random webhook secret (whsec_ + 32 random bytes in base64)."""
    click.echo(SECRET_PREFIX + base64.b64encode(random_secrets.token_bytes(32)).decode())
