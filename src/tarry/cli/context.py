"""What every verb shares: the client built from --url/--token, and one way to report errors
(``code: message`` on stderr, a non-zero exit status)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import click

from tarry.client import Client
from tarry.errors import InvalidArgument, TarryError, Unavailable

P = ParamSpec("P")
R = TypeVar("R")

#: Exit statuses: 1 the server refused, 2 the command line is wrong, 3 tarry cannot be reached.
EXIT_REFUSED, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3


def fail(exc: TarryError) -> None:
    click.echo(f"{exc.code}: {exc.message}", err=True)
    if isinstance(exc, Unavailable):
        sys.exit(EXIT_UNREACHABLE)
    sys.exit(EXIT_REFUSED)


def reports_errors(func: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except TarryError as exc:
            fail(exc)
            raise  # unreachable: fail exits

    return wrapper


def usage_error(exc: InvalidArgument) -> None:
    click.echo(f"{exc.code}: {exc.message}", err=True)
    sys.exit(EXIT_USAGE)


def parsed(parse: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """Parse a command-line value with the model's parser; a bad one exits with status 2."""
    try:
        return parse(*args, **kwargs)
    except InvalidArgument as exc:
        usage_error(exc)
        raise


def client(ctx: click.Context) -> Client:
    obj: dict[str, Any] = ctx.ensure_object(dict)
    if "client" not in obj:
        obj["client"] = Client(
            obj.get("url") or "http://127.0.0.1:7420", obj.get("token"), ca=obj.get("ca")
        )
        ctx.call_on_close(obj["client"].close)
    return obj["client"]  # type: ignore[no-any-return]


def _remember(key: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def callback(ctx: click.Context, _: click.Parameter, value: Any) -> None:
        if value is not None:
            ctx.ensure_object(dict)[key] = value

    return callback


def connection_options(func: Callable[P, R]) -> Callable[P, R]:
    """``--url`` and ``--token`` on the verb itself (they also work before the verb)."""
    func = click.option(
        "--token",
        expose_value=False,
        callback=_remember("token"),
        help="Bearer token (env TARRY_TOKEN).",
    )(func)
    return click.option(
        "--url",
        expose_value=False,
        callback=_remember("url"),
        help="The server, default http://127.0.0.1:7420 (env TARRY_URL).",
    )(func)
