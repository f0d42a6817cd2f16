"""``tarry token hash``: the ``token_sha256`` to put in ``tarry.toml`` instead of the token."""

from __future__ import annotations

import click

from tarry.config import token_sha256


@click.group()
def token() -> None:
    """Bearer tokens for [[auth.tokens]]."""


@token.command("hash")
@click.option(
    "--token",
    "secret",
    envvar="TARRY_TOKEN",
    prompt="token",
    hide_input=True,
    help="The token to hash (env TARRY_TOKEN; asked for, unechoed, when not given).",
)
def hash_(secret: str) -> None:
    """Print the SHA-256 of a token, for token_sha256 = "..." in tarry.toml."""
    if not secret.strip():
        raise click.BadParameter("the token must not be empty", param_hint="--token")
    click.echo(token_sha256(secret))
