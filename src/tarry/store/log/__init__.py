"""The embedded default store: time-partitioned append-only logs (Pulsar PIP-26) behind one
write-ahead log (a bookie's journal).

``record`` (format) · ``wal`` (the write-ahead log: one write and one fsync per group commit) ·
``writer`` (group commit) · ``batch`` (a stored batch grouped by partition) · ``layout`` (which
partition, coarser far ahead) · ``partition`` (open → sealed → released) · ``segment`` (files,
written behind the WAL) · ``table`` (the partitions and their state) · ``index`` (due-time
arrays of due partitions) · ``reading`` · ``dedupe`` · ``checkpoint`` + ``snapshot`` +
``manifest`` (checkpoints, commit record last) · ``opening`` + ``recovery`` (checkpoint, WAL
tail, partitions; migration of older directories) · ``locate`` (find by id) · ``cleanup`` ·
``engine`` (``LogStore``). May import ``model``, ``errors`` and ``store`` primitives.
"""

from tarry.store.log.engine import LogStore

__all__ = ["LogStore"]
