"""Reading an import's input: Parquet, CSV or JSON lines, with a column mapping onto send fields.

``--map deliver_at=send_time,destination=channel`` renames input columns to the send fields of the
HTTP API; input columns that name no send field are left out (and listed in the summary). Types
are only made Arrow-friendly here (timestamps to epoch ms, header objects to JSON text); every
rule is applied later by the model's code.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from tarry.errors import InvalidArgument
from tarry.model.validate import SEND_FIELDS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FORMATS", "guess_format", "load_input", "parse_mapping"]

FORMATS = ("parquet", "csv", "json")
ROW = "_row"
_SUFFIXES = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
}


def parse_mapping(items: Iterable[str]) -> dict[str, str]:
    """``field=column`` pairs (comma-separated, repeatable) → {send field: input column}."""
    mapping: dict[str, str] = {}
    for item in items:
        for pair in filter(None, (p.strip() for p in item.split(","))):
            field, sep, column = pair.partition("=")
            field, column = field.strip(), column.strip()
            if not sep or not field or not column:
                raise InvalidArgument(
                    f"--map {pair!r} is not field=column; write e.g. deliver_at=send_time"
                )
            if field not in SEND_FIELDS:
                raise InvalidArgument(
                    f"--map names {field!r}, which is not a message field; "
                    f"use one of {', '.join(sorted(SEND_FIELDS))}"
                )
            if field in mapping:
                raise InvalidArgument(f"--map gives {field!r} twice")
            mapping[field] = column
    return mapping


def guess_format(path: Path | str) -> str:
    """The format named by the file suffix (or by the files in a directory; of a URL, its own
    suffix); Parquet otherwise."""
    if isinstance(path, str):
        candidates = [Path(path)]
    else:
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for candidate in candidates:
        found = _SUFFIXES.get(candidate.suffix.lower())
        if found:
            return found
    return "parquet"


def load_input(
    spark: SparkSession, path: Path | str, fmt: str | None, mapping: dict[str, str]
) -> tuple[DataFrame, list[str]]:
    """The input as send-field columns plus ``_row`` (the row's position, which decides which of
    two duplicates is kept); and the input columns left out. ``path``: a local path, or a URL
    (``s3a://...``) handed to Spark untouched."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(path, Path) and not path.exists():
        raise InvalidArgument(f"the input {str(path)!r} does not exist")
    fmt = fmt or guess_format(path)
    if fmt not in FORMATS:
        raise InvalidArgument(f"--format {fmt!r} is unknown; use parquet, csv or json")
    reader = spark.read
    if fmt == "csv":
        frame = reader.option("header", "true").option("inferSchema", "false").csv(str(path))
    elif fmt == "json":
        frame = reader.json(str(path))
    else:
        frame = reader.parquet(str(path))
    columns = set(frame.columns)
    missing = sorted(c for c in mapping.values() if c not in columns)
    if missing:
        raise InvalidArgument(
            f"--map names input column(s) {', '.join(missing)} that the input does not have; "
            f"it has {', '.join(sorted(columns))}"
        )
    source_of = {field: field for field in SEND_FIELDS if field in columns}
    source_of.update(mapping)
    used = set(source_of.values())
    ignored = sorted(c for c in columns if c not in used)
    if "destination" not in source_of:
        raise InvalidArgument(
            "the input has no destination column; map one with --map destination=COLUMN"
        )
    types = {f.name: f.dataType for f in frame.schema.fields}
    selected = []
    for field, column in sorted(source_of.items()):
        value = F.col(f"`{column}`")
        kind = types[column]
        if isinstance(kind, T.TimestampType | T.TimestampNTZType | T.DateType):
            value = F.unix_millis(value.cast("timestamp"))
        elif isinstance(kind, T.StructType | T.MapType | T.ArrayType) and field != "report":
            value = F.to_json(value)
        elif isinstance(kind, T.DecimalType):
            value = value.cast("double")
        selected.append(value.alias(field))
    return frame.select(F.monotonically_increasing_id().alias(ROW), *selected), ignored
