"""The layout's import direction, checked: a package imports only from the layers below it
(and, for siblings marked independent, never from each other), so shared types live low
(``model``) and nothing below the engine reaches up into it. Every ``tarry.*`` import counts,
also one inside a function or under ``TYPE_CHECKING``.

Layers, lowest first (``|``: independent siblings; ``,``: siblings that may import each other)::

    errors
    model
    config
    store
    queues | transports | journal
    dispatch
    engine
    server, client, pipeline, cli      (the edges; ``tarry/__init__.py`` re-exports the client)
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


@dataclass(frozen=True)
class Layer:
    packages: frozenset[str]
    #: Siblings may not import one another.
    independent: bool = True


LAYERS = (
    Layer(frozenset({"errors"})),
    Layer(frozenset({"model"})),
    Layer(frozenset({"config"})),
    Layer(frozenset({"store"})),
    Layer(frozenset({"queues", "transports", "journal"})),
    Layer(frozenset({"dispatch"})),
    Layer(frozenset({"engine"})),
    Layer(frozenset({"server", "client", "pipeline", "cli"}), independent=False),
)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def violations(root: Path, top: str, layers: tuple[Layer, ...] = LAYERS) -> list[str]:
    """Each import in package ``root`` (named ``top``) that breaks ``layers``, as
    ``file:line: a -> b``. A module directly under ``root`` is its own package (``errors.py``);
    ``__init__.py`` of ``root`` itself is the top and may import anything."""
    rank = {pkg: (i, layer) for i, layer in enumerate(layers) for pkg in layer.packages}
    out = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts == ("__init__",):
            continue
        source = parts[0]
        if source not in rank:
            out.append(f"{path}: package {source!r} is in no layer; add it to LAYERS")
            continue
        here, layer = rank[source]
        for line, module in _imports(path):
            names = module.split(".")
            if names[0] != top or len(names) < 2 or names[1] == source:
                continue
            target = names[1]
            there = rank.get(target)
            upward = there is None or there[0] > here
            sibling = there is not None and there[0] == here and layer.independent
            if upward or sibling:
                out.append(f"{path.relative_to(root.parent)}:{line}: {source} -> {module}")
    return out


def test_tarry_imports_only_downward() -> None:
    assert violations(SRC / "tarry", "tarry") == []


def _fixture_package(root: Path, inverted: bool) -> Path:
    package = root / "shop"
    for name in ("model", "store", "engine"):
        (package / name).mkdir(parents=True)
        (package / name / "__init__.py").write_text("")
    (package / "__init__.py").write_text("from shop.engine.core import run\n")
    (package / "errors.py").write_text("class Oops(Exception): ...\n")
    (package / "model" / "query.py").write_text(
        "from shop.errors import Oops\n"
        + ("def late():\n    from shop.engine.core import run\n" if inverted else "")
    )
    (package / "store" / "base.py").write_text("from shop.model.query import Oops\n")
    (package / "engine" / "core.py").write_text("from shop.store.base import Oops\nrun = 1\n")
    return package


FIXTURE_LAYERS = (
    Layer(frozenset({"errors"})),
    Layer(frozenset({"model"})),
    Layer(frozenset({"store"})),
    Layer(frozenset({"engine"})),
)


def test_the_check_fails_on_a_deliberately_inverted_import(tmp_path: Path) -> None:
    clean = _fixture_package(tmp_path / "clean", inverted=False)
    assert violations(clean, "shop", FIXTURE_LAYERS) == []
    inverted = _fixture_package(tmp_path / "inverted", inverted=True)
    found = violations(inverted, "shop", FIXTURE_LAYERS)
    assert found == ["shop/model/query.py:3: model -> shop.engine.core"]


@pytest.mark.parametrize(
    ("victim", "line"),
    [
        ("model/query.py", "from tarry.engine.types import SendResult\n"),
        ("store/base.py", "from tarry.queues.txn import QueueTxn\n"),
        ("queues/catalog.py", "from tarry.journal.writer import Journal\n"),  # siblings
    ],
)
def test_the_check_fails_on_an_inverted_import_in_a_copy_of_tarry(
    tmp_path: Path, victim: str, line: str
) -> None:
    copy = tmp_path / "tarry"
    for path in (SRC / "tarry").rglob("*.py"):
        target = copy / path.relative_to(SRC / "tarry")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    (copy / victim).write_text((copy / victim).read_text() + line)
    found = violations(copy, "tarry")
    assert len(found) == 1 and found[0].startswith(f"tarry/{victim}:"), found


def test_a_package_outside_every_layer_is_reported(tmp_path: Path) -> None:
    package = _fixture_package(tmp_path, inverted=False)
    (package / "extra.py").write_text("")
    assert violations(package, "shop", FIXTURE_LAYERS) == [
        f"{package / 'extra.py'}: package 'extra' is in no layer; add it to LAYERS"
    ]


#: A string that starts as a SQL statement does (upper case, as tarry writes SQL; docstrings
#: that begin "Create ..." are prose).
_SQL = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|CREATE)\s")


def sql_strings(root: Path) -> list[str]:
    """Each string constant (f-string parts included) under ``root`` that starts a SQL
    statement, as ``file:line``: the engine leaves its SQL to ``queues`` and ``store``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if _SQL.match(node.value):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_the_engine_writes_no_sql_of_its_own() -> None:
    assert sql_strings(SRC / "tarry" / "engine") == []


def test_the_sql_check_finds_a_statement_written_in_the_engine(tmp_path: Path) -> None:
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "core.py").write_text(
        '"""PUT and DELETE of a route are the API\'s."""\n'
        "def last(conn, table):\n"
        '    return conn.execute(f"SELECT max(seq) FROM {table}").fetchone()\n'
    )
    assert sql_strings(engine) == ["engine/core.py:3"]
