"""The OpenAPI document against a real ``tarry serve``: it describes what the server sends
(response models, every status, the error codes), its references resolve, and schemathesis,
generating requests from it for every operation, finds no server error and no answer that
breaks it (issue 26, finding 12)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tarry.errors import error_class_for, registered_codes
from tests.conftest import ServerProcess

HERE = Path(__file__).parent
TOKEN = "fuzz-secret"
ALL_OF_IT = f"""
[[auth.tokens]]
token = "{TOKEN}"
name = "fuzzer"
send = ["*"]
receive = ["*"]
admin = ["*"]
"""


def _document(server: ServerProcess) -> dict[str, Any]:
    response = httpx.get(f"{server.url}/openapi.json", timeout=10)
    response.raise_for_status()
    doc: dict[str, Any] = response.json()
    return doc


def _operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, op)
        for path, operations in doc["paths"].items()
        for method, op in operations.items()
    ]


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for value in node.values() for r in _refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in _refs(value)]
    return []


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), f"{ref} points outside the document"
    node: Any = doc
    for part in ref[2:].split("/"):
        assert isinstance(node, dict) and part in node, f"{ref} does not resolve"
        node = node[part]
    return node


def test_finding_12_response_schemas_are_objects_not_strings(server: ServerProcess) -> None:
    # Given the document a running server serves
    doc = _document(server)
    # Then every JSON answer of every operation is described by a model, never {"type": "string"}
    for method, path, op in _operations(doc):
        for status, response in op["responses"].items():
            content = response.get("content", {})
            if path == "/metrics":
                assert list(content) == ["text/plain"], "metrics are Prometheus text"
                continue
            if path == "/console":
                assert list(content) == ["text/html"], "the console is a page"
                continue
            schema = content.get("application/json", {}).get("schema")
            assert schema is not None, f"{method} {path} {status} has no JSON schema"
            target = _resolve(doc, schema["$ref"]) if "$ref" in schema else schema
            assert target.get("type") == "object", f"{method} {path} {status}: {schema}"
            assert target.get("properties"), f"{method} {path} {status} names no field"


def test_finding_12_every_ref_resolves_batch_and_policy_bodies_included(
    server: ServerProcess,
) -> None:
    doc = _document(server)
    refs = _refs(doc)
    # Every reference points into the document itself (no "#/$defs/..." of an inlined model)
    for ref in refs:
        _resolve(doc, ref)
    assert not [r for r in refs if "$defs" in r]
    # And the bodies a generated client or fuzzer has to build are described in full
    bodies = {
        (method, path): op["requestBody"]["content"]["application/json"]["schema"]
        for method, path, op in _operations(doc)
        if "requestBody" in op
    }
    from tarry.model.fields import FIELDS  # (here: a run against the old code still collects)

    batch = _resolve(doc, bodies[("POST", "/v1/messages/batch")]["$ref"])
    send = _resolve(doc, batch["properties"]["messages"]["items"]["$ref"])
    assert set(send["properties"]) == {f.name for f in FIELDS}
    policy = _resolve(doc, bodies[("PUT", "/v1/policies/{name}")]["$ref"])
    definition = policy["properties"]["definition"]["anyOf"][0]
    assert "message_ttl_ms" in _resolve(doc, definition["$ref"])["properties"]


def test_finding_12_invalid_input_is_documented_and_answered_as_400_not_422(
    server: ServerProcess,
) -> None:
    doc = _document(server)
    # Given FastAPI's own validation (a query parameter of the wrong type)
    response = httpx.get(f"{server.url}/v1/messages", params={"limit": "abc"}, timeout=10)
    # Then the server answers 400 invalid_argument with a sentence, never 422
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_argument"
    assert "limit" in response.json()["error"]["message"]
    # And the document says so: no 422 anywhere, 400 with the error model where input is read
    for method, path, op in _operations(doc):
        assert "422" not in op["responses"], f"{method} {path}"
        if op.get("parameters") or op.get("requestBody"):
            error = op["responses"]["400"]["content"]["application/json"]["schema"]
            assert error == {"$ref": "#/components/schemas/Error"}, f"{method} {path}"
    assert "HTTPValidationError" not in doc["components"]["schemas"]


def test_finding_12_every_status_and_error_code_is_documented(server: ServerProcess) -> None:
    doc = _document(server)
    # The error model lists every code a client can get (delivery_failed stays in transports)
    detail = doc["components"]["schemas"]["ErrorDetail"]
    codes = set(detail["properties"]["code"]["enum"])
    assert codes == registered_codes() - {"delivery_failed"}
    # And each code's status is documented on the operations that send it
    documented = {(method, path): set(op["responses"]) for method, path, op in _operations(doc)}
    send = documented[("POST", "/v1/messages")]
    assert {"200", "201", "400", "401", "403", "404", "409", "413", "429", "503"} <= send
    assert {str(error_class_for(code).http_status) for code in codes} <= send
    assert {"200", "201", "409"} <= documented[("PUT", "/v1/queues/{name}")]
    assert {"200", "201", "409"} <= documented[("PUT", "/v1/topics/{name}")]
    assert "409" in documented[("DELETE", "/v1/messages/{message_id}")]
    assert "404" in documented[("GET", "/v1/messages/{message_id}")]
    # And a method a path does not serve is refused naming those it does
    response = httpx.request("OPTIONS", f"{server.url}/v1/messages", timeout=10)
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, POST"


def test_finding_12_what_schemathesis_found_is_refused_with_400(server: ServerProcess) -> None:
    url = server.url
    assert httpx.put(f"{url}/v1/topics/t", timeout=10).status_code == 201
    # An invalid queue name is refused on unsubscribe too, as on subscribe
    response = httpx.delete(f"{url}/v1/topics/t/subscriptions/%C3%97", timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_argument"
    # A policy whose definition is not an object is refused (false was taken for "none")
    response = httpx.put(
        f"{url}/v1/policies/p", json={"pattern": "^x$", "definition": False}, timeout=10
    )
    assert response.status_code == 400
    assert "policy definition" in response.json()["error"]["message"]
    # A send to a topic nobody subscribed to answers the documented state
    sent = httpx.post(f"{url}/v1/messages", json={"destination": "t"}, timeout=10).json()
    assert sent["state"] == "no_subscribers"
    doc = _document(server)
    state = doc["components"]["schemas"]["Scheduled"]["properties"]["state"]
    assert {"const": "no_subscribers", "type": "string"} in state["anyOf"]


def test_every_operation_that_reads_a_body_documents_and_sends_413_over_its_limit(
    make_server: Any,
) -> None:
    # Given a server with small body limits (the batch's at 100 kB)
    server = make_server("[server]\nmax_message_bytes = 1024\nmax_batch_bytes = 100000\n")
    doc = _document(server)
    with_body = [(method, path, op) for method, path, op in _operations(doc) if "requestBody" in op]
    assert len(with_body) >= 10
    assert httpx.put(f"{server.url}/v1/queues/big").status_code == 201
    sent = httpx.post(f"{server.url}/v1/messages", json={"destination": "big", "delay_ms": 60_000})
    message_id = sent.json()["id"]
    for method, path, op in with_body:
        # Then each documents 413, and answers it to a body over the limit
        assert "413" in op["responses"], f"{method} {path}"
        target = path.replace("{name}", "big").replace("{message_id}", message_id)
        response = httpx.request(method, f"{server.url}{target}", content=b"[" * 2_000_000)
        assert response.status_code == 413, (method, path, response.text)
        assert response.json()["error"]["code"] == "message_too_large"


@pytest.mark.slow
@pytest.mark.timeout(300)  # the run's own bound is 240 s (about 125 s on a loaded machine)
def test_finding_12_schemathesis_finds_nothing_over_every_operation(
    make_server: Any, tmp_path: Path
) -> None:
    # Given a real server with a token (so the 401 paths are exercised too)
    server = make_server(ALL_OF_IT)
    # When schemathesis runs every check over every operation of the document it serves
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "--config-file",
            str(HERE / "schemathesis.toml"),
            "run",
            f"{server.url}/openapi.json",
            "--checks",
            "all",
            "--max-examples",
            "25",
            "--seed",
            "26",
            "--workers",
            "1",
            "--header",
            f"Authorization: Bearer {TOKEN}",
            "--output-truncate",
            "false",
            "--no-color",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    summary = run.stdout[run.stdout.rfind("SUMMARY") :]
    # Then every operation was tested and nothing failed: no 5xx, no answer breaking the
    # document, no undocumented status
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    selected = len([op for op in _operations(_document(server)) if op])
    assert f"Tested: {selected}" in summary, summary
