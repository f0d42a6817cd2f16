"""De-duplication by (destination, message_id), the server's idempotency key: the first row in
input order is imported; every later one becomes a ``duplicate`` reject naming the kept row."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tarry.pipeline.sources import ROW

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["DUPLICATE", "split_duplicates"]

#: The code of a row dropped as a repeat (not an API error: the server answers a repeat with the
#: first message, and so does the import).
DUPLICATE = "duplicate"


def split_duplicates(accepted: DataFrame) -> tuple[DataFrame, DataFrame, DataFrame]:
    """(first of each key, the repeats as rejects with code ``duplicate``, the persisted frame
    of repeated keys with ``_n``, how many rows hold each: ``unpersist`` it when done).

    Only the keys travel through a shuffle (an aggregation, not a sort of whole rows); the keys
    that repeat (few) are kept and joined back to mark the later rows."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    key = ["destination", "message_id"]
    repeated = (
        accepted.select(*key, ROW)
        .groupBy(*key)
        .agg(F.min(ROW).alias("_first"), F.count(F.lit(1)).alias("_n"))
        .where("_n > 1")
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    repeated.count()  # materialised: small, so the joins below broadcast it
    marked = accepted.join(repeated.drop("_n"), key, "left")
    later = F.col("_first").isNotNull() & (F.col(ROW) != F.col("_first"))
    first = marked.where(~later).drop("_first")
    repeats = (
        marked.where(later)
        .withColumn("code", F.lit(DUPLICATE))
        .withColumn(
            "message",
            F.format_string(
                "message_id %s for destination %s repeats input row %d; only the first is "
                "imported (the server would answer it with the first message as well)",
                "message_id",
                "destination",
                "_first",
            ),
        )
        .drop("_first")
    )
    return first, repeats, repeated
