"""What an operator reads of the engine: ``/healthz`` and ``/v1/stats`` (``/metrics`` reads
both)."""

from __future__ import annotations

from typing import Any

from tarry.dispatch.breaker import Breakers
from tarry.dispatch.dispatcher import DispatchStats
from tarry.engine.context import EngineContext
from tarry.engine.release_path import ReleasePath
from tarry.model.state import MessageState
from tarry.queues.lag import refusal_limit_ms

__all__ = ["health", "stats"]


def health(
    ctx: EngineContext, *, breakers: Breakers, release_lag_ms: int, ingress: Any
) -> dict[str, Any]:
    """``/healthz``: ok, or degraded naming what is open and why."""
    open_names = breakers.open_names()
    if ingress is not None and not ingress.consuming:
        open_names.append("ingress")  # enabled, but not consuming from RabbitMQ now
    reasons = breakers.reasons()
    lag_ms, threshold = release_lag_ms, ctx.config.dispatch.overload_lag_ms
    if threshold and lag_ms > threshold:  # sends are refused with 429 overloaded
        open_names.append("overload")
        reasons["overload"] = f"releases are {lag_ms} ms behind (limit {threshold} ms)"
    # Queues by count only: /healthz is open to every caller, and names belong to tenants.
    behind = ctx.waiters.lag.behind(refusal_limit_ms(threshold))
    # Files a store found damaged (it serves the rest): named until an operator acts.
    damaged = list(getattr(ctx.store, "damaged", []))
    return {
        "status": "degraded" if open_names or damaged else "ok",
        "open": open_names,
        "breakers": breakers.snapshot(),
        # Why each open breaker is open ("disk full: the log store cannot write ...").
        "reasons": reasons,
        "damaged": damaged,
        "release_lag_ms": lag_ms,
        "delivery_lag_ms": ctx.waiters.lag.worst_ms(),
        "queues_behind": len(behind),
        # Rows of local queues kept in memory, not yet written to the queue database.
        "queue_rows_in_memory": {} if ctx.memory is None else ctx.memory.sizes(),
    }


async def stats(
    ctx: EngineContext,
    path: ReleasePath,
    *,
    dispatch: DispatchStats,
    journal: Any,
    health: dict[str, Any],
) -> dict[str, Any]:
    """``/v1/stats``: counts by state, the catalog's sizes, the dispatcher's figures."""

    by_state = await path.counts_by_state()
    d = dispatch
    return {
        "messages": {s.value: by_state.get(s.value, 0) for s in MessageState},
        "queues": len(ctx.catalog.queues),
        "topics": len(ctx.catalog.topics),
        "policies": len(ctx.catalog.policies),
        "routes": sorted(ctx.transports),
        "consumers_waiting": sum(ctx.waiters.count.values()),
        # Each queue being consumed and how late its consumers would receive a message now.
        "delivery_lag_ms": ctx.waiters.lag.snapshot(),
        "dispatch": {
            "rounds": d.rounds,
            "released": d.released,
            "delivered": d.delivered,
            "failures": d.failures,
            "gave_up": d.gave_up,
            "held": d.held,
        },
        "store_commits": getattr(getattr(ctx.qdb, "db", None), "commits", 0),
        "journal_dropped": getattr(journal, "dropped", 0),
        # The log store's fsyncs, group commits and snapshot durations (``/metrics``).
        "store_write_path": write_path()
        if (write_path := getattr(ctx.store, "write_path", None))
        else None,
        "health": health,
    }
