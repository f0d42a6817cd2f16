"""The CLI's read verbs against a real server read like the console: RFC 3339 times, ids never
cut in a narrow terminal, and ``--json`` on every one of them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import click
import httpx

from tarry.cli.main import cli

RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
#: The read verbs (``tarry`` + these words), each with the arguments a call needs.
READS = {
    ("show",): ["{id}"],
    ("ls",): [],
    ("stats",): [],
    ("queue", "show"): ["orders"],
    ("queue", "list"): [],
    ("topic", "show"): ["news"],
    ("policy", "list"): [],
}


def _cli(url: str, *args: str, columns: int = 80) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tarry.cli.main", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": str(columns)},
    )


def _setup(url: str) -> str:
    with httpx.Client(base_url=url, timeout=30) as c:
        c.put("/v1/queues/orders.dead", json={}).raise_for_status()
        c.put("/v1/queues/orders", json={"dead_letter_to": "orders.dead"}).raise_for_status()
        c.put("/v1/topics/news").raise_for_status()
        c.put("/v1/policies/short", json={"pattern": "^orders$", "definition": {}})
        sent = c.post(
            "/v1/messages",
            json={"destination": "orders", "body": "hi", "delay_ms": 60_000, "ttl_ms": 120_000},
        )
        return str(sent.json()["id"])


def test_show_prints_times_as_rfc_3339_not_epoch_milliseconds(server) -> None:
    message_id = _setup(server.url)
    shown = _cli(server.url, "show", message_id, columns=120)
    assert shown.returncode == 0, shown.stderr
    raw = httpx.get(f"{server.url}/v1/messages/{message_id}").json()
    for field in ("deliver_at", "expires_at", "sent_at"):
        assert str(raw[field]) not in shown.stdout
    assert len(RFC3339.findall(shown.stdout)) >= 3


def test_ls_never_cuts_the_id_in_a_narrow_terminal(server) -> None:
    message_id = _setup(server.url)
    for columns in (60, 40, 30):
        listed = _cli(server.url, "ls", "--destination", "orders", columns=columns)
        assert listed.returncode == 0, listed.stderr
        assert message_id in listed.stdout, f"COLUMNS={columns}:\n{listed.stdout}"
        if columns == 60:  # still a table, that fits
            assert "┃" in listed.stdout
            assert all(len(line) <= columns for line in listed.stdout.splitlines())
    queues = _cli(server.url, "queue", "list", columns=30)
    assert "orders.dead" in queues.stdout


def test_every_read_verb_prints_json_with_json(server) -> None:
    message_id = _setup(server.url)
    for words, args in READS.items():
        got = _cli(server.url, *words, *[a.format(id=message_id) for a in args], "--json")
        assert got.returncode == 0, (words, got.stderr)
        json.loads(got.stdout)
        plain = _cli(server.url, *words, *[a.format(id=message_id) for a in args])
        assert plain.returncode == 0 and plain.stdout.strip(), words
        assert not plain.stdout.lstrip().startswith(("{", "[")), (words, "a table by default")


def test_every_read_verb_of_the_cli_takes_json() -> None:
    found = set()

    def walk(command: click.Command, path: tuple[str, ...]) -> None:
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, (*path, name))
        elif path and path[-1] in ("show", "ls", "list", "stats", "inspect"):
            found.add(path)
            assert any("--json" in p.opts for p in command.params), path

    walk(cli, ())
    assert set(READS) <= found
