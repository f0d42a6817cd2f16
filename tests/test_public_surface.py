"""The public surface is declared and checked: exports, error codes against api.md, CLI help."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

import tarry
from tarry.cli.main import cli
from tarry.errors import TarryError, error_class_for, registered_codes

API_MD = Path(__file__).resolve().parents[2] / "shared" / "api.md"
README = Path(__file__).resolve().parents[1] / "README.md"


def test_tarry_exports_exactly_the_sorted_public_names() -> None:
    public = sorted(
        name
        for name in dir(tarry)
        if not name.startswith("_")
        and name
        not in {
            "client",
            "errors",
            "model",
            "engine",
            "store",
            "queues",
            "dispatch",
            "transports",
            "server",
            "cli",
            "journal",
            "config",
            "pipeline",
        }
    )
    assert tarry.__all__ == sorted(tarry.__all__)
    assert sorted(set(tarry.__all__) - {"__version__"}) == public


def test_every_error_code_of_api_md_is_registered_with_its_status() -> None:
    if not API_MD.exists():
        pytest.skip(f"api.md not found at {API_MD}")
    text = API_MD.read_text()
    section = text[text.index("Error codes:") :]
    section = section[: section.index("\n\n")]
    pairs = re.findall(r"`([a-z_]+)`(?: / `([a-z_]+)`)? \((\d{3})", section)
    assert len(pairs) >= 12
    for first, second, status in pairs:
        for code in filter(None, (first, second)):
            assert code in registered_codes(), code
            assert error_class_for(code).http_status == int(status), code


def test_every_error_class_says_when_it_is_raised() -> None:
    for code in registered_codes():
        cls = error_class_for(code)
        assert issubclass(cls, TarryError)
        assert (cls.__doc__ or "").startswith("Raised when"), cls.__name__


def _commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    found = []
    for name, command in group.commands.items():
        found.append((f"{prefix}{name}", command))
        if isinstance(command, click.Group):
            found += _commands(command, f"{prefix}{name} ")
    return found


def test_every_cli_verb_and_option_has_help_and_appears_in_the_readme() -> None:
    readme = README.read_text()
    for name, command in _commands(cli):
        assert command.help, name
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help, f"{name} {param.opts}"
        top = name.split()[0]
        assert f"tarry {top}" in readme or f"scripts/{top}" in readme, name
