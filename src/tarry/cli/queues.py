"""Queue, topic and policy verbs."""

from __future__ import annotations

import click
import orjson

from tarry.cli.context import client, connection_options, parsed, reports_errors
from tarry.cli.output import json_option, mapping, print_json, readable, table
from tarry.model.time import parse_duration_ms


@click.group()
def queue() -> None:
    """Declare, inspect and delete local queues."""


@queue.command(name="declare")
@click.argument("name")
@click.option("--ttl", help="Per-queue message TTL (counts from arrival), e.g. 30s.")
@click.option("--expires", help="Delete the queue after it is unused this long.")
@click.option(
    "--dead-letter-to", help="Queue that receives expired, rejected and dropped messages."
)
@click.option("--max-length", type=int, help="Most ready messages.")
@click.option(
    "--overflow", type=click.Choice(["drop_head", "reject_publish"]), help="What happens when full."
)
@click.option("--max-message-bytes", type=int, help="Largest body accepted.")
@click.option("--put-disabled", is_flag=True, help="Refuse sends (put_disabled).")
@connection_options
@click.pass_context
@reports_errors
def declare(
    ctx: click.Context,
    name: str,
    ttl: str | None,
    expires: str | None,
    dead_letter_to: str | None,
    max_length: int | None,
    overflow: str | None,
    max_message_bytes: int | None,
    put_disabled: bool,
) -> None:
    """Declare queue NAME (idempotent for equal arguments)."""
    info = client(ctx).declare_queue(
        name,
        message_ttl=parsed(parse_duration_ms, ttl, field="--ttl") if ttl else None,
        expires=parsed(parse_duration_ms, expires, field="--expires") if expires else None,
        dead_letter_to=dead_letter_to,
        max_length=max_length,
        overflow=overflow,
        max_message_bytes=max_message_bytes,
        put_enabled=False if put_disabled else None,
    )
    click.echo(f"queue {info.name} ready={info.ready} scheduled={info.scheduled}")


@queue.command(name="show")
@click.argument("name")
@json_option
@connection_options
@click.pass_context
@reports_errors
def show(ctx: click.Context, name: str, as_json: bool) -> None:
    """Counts and the arguments in force."""
    info = client(ctx).get_queue(name)
    data = {
        "name": info.name,
        "ready": info.ready,
        "in_flight": info.in_flight,
        "scheduled": info.scheduled,
        **{f"arg {k}": v for k, v in info.effective.items()},
    }
    if as_json:
        print_json(data)
    else:
        mapping(f"queue {name}", data)


@queue.command(name="delete")
@click.argument("name")
@connection_options
@click.pass_context
@reports_errors
def delete(ctx: click.Context, name: str) -> None:
    """Delete a queue and its messages."""
    client(ctx).delete_queue(name)
    click.echo(f"queue {name} deleted")


@queue.command(name="list")
@json_option
@connection_options
@click.pass_context
@reports_errors
def list_(ctx: click.Context, as_json: bool) -> None:
    """All queues."""
    queues = client(ctx).list_queues()
    if as_json:
        print_json(
            [
                q.__dict__
                if hasattr(q, "__dict__")
                else {
                    "name": q.name,
                    "ready": q.ready,
                    "in_flight": q.in_flight,
                    "scheduled": q.scheduled,
                }
                for q in queues
            ]
        )
        return
    table(
        "queues",
        ["name", "ready", "in_flight", "scheduled"],
        [(q.name, q.ready, q.in_flight, q.scheduled) for q in queues],
        keep=["name"],
    )


@click.group()
def topic() -> None:
    """Topics: a delayed publish fans out to the subscribed queues at send time."""


@topic.command(name="declare")
@click.argument("name")
@connection_options
@click.pass_context
@reports_errors
def topic_declare(ctx: click.Context, name: str) -> None:
    """Declare topic NAME."""
    client(ctx).declare_topic(name)
    click.echo(f"topic {name}")


@topic.command(name="subscribe")
@click.argument("name")
@click.argument("queue_name")
@connection_options
@click.pass_context
@reports_errors
def topic_subscribe(ctx: click.Context, name: str, queue_name: str) -> None:
    """Subscribe QUEUE_NAME to topic NAME."""
    info = client(ctx).subscribe(name, queue_name)
    click.echo(f"topic {name}: {', '.join(info['subscriptions'])}")


@topic.command(name="show")
@click.argument("name")
@json_option
@connection_options
@click.pass_context
@reports_errors
def topic_show(ctx: click.Context, name: str, as_json: bool) -> None:
    """A topic's subscriptions."""
    info = client(ctx).get_topic(name)
    if as_json:
        print_json(info)
    else:
        mapping(f"topic {name}", readable(info))


@click.group()
def policy() -> None:
    """Policies: queue arguments by name pattern (the lowest TTL wins)."""


@policy.command(name="set")
@click.argument("name")
@click.option("--pattern", required=True, help="Regular expression over queue names.")
@click.option("--definition", required=True, help='JSON, e.g. {"message_ttl_ms": 60000}.')
@click.option("--priority", type=int, default=0, show_default=True, help="Highest wins.")
@click.option("--operator", is_flag=True, help="An operator policy (merged: the stricter wins).")
@connection_options
@click.pass_context
@reports_errors
def policy_set(
    ctx: click.Context, name: str, pattern: str, definition: str, priority: int, operator: bool
) -> None:
    """Create or replace policy NAME."""
    try:
        parsed_definition = orjson.loads(definition)
    except orjson.JSONDecodeError:
        raise click.BadParameter("--definition must be JSON") from None
    client(ctx).put_policy(
        name, pattern=pattern, definition=parsed_definition, priority=priority, operator=operator
    )
    click.echo(f"policy {name}")


@policy.command(name="list")
@json_option
@connection_options
@click.pass_context
@reports_errors
def policy_list(ctx: click.Context, as_json: bool) -> None:
    """All policies."""
    policies = client(ctx).list_policies()
    if as_json:
        print_json(policies)
        return
    table(
        "policies",
        ["name", "pattern", "priority", "operator", "definition"],
        [
            (
                p.get("name"),
                p.get("pattern"),
                p.get("priority"),
                p.get("operator"),
                ", ".join(f"{k}={v}" for k, v in (p.get("definition") or {}).items()),
            )
            for p in policies
        ],
        keep=["name"],
    )


@policy.command(name="delete")
@click.argument("name")
@connection_options
@click.pass_context
@reports_errors
def policy_delete(ctx: click.Context, name: str) -> None:
    """Delete policy NAME."""
    client(ctx).delete_policy(name)
    click.echo(f"policy {name} deleted")
