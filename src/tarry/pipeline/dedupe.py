"""De-duplication by (destination, message_id), the server's idempotency key: the first row in
input order is imported; every later one becomes a ``duplicate`` reject naming the kept row.

Only accepted rows count, and an accepted row's key is its destination and message_id as read
(or, without a message_id, one derived from its content). So the rows that can share a key are
found from the raw key columns alone (``possible_repeats``, without the rules); the rules then
run on those few only before ``find_repeats`` compares the accepted ones' keys exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from tarry.pipeline.records import DERIVED_PREFIX
from tarry.pipeline.sources import ROW

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["DUPLICATE", "Repeats", "find_repeats", "possible_repeats", "split_duplicates"]

#: The code of a row dropped as a repeat (not an API error: the server answers a repeat with the
#: first message, and so does the import).
DUPLICATE = "duplicate"
#: The reject message of a repeat: its message_id, its destination, the kept row.
_MESSAGE = (
    "message_id %s for destination %s repeats input row %d; only the first is imported (the "
    "server would answer it with the first message as well)"
)
_KEY = ["destination", "message_id"]

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Repeats:
    """The later rows of repeated keys (sorted) and the first row of each one's key: few, so
    every task of the offline sink gets them all (a broadcast variable)."""

    rows: I64
    firsts: I64

    def __len__(self) -> int:
        return len(self.rows)

    def first_of(self, rows: I64) -> I64:
        """For each of ``rows``: the row it repeats, or -1 if it is no later repeat."""
        if not len(self.rows):
            return np.full(len(rows), -1, np.int64)
        at = np.minimum(np.searchsorted(self.rows, rows), len(self.rows) - 1)
        return np.where(self.rows[at] == rows, self.firsts[at], -1)

    @staticmethod
    def message(message_id: str, destination: str, first: int) -> str:
        return _MESSAGE % (message_id, destination, first)


def _repeated(accepted: DataFrame) -> DataFrame:
    """The keys held by more than one accepted row: ``_first`` (the smallest row), ``_n``."""
    from pyspark.sql import functions as F

    return (
        accepted.select(*_KEY, ROW)
        .groupBy(*_KEY)
        .agg(F.min(ROW).alias("_first"), F.count(F.lit(1)).alias("_n"))
        .where("_n > 1")
    )


def possible_repeats(rows: DataFrame) -> DataFrame:
    """The input ``rows`` that may share their key with another accepted row: a superset of the
    rows ``find_repeats`` needs, found without the rules (column pruning reads only the key).

    An accepted row's key is its destination and message_id as read (both text: the rules
    refuse other types), so two accepted rows with the same given key share the 64-bit hash of
    the raw columns. A row without a message_id gets one derived from its content, which may
    also equal a given id with the same prefix: those rows are always kept.

    The hashes (8 bytes a row) are counted on the driver: a sort there costs a third of the
    CPU of Spark's aggregation over as many distinct keys (measured at 10M rows)."""
    from pyspark.sql import functions as F

    if "message_id" not in rows.columns:
        return rows  # every key is derived from the content
    given = F.col("message_id")
    key_hash = F.xxhash64(*_KEY)
    hashes = rows.where(given.isNotNull()).select(key_hash.alias("_hash")).toArrow()
    ordered = np.sort(np.asarray(hashes.column("_hash").to_numpy(), np.int64))
    repeated = np.unique(ordered[1:][ordered[1:] == ordered[:-1]])
    marks = rows.sparkSession.createDataFrame(
        pa.table(
            {"_hash": pa.array(repeated, pa.int64()), "_repeated": np.ones(len(repeated), bool)}
        )
    )
    return (
        rows.withColumn("_hash", key_hash)
        .join(F.broadcast(marks), "_hash", "left")
        .where(
            F.col("_repeated").isNotNull()
            | given.isNull()
            | given.cast("string").startswith(DERIVED_PREFIX)
        )
        .drop("_hash", "_repeated")
    )


def find_repeats(accepted: DataFrame) -> Repeats:
    """The later rows of every repeated key among ``accepted`` (rows with ``_row`` and the key).

    A 64-bit hash of the key is what travels and is counted (cheaper to shuffle and group than
    the text); the rows whose hash repeats (few) come to the driver, which compares their keys
    exactly, so a collision costs a little work, never a row."""
    from pyspark.sql import functions as F

    keyed = accepted.select(ROW, *_KEY, F.xxhash64(*_KEY).alias("_hash"))
    repeated = keyed.groupBy("_hash").count().where("count > 1").select("_hash")
    rows = keyed.join(F.broadcast(repeated), "_hash", "left_semi").select(ROW, *_KEY).toArrow()
    firsts = rows.group_by(_KEY).aggregate([(ROW, "min")])
    joined = rows.join(firsts, _KEY)
    later = joined.filter(pc.not_equal(joined[ROW], joined[f"{ROW}_min"])).sort_by(ROW)
    return Repeats(
        np.asarray(later.column(ROW).to_numpy(), np.int64),
        np.asarray(later.column(f"{ROW}_min").to_numpy(), np.int64),
    )


def split_duplicates(accepted: DataFrame) -> tuple[DataFrame, DataFrame, DataFrame]:
    """(first of each key, the repeats as rejects with code ``duplicate``, the persisted frame
    of repeated keys with ``_n``, how many rows hold each: ``unpersist`` it when done).

    Only the keys travel through a shuffle (an aggregation, not a sort of whole rows); the keys
    that repeat (few) are kept and joined back to mark the later rows."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    repeated = _repeated(accepted).persist(StorageLevel.MEMORY_AND_DISK)
    repeated.count()  # materialised: small, so the joins below broadcast it
    marked = accepted.join(repeated.drop("_n"), _KEY, "left")
    later = F.col("_first").isNotNull() & (F.col(ROW) != F.col("_first"))
    first = marked.where(~later).drop("_first")
    repeats = (
        marked.where(later)
        .withColumn("code", F.lit(DUPLICATE))
        .withColumn(
            "message",
            F.format_string(_MESSAGE, "message_id", "destination", "_first"),
        )
        .drop("_first")
    )
    return first, repeats, repeated
