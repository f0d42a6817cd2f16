"""What exists: queues (with their arguments and the policies in force), topics with their
subscriptions, policies, and the routes put at run time (as stored; ``engine.routes`` turns
them into transports). Kept in memory for the hot path, written through to the database.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import orjson

from tarry.errors import InvalidArgument
from tarry.model.queue_args import (
    EffectiveQueueArgs,
    Overflow,
    Policy,
    QueueArgs,
    effective_args,
    parse_policy,
)
from tarry.store.sql import SqlConnection

__all__ = ["Catalog", "QueueEntry", "save_route"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class QueueEntry:
    name: str
    args: QueueArgs
    created_at_ms: int
    last_used_ms: int
    effective: EffectiveQueueArgs = field(default_factory=EffectiveQueueArgs)


class Catalog:
    def __init__(self) -> None:
        self.queues: dict[str, QueueEntry] = {}
        self.topics: dict[str, set[str]] = {}
        self.topic_created_ms: dict[str, int] = {}
        self.policies: dict[str, Policy] = {}
        #: Routes put at run time: name → the route's JSON as stored (secrets included).
        self.routes: dict[str, str] = {}

    # --- reading -------------------------------------------------------------------------------
    def effective(self, queue: str) -> EffectiveQueueArgs | None:
        entry = self.queues.get(queue)
        return entry.effective if entry else None

    def kind(self, name: str) -> str | None:
        if name in self.queues:
            return "queue"
        if name in self.topics:
            return "topic"
        return None

    def take(self, fresh: Catalog) -> None:
        """Become ``fresh`` (a reload), in place: every holder of this catalog sees it."""
        self.queues = fresh.queues
        self.topics = fresh.topics
        self.topic_created_ms = fresh.topic_created_ms
        self.policies = fresh.policies
        self.routes = fresh.routes

    def recompute(self) -> None:
        policies = list(self.policies.values())
        for entry in self.queues.values():
            entry.effective = effective_args(entry.name, entry.args, policies)

    # --- loading and persisting (run on the database thread) -----------------------------------
    def load(self, conn: SqlConnection, *, now_ms: int) -> None:
        """Read everything back; a restart renews every unused queue's lease (its last use
        is kept in memory only, so it counts from ``now_ms``)."""
        for name, args, created in conn.execute("SELECT name, args, created_at_ms FROM queues"):
            self.queues[name] = QueueEntry(name, _args_from_json(args), created, now_ms)
        for name, created in conn.execute("SELECT name, created_at_ms FROM topics"):
            self.topics[name] = set()
            self.topic_created_ms[name] = created
        for topic, queue in conn.execute("SELECT topic, queue FROM subscriptions"):
            self.topics.setdefault(topic, set()).add(queue)
        for name, definition in conn.execute("SELECT name, definition FROM policies"):
            try:
                self.policies[name] = parse_policy(name, orjson.loads(definition))
            except InvalidArgument as exc:
                # Stored by a version with laxer rules (a Python-only regex, say): starting
                # without it, said at every start, beats not starting, where nothing could fix it.
                log.error(
                    "policy %r is not in force: %s; set it again (PUT /v1/policies/%s)",
                    name,
                    exc.message,
                    name,
                )
        for name, definition in conn.execute("SELECT name, definition FROM routes"):
            self.routes[name] = definition
        self.recompute()


def save_queue(conn: SqlConnection, entry: QueueEntry) -> None:
    conn.execute(
        "INSERT INTO queues (name, args, created_at_ms, last_used_ms) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(name) DO UPDATE SET args = excluded.args, "
        "last_used_ms = excluded.last_used_ms",
        (
            entry.name,
            orjson.dumps(entry.args.to_dict()).decode(),
            entry.created_at_ms,
            entry.last_used_ms,
        ),
    )


def delete_queue_rows(conn: SqlConnection, name: str) -> None:
    conn.execute("DELETE FROM queues WHERE name = ?", (name,))
    conn.execute("DELETE FROM subscriptions WHERE queue = ?", (name,))


def save_topic(conn: SqlConnection, name: str, created_ms: int) -> None:
    conn.execute(
        "INSERT INTO topics (name, created_at_ms) VALUES (?, ?) ON CONFLICT DO NOTHING",
        (name, created_ms),
    )


def save_subscription(conn: SqlConnection, topic: str, queue: str, present: bool) -> None:
    if present:
        conn.execute(
            "INSERT INTO subscriptions (topic, queue) VALUES (?, ?) ON CONFLICT DO NOTHING",
            (topic, queue),
        )
    else:
        conn.execute("DELETE FROM subscriptions WHERE topic = ? AND queue = ?", (topic, queue))


def save_policy(conn: SqlConnection, policy: Policy | None, name: str) -> None:
    if policy is None:
        conn.execute("DELETE FROM policies WHERE name = ?", (name,))
        return
    data = policy.to_dict()
    data.pop("name")
    conn.execute(
        "INSERT INTO policies (name, definition) VALUES (?, ?) "
        "ON CONFLICT(name) DO UPDATE SET definition = excluded.definition",
        (name, orjson.dumps(data).decode()),
    )


def save_route(conn: SqlConnection, name: str, definition: str | None, now_ms: int) -> None:
    """Store a route's JSON (``None``: delete it)."""
    if definition is None:
        conn.execute("DELETE FROM routes WHERE name = ?", (name,))
        return
    conn.execute(
        "INSERT INTO routes (name, definition, updated_at_ms) VALUES (?, ?, ?) "
        "ON CONFLICT(name) DO UPDATE SET definition = excluded.definition, "
        "updated_at_ms = excluded.updated_at_ms",
        (name, definition, now_ms),
    )


def _args_from_json(text: str) -> QueueArgs:
    data = orjson.loads(text)
    overflow = data.get("overflow")
    return QueueArgs(
        message_ttl_ms=data.get("message_ttl_ms"),
        expires_ms=data.get("expires_ms"),
        dead_letter_to=data.get("dead_letter_to"),
        max_length=data.get("max_length"),
        overflow=Overflow(overflow) if overflow else None,
        max_message_bytes=data.get("max_message_bytes"),
        put_enabled=data.get("put_enabled", True),
    )
