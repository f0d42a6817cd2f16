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

``flatten`` links each old partition directory's ``seg-<n>.log`` into ``parts/`` under its new
name (a hard link in an existing directory creates no inode and copies no byte), fsyncs
``parts/``, and only then deletes the old directories and fsyncs the root: until the new names
are durable the old ones stand, so no order in which a power loss keeps the directories'
changes loses a file (a rename would take the old name in one directory and give the new one in
another, each durable on its own). A crash anywhere leaves the directories, or some of them,
for the next start, which links what is not in ``parts/`` yet and deletes them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tarry.store.log.fs import Files
from tarry.store.log.layout import Layout
from tarry.store.log.partition import parts_root

__all__ = ["flatten", "nested_partitions", "nested_segment"]

log = logging.getLogger(__name__)


def nested_partitions(root: Path) -> dict[int, Path]:
    """The partition directories of the layout before flat files, by key."""
    with os.scandir(root) as entries:
        return {
            key: Path(e.path)
            for e in entries
            if (key := Layout.parse_name(e.name)) is not None and e.is_dir()
        }


def nested_segment(name: str) -> int | None:
    """The number of a partition directory's segment file ``seg-<n>.log``, or None."""
    digits = name.removeprefix("seg-").removesuffix(".log")
    if name.startswith("seg-") and name.endswith(".log") and digits.isdigit():
        return int(digits)
    return None


def flatten(root: Path, *, fs: Files) -> int:
    """Move the segment files of every partition directory under ``root`` into ``parts/``
    (which exists), durably, then delete the directories; the number of files moved."""
    nested = nested_partitions(root)
    if not nested:
        return 0
    parts = parts_root(root)
    moved = 0
    for key, directory in sorted(nested.items()):
        for path in sorted(directory.iterdir()):
            segment = nested_segment(path.name)
            if segment is None or not path.is_file():
                continue
            target = parts / Layout.segment_name(key, segment)
            try:
                fs.link(path, target)
            except FileExistsError:  # linked by a start a crash cut short
                if not os.path.samefile(path, target):
                    fs.rename(path, target)  # parts/ was not written before this ends
            moved += 1
    fs.fsync_dir(parts)
    for directory in nested.values():
        for left in sorted(directory.iterdir()):
            if nested_segment(left.name) is None or not left.is_file():
                log.warning("deleting %s: not a segment file of the partition directory", left)
        fs.remove_tree(directory)  # the segments' old names: their new ones are durable
    fs.fsync_dir(root)
    log.warning(
        "moved %d segment files of %d partition directories into %s (this version's layout: an "
        "older tarry cannot open the store afterwards)",
        moved,
        len(nested),
        parts,
    )
    return moved
