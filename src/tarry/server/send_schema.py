"""The JSON Schema of one send, built from the field table (``tarry.model.fields``): the
rules ``parse_send`` applies, written once there and only described here (the OpenAPI
document's ``SendMessage``)."""

from __future__ import annotations

from typing import Any

from tarry.model.fields import FIELDS, SendField

__all__ = ["send_schema"]


def _field_schema(f: SendField) -> dict[str, Any]:
    one: list[dict[str, Any]] = []
    for kind in f.json_types:
        schema: dict[str, Any] = {"type": kind}
        if kind == "string":
            if f.min_length is not None:
                schema["minLength"] = f.min_length
            if f.max_length is not None:
                schema["maxLength"] = f.max_length
            if f.pattern is not None:
                schema["pattern"] = f.pattern
            if f.enum:
                schema["enum"] = list(f.enum)
            if f.format is not None:
                schema["format"] = f.format
        elif kind == "integer":
            if f.minimum is not None:
                schema["minimum"] = f.minimum
            if f.maximum is not None:
                schema["maximum"] = f.maximum
        elif kind == "array":
            schema["items"] = {"type": "string", "enum": list(f.enum)}
        elif kind == "object":
            schema["additionalProperties"] = {"type": "string"}
        one.append(schema)
    if not f.required:
        one.append({"type": "null"})
    shape = one[0] if len(one) == 1 else {"anyOf": one}
    return {**shape, "description": f.description}


def _given(name: str) -> dict[str, Any]:
    """``name`` is given: present, and neither null nor an empty list (both mean "none")."""
    empty = {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}
    return {"required": [name], "properties": {name: {"not": empty}}}


def _pairs() -> list[dict[str, Any]]:
    """The table's exclusions and needs, as conditions on a send."""
    pairs: list[dict[str, Any]] = []
    for f in FIELDS:
        if f.excludes is not None:
            other = f.excludes
            pairs.append({"if": _given(f.name), "then": {"properties": {other: {"type": "null"}}}})
        if f.needs is not None:
            pairs.append({"if": _given(f.name), "then": _given(f.needs)})
    return pairs


def send_schema() -> dict[str, Any]:
    """The JSON Schema of one send, from the field table: what ``parse_send`` reads."""
    return {
        "title": "SendMessage",
        "type": "object",
        "properties": {f.name: _field_schema(f) for f in FIELDS},
        "required": [f.name for f in FIELDS if f.required],
        "additionalProperties": False,
        "allOf": _pairs(),
    }
