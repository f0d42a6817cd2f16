"""The OpenAPI document, built once from the routes: FastAPI's generation, plus what it cannot
know of routes that read their bodies themselves (so the rules stay in ``tarry.model``):

- the request bodies' schemas, published in ``components/schemas`` where the routes'
  ``$ref``s point (a send's built from the field table);
- 400 ``invalid_argument`` where FastAPI would document 422: the server never sends 422
  (``server/errors.py`` turns FastAPI's validation errors into 400);
- 413 ``message_too_large`` on every operation with a body: each reads it through
  ``server/deps.py``, which refuses a body over the route's limit while reading it;
- names in paths with the syntax ``check_name`` accepts;
- the bearer token on every operation that can answer 401 (a server with tokens configured
  asks for one; without tokens it answers every caller);
- links from what makes a thing to what reads, changes or deletes it (``_LINKS``), so a client
  generator or a stateful fuzzer can follow an id or a name from one answer to the next.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from tarry.model.fields import NAME_MAX_CHARS, NAME_PATTERN
from tarry.server import schemas
from tarry.server.send_schema import send_schema

__all__ = ["install_openapi"]

#: Path parameters that are queue, topic or policy names.
_NAMES = frozenset({"name", "queue"})
_REF = "#/components/schemas/{model}"

#: A body that works on any server (``tarry.error`` is always declared), for the models whose
#: rules JSON Schema cannot say (a cron expression, a reachable URL).
_EXAMPLES: dict[str, dict[str, Any]] = {
    "ScheduleBody": {
        "cron": "*/15 * * * *",
        "timezone": "Europe/Paris",
        "destination": "tarry.error",
        "body": "tick",
    },
    "RouteConfig": {
        "transport": "http",
        "url": "https://example.com/hooks/tarry",
        "timeout_ms": 5000,
        "rate_per_s": 10,
        "concurrency": 4,
        "on_failure_report_to": "tarry.error",
    },
}
_ID = {"message_id": "$response.body#/id"}
_NAME = {"name": "$request.path.name"}
#: (method, path) that makes a thing → the (method, path)s that take it, and how its name or
#: id is passed on.
_LINKS: dict[tuple[str, str], tuple[dict[str, str], list[tuple[str, str]]]] = {
    ("post", "/v1/messages"): (
        _ID,
        [
            ("get", "/v1/messages/{message_id}"),
            ("get", "/v1/messages/{message_id}/body"),
            ("post", "/v1/messages/{message_id}/reschedule"),
            ("delete", "/v1/messages/{message_id}"),
        ],
    ),
    ("put", "/v1/queues/{name}"): (
        _NAME,
        [
            ("get", "/v1/queues/{name}"),
            ("post", "/v1/queues/{name}/receive"),
            ("post", "/v1/queues/{name}/redrive"),
            ("delete", "/v1/queues/{name}"),
        ],
    ),
    ("put", "/v1/topics/{name}"): (_NAME, [("get", "/v1/topics/{name}")]),
    ("put", "/v1/policies/{name}"): (_NAME, [("delete", "/v1/policies/{name}")]),
    ("put", "/v1/routes/{name}"): (
        _NAME,
        [("get", "/v1/routes/{name}"), ("delete", "/v1/routes/{name}")],
    ),
    ("put", "/v1/schedules/{name}"): (
        _NAME,
        [("get", "/v1/schedules/{name}"), ("delete", "/v1/schedules/{name}")],
    ),
}


def _components() -> dict[str, Any]:
    _, top = models_json_schema(
        [(model, "validation") for model in schemas.REQUEST_MODELS], ref_template=_REF
    )
    found: dict[str, Any] = top.get("$defs", {})
    found["SendMessage"] = send_schema()
    found["SendBatch"] = schemas.batch_schema()
    for model, example in _EXAMPLES.items():
        found[model]["examples"] = [example]
    return found


def _fix_operation(op: dict[str, Any]) -> None:
    responses = op.get("responses", {})
    if "401" in responses:
        op["security"] = [{"bearer": []}]
    if "422" in responses:
        del responses["422"]
        responses.setdefault("400", _bad_request())
    if "requestBody" in op:
        responses.setdefault("413", _error(413, "the request body is over the route's limit"))
    for param in op.get("parameters", []):
        if param.get("in") == "path" and param.get("name") in _NAMES:
            param["schema"] = {
                "type": "string",
                "minLength": 1,
                "maxLength": NAME_MAX_CHARS,
                "pattern": NAME_PATTERN,
                "title": param["schema"].get("title", param["name"]),
            }


def _bad_request() -> dict[str, Any]:
    return _error(400, "the request is invalid (the message says what to fix)")


def _error(status: int, text: str) -> dict[str, Any]:
    codes = ", ".join(schemas.error_statuses()[status])
    return {
        "description": f"{text}: {codes}",
        "content": {"application/json": {"schema": {"$ref": _REF.format(model="Error")}}},
    }


def build(app: FastAPI) -> dict[str, Any]:
    """The document of ``app``'s routes, as ``GET /openapi.json`` serves it."""
    doc = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    doc["components"]["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer", "description": "a token of [[auth.tokens]]"}
    }
    components = doc["components"].setdefault("schemas", {})
    components.update(_components())
    for name in ("HTTPValidationError", "ValidationError"):
        components.pop(name, None)
    for operations in doc["paths"].values():
        for op in operations.values():
            _fix_operation(op)
    _link(doc["paths"])
    return doc


def _link(paths: dict[str, Any]) -> None:
    for (method, path), (parameters, targets) in _LINKS.items():
        links = {}
        for target_method, target_path in targets:
            target = paths[target_path][target_method]["operationId"]
            links[target] = {"operationId": target, "parameters": parameters}
        for status, response in paths[path][method]["responses"].items():
            if status.startswith("2"):
                response["links"] = links


def install_openapi(app: FastAPI) -> None:
    """Serve ``build(app)`` (made on first request) as the app's document."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
