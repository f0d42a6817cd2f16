"""One table of a send's fields (``tarry.model.fields``) and every form derived from it: the
validator's field list, the column-wise rules' fields and types, the checked form's columns,
the Spark import's schema and DDL, and the OpenAPI request model (issue 26, finding 12)."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest

from tarry.errors import InvalidArgument
from tarry.model import batch, columns, queue_args, validate
from tarry.model.fields import CHECKED_COLUMNS, COLUMN_FIELDS, FIELDS, NAME_PATTERN
from tarry.pipeline import sources
from tarry.pipeline.validation import CHECKED_DDL, CHECKED_SCHEMA, MESSAGE_FIELDS
from tarry.server.send_schema import send_schema

NAMES = [f.name for f in FIELDS]


def test_finding_12_the_field_table_drives_every_form() -> None:
    # The validator refuses exactly what the table does not name
    assert validate.SEND_FIELDS == set(NAMES)
    with pytest.raises(InvalidArgument, match="unknown message field"):
        validate.parse_send({"destination": "q", "not_a_field": 1})
    # The Spark import maps input columns onto the same fields
    assert sources.parse_mapping([",".join(f"{n}=c{i}" for i, n in enumerate(NAMES))]) == {
        n: f"c{i}" for i, n in enumerate(NAMES)
    }
    # The column-wise rules read the table's column fields, as the table's Arrow types
    assert batch._COLUMN_FIELDS == tuple(COLUMN_FIELDS)
    assert list(COLUMN_FIELDS) == [f.name for f in FIELDS if f.column is not None]
    assert columns._COLUMN_TYPES == {
        n: pa.type_for_alias(kind) for n, kind in COLUMN_FIELDS.items()
    }
    # The checked form (model and Spark import) holds the table's checked columns
    assert columns._OUT_TYPES == {n: pa.type_for_alias(k) for n, k in CHECKED_COLUMNS.items()}
    assert set(columns.CheckedColumns.__dataclass_fields__) - {"code", "message", "by_row"} == set(
        CHECKED_COLUMNS
    )
    for name in MESSAGE_FIELDS:
        assert CHECKED_SCHEMA.field(name).type == pa.type_for_alias(CHECKED_COLUMNS[name])
    assert set(CHECKED_COLUMNS) - set(MESSAGE_FIELDS) == {
        "destination",
        "message_id",
        "deliver_at_ms",
        "expires_at_ms",
    }
    assert CHECKED_DDL.endswith(
        "body binary, headers string, correlation_id string, reply_to string, "
        "report string, discard boolean, persistent boolean"
    )
    # The OpenAPI request model names the same fields, in the same order, with its bounds
    schema = send_schema()
    assert list(schema["properties"]) == NAMES
    assert schema["required"] == ["destination"]
    assert schema["additionalProperties"] is False
    delay = schema["properties"]["delay_ms"]["anyOf"][0]
    assert (delay["minimum"], delay["maximum"]) == (0, 268_435_455_000)
    assert schema["properties"]["ttl_ms"]["anyOf"][0]["maximum"] == queue_args.MAX_TTL_MS
    # And the pairs parse_send refuses: one of delay_ms/deliver_at and of body/body_base64,
    # report only with reply_to
    pairs = {(rule["if"]["required"][0], *rule["then"]["properties"]) for rule in schema["allOf"]}
    assert pairs == {("delay_ms", "deliver_at"), ("body", "body_base64"), ("report", "reply_to")}
    for given, other in [("delay_ms", "deliver_at"), ("body", "body_base64")]:
        with pytest.raises(InvalidArgument, match="not both"):
            validate.parse_send(
                {
                    "destination": "q",
                    given: 1 if given == "delay_ms" else "a",
                    other: 2 if other == "deliver_at" else "YQ==",
                }
            )
    with pytest.raises(InvalidArgument, match="report needs reply_to"):
        validate.parse_send({"destination": "q", "report": ["expiration"]})


@pytest.mark.parametrize(
    "name", ["q", "orders.eu-1", "a:b@c_d", "_x", "9", "x" * 200, "", ".q", "x" * 201, "a b", "é"]
)
def test_finding_12_the_documented_name_pattern_is_the_one_check_name_applies(name: str) -> None:
    # (a trailing newline is finding 10's, fixed in check_name itself)
    documented = re.fullmatch(NAME_PATTERN.strip("^$"), name) is not None
    try:
        validate.check_name(name)
        accepted = True
    except InvalidArgument:
        accepted = False
    assert accepted == documented
