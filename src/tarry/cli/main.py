"""The ``tarry`` command: the server (``serve``) and verbs that talk to it over HTTP."""

from __future__ import annotations

import click

from tarry.cli.messages import cancel, consume, ls, reschedule, send, show
from tarry.cli.pipeline import pipeline
from tarry.cli.queues import policy, queue, topic
from tarry.cli.rabbitmq import rabbitmq
from tarry.cli.redrive import redrive
from tarry.cli.serve import serve
from tarry.cli.stats import stats
from tarry.cli.store import store
from tarry.cli.token import token

EPILOG = (
    "Exit status: 0 success; 1 the server refused (the error code is printed on stderr); "
    "2 the command line is wrong; 3 tarry cannot be reached."
)


@click.group(epilog=EPILOG)
@click.option(
    "--url",
    envvar="TARRY_URL",
    default="http://127.0.0.1:7420",
    show_default=True,
    help="The server (env TARRY_URL).",
)
@click.option("--token", envvar="TARRY_TOKEN", help="Bearer token (env TARRY_TOKEN).")
@click.option(
    "--ca",
    envvar="TARRY_CA",
    help="PEM file to check an https server's certificate with, e.g. a self-signed one "
    "(env TARRY_CA; default: the system's trusted CAs).",
)
@click.version_option(package_name="tarry")
@click.pass_context
def cli(ctx: click.Context, url: str, token: str | None, ca: str | None) -> None:
    """tarry: durable delayed-message delivery."""
    ctx.ensure_object(dict).update(url=url, token=token, ca=ca)


for command in (
    serve,
    send,
    ls,
    show,
    cancel,
    reschedule,
    consume,
    redrive,
    queue,
    topic,
    policy,
    stats,
    store,
    token,
):
    cli.add_command(command)
cli.add_command(pipeline)
cli.add_command(rabbitmq)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
