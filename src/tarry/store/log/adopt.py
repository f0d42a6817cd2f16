"""Adopting bulk imports (``tarry pipeline import --into``) at start, all or nothing.

An import area ``<root>/imports/<import>/`` holds segment files written by the pipeline
(``tarry.pipeline.sink_log``) in this store's record format, and the import manifest::

    <name>.<task>-<i>.log       MESSAGE records of one time partition, sorted by due time (a
                                partition may get several files, from several tasks); ``name``
                                is the store's own for that partition (``layout.py``:
                                ``p-<n>``, ``p<level>-<n>``). Areas written before the flat
                                layout have ``<name>/<task>-<i>.log``: still adopted
    IMPORT                      written last (temp, fsync, rename):
                                MAGIC · version:u32 · crc32c:u32 of the body · body (JSON)
                                {"import", "created_ms", "granularity_ms", "files":
                                 [{"name", "partition", "bytes", "crc", "records"}]}

``partition`` is the partition's key (``Layout``: its level and start), the one the store's
write path gives a message sent at ``created_ms``. Version 1 (written before the layout) gave
``due // granularity_ms``, a level-0 partition: still adopted, as those keys.

After recovery, for each area with a valid manifest:

1. verify: the manifest's magic, version and checksum; its partition width equals the store's;
   every file it names is named for its partition, has the stated size and CRC32C, scans
   as whole records, and holds only messages due within its partition's window. Any failure
   refuses the whole import (nothing is adopted; the reason is logged and reported as damage);
2. drop MESSAGE records whose (destination, message_id) the store already holds (a rerun of
   the same import delivers each message once), writing the survivors to ``*.adopt`` files;
3. write ``ADOPTING``, the plan (file → ``parts/<name>.seg-<next>.log``), as temp, fsync,
   rename;
4. move the files in, fsync ``parts/``, replay the new segments (counts, de-duplication,
   the index of due partitions), then delete the area. The store then writes a checkpoint
   (``Opened.adopted``), so a restart reads the adopted partitions from it, not again.

A crash after step 3 is finished at the next start (the plan is rolled forward: files already
moved are replayed by recovery, the rest are moved now). An area without ``IMPORT`` is an import
still being written (or abandoned): it is left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
import orjson

from tarry.store.log.fs import Files, OsFiles
from tarry.store.log.layout import Layout
from tarry.store.log.manifest import frame, framed_version, unframe, write_last
from tarry.store.log.migrate import nested_segment
from tarry.store.log.partition import PARTS, Partition, parts_root
from tarry.store.log.record import MESSAGE, Damage, scan
from tarry.store.log.recovery import Recovered, replay

__all__ = ["IMPORT_MAGIC", "ImportManifest", "adopt_imports", "write_manifest"]

log = logging.getLogger(__name__)
PLAN = "ADOPTING"
IMPORT_MAGIC = b"TARRYIM1"
IMPORT_VERSION = 2
#: Written before ``layout.py``: ``partition`` numbers ``due // granularity_ms`` (still adopted).
IMPORT_LEGACY_VERSION = 1


@dataclass(slots=True)
class ImportManifest:
    """The commit record of an import area (see the module docstring)."""

    import_: str
    created_ms: int
    granularity_ms: int
    files: list[dict[str, Any]]

    def encode(self) -> bytes:
        body = orjson.dumps(
            {
                "import": self.import_,
                "created_ms": self.created_ms,
                "granularity_ms": self.granularity_ms,
                "files": self.files,
            }
        )
        return frame(body, magic=IMPORT_MAGIC, version=IMPORT_VERSION)

    @classmethod
    def decode(cls, data: bytes) -> ImportManifest:
        """Check magic, then version, then checksum; raises ``ManifestError`` (a ``ValueError``)
        naming the first that fails. A version-1 manifest's partitions come back as keys."""
        legacy = framed_version(data, IMPORT_VERSION) == IMPORT_LEGACY_VERSION
        version = IMPORT_LEGACY_VERSION if legacy else IMPORT_VERSION
        fields = orjson.loads(unframe(data, magic=IMPORT_MAGIC, version=version))
        files: list[dict[str, Any]] = fields["files"]
        if legacy:
            files = [{**f, "partition": Layout.level0(int(f["partition"]))} for f in files]
        return cls(fields["import"], fields["created_ms"], fields["granularity_ms"], files)


def write_manifest(area: Path, manifest: ImportManifest) -> Path:
    """``IMPORT``, last: temp file, fsync, rename, fsync the directory (written by the offline
    import, outside any store)."""
    return write_last(area / "IMPORT", manifest.encode(), fs=OsFiles())


class ImportRefused(Exception):
    """Raised when an import area fails verification; nothing of it is adopted."""


def _key_of(name: str) -> int:
    """The partition key of an import file ``<name>.<file>`` (or ``<name>/<file>``, written
    before the flat layout); nothing else."""
    parts = Path(name).parts
    if len(parts) == 2:
        key = Layout.parse_name(parts[0])
    else:
        stem, dot, _ = name.partition(".")
        key = Layout.parse_name(stem) if len(parts) == 1 and dot else None
    if key is None:
        raise ImportRefused(f"{name}: not a file of a partition")
    return key


def _target_of(target: str) -> tuple[int, int]:
    """(key, segment) a plan's target names: ``parts/<name>.seg-<n>.log``, or
    ``<name>/seg-<n>.log`` in a plan written before the flat layout (moved to ``parts/`` now:
    the files it moved already were by ``migrate.py``)."""
    parts = Path(target).parts
    if len(parts) == 2 and parts[0] == PARTS:
        found = Layout.parse_segment(parts[1])
    elif len(parts) == 2:
        key, segment = Layout.parse_name(parts[0]), nested_segment(parts[1])
        found = (key, segment) if key is not None and segment is not None else None
    else:
        found = None
    if found is None:
        raise ImportRefused(f"{target}: not a segment file of a partition")
    return found


def _verify(area: Path, granularity_ms: int) -> ImportManifest:
    try:
        manifest = ImportManifest.decode((area / "IMPORT").read_bytes())
    except (OSError, ValueError) as exc:
        raise ImportRefused(f"manifest: {exc}") from None
    if manifest.granularity_ms != granularity_ms:
        raise ImportRefused(
            f"written for partitions of {manifest.granularity_ms} ms; this store uses "
            f"{granularity_ms} ms (run the import again with --partition {granularity_ms}ms)"
        )
    for entry in manifest.files:
        if _key_of(entry["name"]) != entry["partition"]:
            raise ImportRefused(f"{entry['name']}: not named for partition {entry['partition']}")
        path = area / entry["name"]
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ImportRefused(f"{entry['name']}: {exc}") from None
        if len(data) != entry["bytes"] or google_crc32c.value(data) != entry["crc"]:
            raise ImportRefused(f"{entry['name']}: size or checksum does not match the manifest")
    return manifest


def _survivors(
    path: Path, window: tuple[int, int], state: Recovered, fs: Files
) -> tuple[Path | None, int]:
    """The file to move in (filtered when some records are already stored) and its count.
    A message due outside its partition's ``window`` refuses the import: the store would index
    it with the wrong partition and release it at the wrong time."""
    data = path.read_bytes()
    kept: list[bytes] = []
    dropped = 0
    start, end = window
    for item in scan(data):
        if isinstance(item, Damage):
            raise ImportRefused(f"{path.name} at byte {item.offset}: {item.reason}")
        if item.kind == MESSAGE:
            due, _, key = item.meta()
            if not start <= due < end:
                raise ImportRefused(
                    f"{path.name} at byte {item.offset}: due at {due}, "
                    f"outside its partition [{start}, {end})"
                )
            if key and key in state.dedupe:
                dropped += 1
                continue
        kept.append(data[item.offset : item.offset + item.size])
    if not kept:
        return None, 0
    if not dropped:
        return path, len(kept)
    filtered = path.with_suffix(".adopt")
    fs.write_file(filtered, b"".join(kept), what="partition")
    return filtered, len(kept)


def _write_plan(area: Path, moves: list[tuple[str, str, int]], fs: Files) -> None:
    write_last(area / PLAN, orjson.dumps(moves), fs=fs)


def _carry_out(
    area: Path,
    root: Path,
    moves: list[tuple[str, str, int]],
    partition_of: Callable[[int], Partition],
    state: Recovered,
    fs: Files,
) -> int:
    touched: dict[int, Partition] = {}
    for source, target, _ in moves:
        number, segment = _target_of(target)
        partition = touched.setdefault(number, partition_of(number))
        src, dst = area / source, partition.segment_path(segment)
        if src.exists():
            fs.rename(src, dst)
        elif not dst.exists():
            raise ImportRefused(f"{source} is gone and {target} does not exist")
    fs.fsync_dir(parts_root(root))
    before = state.replayed_records
    for partition in touched.values():
        replay(partition, state, build_index=partition.index is not None, fs=fs)
    fs.remove_tree(area)
    return state.replayed_records - before


def _adopt(
    area: Path,
    root: Path,
    layout: Layout,
    partition_of: Callable[[int], Partition],
    state: Recovered,
    fs: Files,
) -> int:
    moves: list[tuple[str, str, int]] = []
    if (area / PLAN).exists():  # a crash during a previous adoption: roll it forward
        moves = [(str(a), str(b), int(n)) for a, b, n in orjson.loads((area / PLAN).read_bytes())]
        return _carry_out(area, root, moves, partition_of, state, fs)
    manifest = _verify(area, layout.granularity_ms)
    planned: dict[int, int] = {}
    for entry in sorted(manifest.files, key=lambda e: (e["partition"], e["name"])):
        number = int(entry["partition"])
        source, _ = _survivors(area / entry["name"], layout.window(number), state, fs)
        if source is None:
            continue
        partition = partition_of(number)
        if number not in planned:
            planned[number] = len(partition.on_disk())
        target = partition.segment_path(planned[number])
        planned[number] += 1
        moves.append((str(source.relative_to(area)), str(target.relative_to(root)), number))
    _write_plan(area, moves, fs)
    return _carry_out(area, root, moves, partition_of, state, fs)


def adopt_imports(
    root: Path,
    *,
    layout: Layout,
    partition_of: Callable[[int], Partition],
    state: Recovered,
    fs: Files,
) -> int:
    """Adopt every complete import area under ``root/imports`` into the partitions
    ``partition_of(key)`` gives; the records adopted."""
    imports = root / "imports"
    if not imports.is_dir():
        return 0
    adopted = 0
    for area in sorted(p for p in imports.iterdir() if p.is_dir()):
        if not (area / "IMPORT").exists() and not (area / PLAN).exists():
            log.info("import area %s has no IMPORT manifest yet; left alone", area.name)
            continue
        try:
            count = _adopt(area, root, layout, partition_of, state, fs)
        except ImportRefused as exc:
            log.error("import %s refused, nothing of it adopted: %s", area.name, exc)
            state.damaged.append(f"{area}: import refused: {exc}")
            continue
        log.info("adopted import %s: %d records", area.name, count)
        adopted += count
    return adopted
