"""An engine on a real SQLite file (or, where a module asks through ``engine_store``, on its
own database of the real PostgreSQL server), driven step by step with a ManualClock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tarry.config import load_config
from tarry.engine.core import Engine
from tarry.model.time import ManualClock

EngineFactory = Callable[..., Any]


class Recorder:
    """An event listener that remembers every (event, id, queue, reason)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str | None, str | None]] = []

    def __call__(
        self, event: str, message: Any, time_ms: int, queue: str | None, reason: str | None
    ) -> None:
        self.events.append((event, message.id, queue, reason))

    def of(self, event: str) -> list[tuple[str, str, str | None, str | None]]:
        return [e for e in self.events if e[0] == event]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000_000)


@pytest.fixture(params=["log", "sqlite"])
def engine_store(request: pytest.FixtureRequest) -> str:
    """Which store engines run on (the embedded ones by default); a module overrides this to
    run its tests on PostgreSQL as well (``BOTH_STORES``)."""
    return str(request.param)


#: Parameters for a module-level ``engine_store`` override: the same tests on every store.
BOTH_STORES = ["log", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture
async def make_engine(
    tmp_path: Path, clock: ManualClock, engine_store: str, request: pytest.FixtureRequest
) -> AsyncIterator[EngineFactory]:
    store: dict[str, Any] = {"engine": engine_store}
    if engine_store == "postgres":
        store = {"engine": "postgres", "dsn": request.getfixturevalue("pg_dsn")}
    engines: list[Engine] = []

    async def factory(
        overrides: dict[str, Any] | None = None, *, data_dir: Path | None = None
    ) -> Engine:
        base = {
            "server": {"data_dir": str(data_dir or tmp_path / "data")},
            "journal": {"enabled": False},
            "store": store,
        }
        config = load_config(None, _merge(base, overrides or {}))
        engine = Engine.from_config(config, clock=clock)
        engine.recorder = Recorder()  # type: ignore[attr-defined]
        engine.add_listener(engine.recorder)  # type: ignore[attr-defined]
        await engine.start(background=False)
        engines.append(engine)
        return engine

    yield factory
    for engine in engines:
        db = engine.qdb.db  # SQLite's Database or PostgreSQL's PgDatabase
        if getattr(db, "_conn", None) is not None or getattr(db, "_sync", None) is not None:
            assert await engine.qdb.check() == []
            assert await engine.store.check() == []
            await engine.stop()


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
