"""Spark DDL from an Arrow schema: the ``mapInArrow`` steps declare their output in Spark's
words, derived from the Arrow schema their batches carry so the two cannot drift apart."""

from __future__ import annotations

import pyarrow as pa

from tarry.errors import InvalidArgument

__all__ = ["spark_ddl", "spark_type"]

_SPARK = {
    pa.string(): "string",
    pa.int64(): "long",
    pa.binary(): "binary",
    pa.bool_(): "boolean",
}


def spark_type(kind: pa.DataType) -> str:
    """Spark's name for an Arrow type the pipeline's schemas use."""
    if pa.types.is_list(kind):
        return f"array<{spark_type(kind.value_type)}>"
    name = _SPARK.get(kind)
    if name is None:
        raise InvalidArgument(f"no Spark type is declared for the Arrow type {kind}")
    return name


def spark_ddl(schema: pa.Schema) -> str:
    """The Spark DDL of ``schema``: ``name type`` pairs, comma-separated, in order."""
    return ", ".join(f"{f.name} {spark_type(f.type)}" for f in schema)
