"""The fields of a send, in one table. Every other form of the list is derived from it:

- the validator's field list (``SEND_FIELDS`` in ``validate.py``), which refuses unknown fields;
- the column-wise rules' fields (``COLUMN_FIELDS``) and the Arrow type each is read as there
  (``tarry.model.columns``, ``tarry.model.batch``), and of those the fields of a plain send,
  the ones ``AcceptedColumns`` holds (``fields_into``: ``PLAIN_FIELDS`` in ``batch.py``);
- the checked form's columns (``CHECKED_COLUMNS``): what a send is normalised to, with the Arrow
  type of each (``tarry.model.columns``), and from there the Spark import's schema and DDL
  (``tarry.pipeline.validation``);
- the OpenAPI request model of a send (``tarry.server.schemas``).

The table describes; it decides nothing. The rules stay in ``rules.py`` and ``validate.py``,
and the bounds written here are the ones those rules enforce, so a client or a fuzzer built from
the OpenAPI document sends what the validator accepts (``tests/model/test_fields.py`` holds the
derived forms to the table).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from tarry.model.message import MAX_DELAY_MS, MAX_INSTANT_MS, MAX_TTL_MS
from tarry.model.rules import MAX_ID_CHARS

__all__ = [
    "CHECKED_COLUMNS",
    "COLUMN_FIELDS",
    "FIELDS",
    "NAME_MAX_CHARS",
    "NAME_PATTERN",
    "SendField",
    "field_names",
    "fields_into",
]

#: A queue, topic or destination name (``validate.check_name``), in the syntax JSON Schema and
#: Python's ``re`` read alike.
NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._:@\-]{0,199}$"
NAME_MAX_CHARS = 200


@dataclass(frozen=True, slots=True)
class SendField:
    """One field of a send. Null (or absent) always means "not given"."""

    name: str
    #: The JSON types it may be given as (JSON Schema names: string, integer, boolean, ...).
    json_types: tuple[str, ...]
    description: str
    #: The column of the checked form that holds it and that column's Arrow type (several
    #: fields may feed one column: ``delay_ms`` and ``deliver_at`` both set ``deliver_at_ms``);
    #: None when the checked form does not keep it.
    checked: tuple[str, str] | None = None
    #: The Arrow type the column-wise rules read it as; None: a send giving it is checked one
    #: at a time (``parse_send``), whatever its value.
    column: str | None = None
    required: bool = False
    #: Bounds the rules enforce (numbers: inclusive; text: characters).
    minimum: int | None = None
    maximum: int | None = None
    min_length: int | None = None
    max_length: int | None = None
    pattern: str | None = None
    #: The allowed text values (for a list, of its items).
    enum: tuple[str, ...] = ()
    #: A field that may not be given with this one (``delay_ms`` or ``deliver_at``).
    excludes: str | None = None
    #: A field this one needs (``report`` goes to ``reply_to``).
    needs: str | None = None
    #: A JSON Schema format of its text (``byte``: base64).
    format: str | None = None


def _id(name: str, description: str, checked: str | None = None) -> SendField:
    """An optional id-like text field (``rules.id_rules``)."""
    return SendField(
        name,
        ("string",),
        description,
        checked=None if checked is None else (checked, "string"),
        column="string",
        min_length=1,
        max_length=MAX_ID_CHARS,
    )


FIELDS: tuple[SendField, ...] = (
    SendField(
        "destination",
        ("string",),
        "a declared queue, topic or route",
        checked=("destination", "string"),
        column="string",
        required=True,
        min_length=1,
        max_length=NAME_MAX_CHARS,
        pattern=NAME_PATTERN,
    ),
    SendField(
        "body",
        ("string",),
        "UTF-8 text",
        checked=("body", "binary"),
        column="string",
        excludes="body_base64",
    ),
    SendField(
        "body_base64",
        ("string",),
        "a binary body, base64 (not with body)",
        checked=("body", "binary"),
        format="byte",
    ),
    SendField(
        "headers", ("object",), "string keys to string values", checked=("headers", "string")
    ),
    SendField(
        "delay_ms",
        ("integer",),
        "from now; at most 2^28 - 1 s (not with deliver_at)",
        checked=("deliver_at_ms", "int64"),
        column="int64",
        minimum=0,
        maximum=MAX_DELAY_MS,
        excludes="deliver_at",
    ),
    SendField(
        "deliver_at",
        ("integer", "string"),
        "epoch ms or RFC 3339; a past time means now (not with delay_ms)",
        checked=("deliver_at_ms", "int64"),
        column="int64",
        minimum=0,
        maximum=MAX_INSTANT_MS,
    ),
    SendField(
        "ttl_ms",
        ("integer",),
        "counts from the send; not shorter than the delay",
        checked=("expires_at_ms", "int64"),
        column="int64",
        minimum=0,
        maximum=MAX_TTL_MS,
    ),
    _id("message_id", "idempotency key per destination", "message_id"),
    _id("correlation_id", "the producer's correlation id", "correlation_id"),
    SendField(
        "reply_to",
        ("string",),
        "the queue receiving the reports",
        checked=("reply_to", "string"),
        min_length=1,
        max_length=NAME_MAX_CHARS,
        pattern=NAME_PATTERN,
    ),
    SendField(
        "report",
        ("array", "string"),
        "reports sent to reply_to",
        checked=("report", "string"),
        enum=("expiration", "exception"),
        needs="reply_to",
    ),
    SendField(
        "on_undeliverable",
        ("string",),
        "what happens to a message that cannot be delivered",
        checked=("discard", "bool"),
        enum=("dead_letter", "discard"),
    ),
    _id("group_id", "refused together with a delay"),
    SendField("retain", ("boolean",), "refused together with a delay"),
    SendField("persistent", ("boolean",), "default true", checked=("persistent", "bool")),
)


def field_names() -> frozenset[str]:
    """Every field a send may carry."""
    return frozenset(f.name for f in FIELDS)


def fields_into(columns: Collection[str]) -> frozenset[str]:
    """The fields the column-wise rules decide whose checked column is one of ``columns``: a
    send giving no other field is wholly described by those columns."""
    return frozenset(
        f.name
        for f in FIELDS
        if f.column is not None and f.checked is not None and f.checked[0] in columns
    )


#: The fields the column-wise rules decide, in table order, with the Arrow type they read.
COLUMN_FIELDS: dict[str, str] = {f.name: f.column for f in FIELDS if f.column is not None}


def _checked_columns() -> dict[str, str]:
    columns: dict[str, str] = {}
    for f in FIELDS:
        if f.checked is not None:
            columns.setdefault(*f.checked)
    return columns


#: The checked form of a send: column name to Arrow type, in table order.
CHECKED_COLUMNS: dict[str, str] = _checked_columns()
