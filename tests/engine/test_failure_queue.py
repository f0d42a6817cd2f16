"""Where a delivery failure goes (``EngineContext.failure_queue``): the destination's own
dead-letter queue (a route's ``dead_letter_to``, a local queue's ``dead_letter_to`` in force)
so a tenant reads its own failures; the shared error queue otherwise, and whenever the named
queue does not exist (a failure is never dropped)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def engine_store() -> str:
    return "sqlite"  # the choice is the engine's, the same on every store


def hook(**extra: Any) -> dict[str, Any]:
    return {"transport": "http", "url": "https://hooks.example.com/x", **extra}


async def test_each_destination_has_its_failures_home(make_engine: Any) -> None:
    engine = await make_engine(
        {
            "routes": {
                "billing.hook": hook(dead_letter_to="billing.failures"),
                "orders.hook": hook(dead_letter_to="orders.nowhere"),
                "plain.hook": hook(),
            },
            "queues": {
                "billing.failures": {},
                "billing.q": {"dead_letter_to": "billing.dead"},
                "billing.dead": {},
                "plain.q": {},
            },
        }
    )
    home = engine.ctx.failure_queue
    assert home("billing.hook") == "billing.failures"
    assert home("billing.q") == "billing.dead"
    # Not declared as a queue: the error queue, not a lost message
    assert home("orders.hook") == "tarry.error"
    # Nothing configured, or not a destination at all: the error queue, as before
    assert home("plain.hook") == "tarry.error"
    assert home("plain.q") == "tarry.error"
    assert home("gone") == "tarry.error"
    # The dead-letter overview lists a route's dead-letter queue too
    listed = [d["queue"] for d in await engine.dead_letters()]
    assert listed == ["billing.dead", "billing.failures", "tarry.error"]
