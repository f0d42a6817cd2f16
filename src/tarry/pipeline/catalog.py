"""The destinations an import sends to, as the send rules see them, fixed at the import's start.

A topic's targets are its subscriptions at that moment (JMS: only subscriptions that exist at send
time receive a copy). Queue fullness is left out on purpose: it changes while the import runs, so
the online sink meets ``destination_full`` from the server and backs off instead of refusing rows
up front.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tarry.client import Client
from tarry.errors import InvalidArgument, NotAuthorized, NotFound
from tarry.model.validate import DestinationView, TargetView
from tarry.queues.catalog import Catalog

__all__ = ["views_from_server", "views_from_store", "views_to_json", "views_from_json"]


def _target(name: str, effective: Mapping[str, Any]) -> TargetView:
    return TargetView(
        name,
        put_enabled=bool(effective.get("put_enabled", True)),
        max_message_bytes=effective.get("max_message_bytes"),
    )


def views_from_server(client: Client, names: Iterable[str]) -> dict[str, DestinationView]:
    """Look up ``names`` on a running server: its queues in one call, then each topic. A name
    that is neither is left out (the rules answer ``unknown_destination``)."""
    queues = {q.name: _target(q.name, q.effective) for q in client.list_queues()}
    routes = {route["name"] for route in client.list_routes()}
    views: dict[str, DestinationView] = {}
    for name in names:
        if name in routes:
            views[name] = DestinationView(name, "route")
        elif name in queues:
            views[name] = DestinationView(name, "queue", (queues[name],))
        else:
            try:
                topic = client.get_topic(name)
            except NotFound:
                continue
            except NotAuthorized:
                # The token may neither send to nor read this name (who may send may inspect),
                # so the server refuses its rows with not_authorized; a view without local
                # checks (as a route's) lets them reach it and get that answer.
                views[name] = DestinationView(name, "route")
                continue
            subscribed = sorted(topic.get("subscriptions") or ())
            views[name] = DestinationView(
                name,
                "topic",
                tuple(queues.get(q) or TargetView(q) for q in subscribed),
            )
    return views


def views_from_store(
    data_dir: Path, names: Iterable[str] | None, *, now_ms: int
) -> dict[str, DestinationView]:
    """The same from a data directory's catalog (``queues.db`` of the log store), read-only:
    for the offline sink, with the server stopped or running. ``names`` None: every queue and
    topic the catalog holds."""
    path = data_dir / "queues.db"
    if not path.exists():
        raise InvalidArgument(
            f"{str(data_dir)!r} holds no log store catalog (queues.db); give the data directory "
            "of a tarry serve that uses the log store, and declare the destinations first"
        )
    catalog = Catalog()
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        catalog.load(conn, now_ms=now_ms)
    views: dict[str, DestinationView] = {}
    for name in [*catalog.queues, *catalog.topics] if names is None else names:
        kind = catalog.kind(name)
        if kind == "queue":
            views[name] = DestinationView(name, kind, (_stored_target(catalog, name),))
        elif kind == "topic":
            subscribed = sorted(catalog.topics[name])
            views[name] = DestinationView(
                name, kind, tuple(_stored_target(catalog, q) for q in subscribed)
            )
    return views


def _stored_target(catalog: Catalog, queue: str) -> TargetView:
    effective = catalog.effective(queue)
    if effective is None:
        return TargetView(queue)
    return TargetView(
        queue, put_enabled=effective.put_enabled, max_message_bytes=effective.max_message_bytes
    )


def views_to_json(views: Mapping[str, DestinationView]) -> list[dict[str, Any]]:
    """Plain data, to ship to the executors with the task."""
    return [
        {
            "name": v.name,
            "kind": v.kind,
            "targets": [[t.name, t.put_enabled, t.max_message_bytes] for t in v.targets],
        }
        for v in views.values()
    ]


def views_from_json(data: Iterable[Mapping[str, Any]]) -> dict[str, DestinationView]:
    return {
        d["name"]: DestinationView(
            d["name"],
            d["kind"],
            tuple(TargetView(n, put_enabled=p, max_message_bytes=m) for n, p, m in d["targets"]),
        )
        for d in data
    }
