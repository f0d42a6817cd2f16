"""Moving a store written with a directory per partition into the flat layout, at start.

Every partition's segment files live in one directory, ``<root>/parts/<name>.seg-<n>.log``
(``Layout.segment_name``). Until issue 22's last change each partition had a directory of its
own, ``<root>/<name>/seg-<n>.log``: two inodes a partition where one does. A fresh server sent a
batch due over a year creates ~160 partitions in its first second, and on ext4 each new inode
costs a search past every inode freed in the last seconds (``recently_deleted``): the store's
cost then depended on what the file system had deleted just before. One inode a partition halves
that work, and the new files all go into one directory that a checkpoint fsyncs once.

Why ``parts/`` and not the root itself: the root holds the store's other entries (``wal/``,
``snapshots/``, ``imports/``, ``CLEAN``), so one directory of segment files alone is listed at
start without sorting them out, and a store of the previous layout (partition directories in the
root) is told apart from this one by its entries' kind, never by a name both could have.

``flatten`` renames each old partition directory's ``seg-<n>.log`` into ``parts/`` (a rename
into an existing directory creates no inode and copies no byte), fsyncs ``parts/``, then deletes
the emptied directories and fsyncs the root. Each step can be cut by a crash: the next start
finds the directories still there and moves what is left in them (a segment in both places, as a
file system without a journal may leave it, is the same file: the rename replaces it).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tarry.store.log.fs import Files
from tarry.store.log.layout import Layout
from tarry.store.log.partition import parts_root

__all__ = ["flatten", "nested_partitions"]

log = logging.getLogger(__name__)


def nested_partitions(root: Path) -> dict[int, Path]:
    """The partition directories of the layout before flat files, by key."""
    with os.scandir(root) as entries:
        return {
            key: Path(e.path)
            for e in entries
            if (key := Layout.parse_name(e.name)) is not None and e.is_dir()
        }


def _segment_number(name: str) -> int | None:
    digits = name.removeprefix("seg-").removesuffix(".log")
    if name.startswith("seg-") and name.endswith(".log") and digits.isdigit():
        return int(digits)
    return None


def flatten(root: Path, *, fs: Files) -> int:
    """Move the segment files of every partition directory under ``root`` into ``parts/``
    (which exists), durably, and delete the directories; the number of files moved."""
    nested = nested_partitions(root)
    if not nested:
        return 0
    parts = parts_root(root)
    moved = 0
    for key, directory in sorted(nested.items()):
        for path in sorted(directory.iterdir()):
            segment = _segment_number(path.name)
            if segment is None or not path.is_file():
                continue
            fs.rename(path, parts / Layout.segment_name(key, segment))
            moved += 1
    fs.fsync_dir(parts)
    for directory in nested.values():
        for left in sorted(directory.iterdir()):
            log.warning("deleting %s: not a segment file of the partition directory", left)
        fs.remove_tree(directory)
    fs.fsync_dir(root)
    log.warning(
        "moved %d segment files of %d partition directories into %s (this version's layout: an "
        "older tarry cannot open the store afterwards)",
        moved,
        len(nested),
        parts,
    )
    return moved
