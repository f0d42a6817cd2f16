"""Topics, subscriptions and policies (``Engine.declare_topic`` and its relatives), given the
engine's context. A policy change reaches the messages already in the queues it changes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tarry.engine.context import EngineContext
from tarry.engine.queue_admin import declare_queue
from tarry.errors import NotFound, PreconditionFailed
from tarry.model.queue_args import Policy, parse_policy
from tarry.model.validate import check_name
from tarry.queues.catalog import save_policy, save_subscription, save_topic
from tarry.queues.ttl_change import restamp_expiry
from tarry.store.sql import QueueConnection

__all__ = [
    "change_policies",
    "declare_configured",
    "declare_topic",
    "delete_policy",
    "list_policies",
    "list_topics",
    "put_policy",
    "subscribe",
    "topic_info",
    "unsubscribe",
]


async def declare_topic(ctx: EngineContext, name: str) -> tuple[dict[str, Any], bool]:
    check_name(name, field="topic name")
    if name in ctx.catalog.queues or name in ctx.transports:
        raise PreconditionFailed(f"{name!r} is already a queue or a route; choose another name")
    if name in ctx.catalog.topics:
        return await topic_info(ctx, name), False
    now = ctx.clock.now_ms()
    await ctx.qdb.write(lambda conn: save_topic(conn, name, now), durable=True)
    ctx.catalog.topics[name] = set()
    ctx.catalog.topic_created_ms[name] = now
    return await topic_info(ctx, name), True


async def list_topics(ctx: EngineContext) -> list[dict[str, Any]]:
    return [await topic_info(ctx, name) for name in sorted(ctx.catalog.topics)]


async def topic_info(ctx: EngineContext, name: str) -> dict[str, Any]:
    if name not in ctx.catalog.topics:
        raise NotFound(f"no topic named {name!r}")
    return {
        "name": name,
        "subscriptions": sorted(ctx.catalog.topics[name]),
        "created_at": ctx.catalog.topic_created_ms.get(name),
    }


async def subscribe(ctx: EngineContext, topic: str, queue: str) -> dict[str, Any]:
    if topic not in ctx.catalog.topics:
        raise NotFound(f"no topic named {topic!r}; declare it first")
    if queue not in ctx.catalog.queues:
        raise NotFound(f"no queue named {queue!r}; declare it first")
    await ctx.qdb.write(lambda conn: save_subscription(conn, topic, queue, True), durable=True)
    ctx.catalog.topics[topic].add(queue)
    return await topic_info(ctx, topic)


async def unsubscribe(ctx: EngineContext, topic: str, queue: str) -> None:
    check_name(queue, field="queue name")
    if topic not in ctx.catalog.topics:
        raise NotFound(f"no topic named {topic!r}")
    await ctx.qdb.write(lambda conn: save_subscription(conn, topic, queue, False), durable=True)
    ctx.catalog.topics[topic].discard(queue)


async def put_policy(ctx: EngineContext, name: str, data: Mapping[str, Any]) -> Policy:
    policy = parse_policy(name, data)
    await change_policies(ctx, name, policy)
    return policy


async def delete_policy(ctx: EngineContext, name: str) -> None:
    if name not in ctx.catalog.policies:
        raise NotFound(f"no policy named {name!r}")
    await change_policies(ctx, name, None)


async def change_policies(ctx: EngineContext, name: str, policy: Policy | None) -> None:
    before = {q: e.effective.message_ttl_ms for q, e in ctx.catalog.queues.items()}
    candidate = dict(ctx.catalog.policies)
    if policy is None:
        candidate.pop(name, None)
    else:
        candidate[name] = policy
    changed: list[tuple[str, int | None]] = []

    def work(conn: QueueConnection) -> None:
        save_policy(conn, policy, name)
        for queue, ttl in changed:
            restamp_expiry(conn, queue, ttl)

    old = ctx.catalog.policies
    ctx.catalog.policies = candidate
    ctx.catalog.recompute()
    changed.extend(
        (q, e.effective.message_ttl_ms)
        for q, e in ctx.catalog.queues.items()
        if e.effective.message_ttl_ms != before.get(q)
    )
    try:
        await ctx.qdb.write(work, durable=True)
    except BaseException:
        ctx.catalog.policies = old
        ctx.catalog.recompute()
        raise


async def list_policies(ctx: EngineContext) -> list[Policy]:
    return [ctx.catalog.policies[n] for n in sorted(ctx.catalog.policies)]


async def declare_configured(ctx: EngineContext) -> None:
    """The error queue, and the queues, topics and subscriptions ``tarry.toml`` names (at
    start: each declare is idempotent, a changed one is refused as for the API)."""
    error_queue = ctx.config.dispatch.error_queue
    if error_queue not in ctx.catalog.queues:
        await declare_queue(ctx, error_queue, {})
    for name, args in ctx.config.queues.items():
        await declare_queue(ctx, name, args)
    for topic, queues in ctx.config.topics.items():
        await declare_topic(ctx, topic)
        for queue in queues:
            if queue not in ctx.catalog.queues:
                await declare_queue(ctx, queue, {})
            await subscribe(ctx, topic, queue)
