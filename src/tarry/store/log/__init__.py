"""The embedded default store: time-partitioned append-only logs (Pulsar PIP-26).

``record`` (format) · ``batch`` (a stored batch grouped by partition) · ``segment`` (files,
fsync policy) · ``partition`` (open → sealed → released) · ``index`` (due-time arrays of due
partitions) · ``snapshot`` + ``manifest`` (index snapshots, commit record last) · ``recovery``
· ``locate`` (find by id) · ``cleanup`` · ``engine`` (``LogStore``). May import ``model``,
``errors`` and ``store`` primitives.
"""

from tarry.store.log.engine import LogStore

__all__ = ["LogStore"]
