"""The ``tarry`` command."""

from __future__ import annotations

import click

from tarry.cli.serve import serve


@click.group()
def cli() -> None:
    """tarry: durable delayed-message delivery."""


cli.add_command(serve)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
