"""``LogStore``: the time-partitioned log store (Pulsar PIP-26's design) behind the
``DelayedStore`` contract, with a separate queue database (``tarry.store.base``).

- Every accepted message is appended to the partition covering its due time (``partition.py``)
  through the group-commit ``GroupWriter``; only partitions that are due (and the next one,
  ``prefetch_ms`` ahead) carry a ``DueIndex``. Future partitions cost a small header each.
- In-memory bookkeeping changes in the writer's ``on_written`` step, together with the sizes a
  snapshot records; a message taken out of circulation before its marker is on disk (cancel,
  reschedule, release) stays in ``_leaving`` meanwhile, and snapshots include it.
- A message id carries its due time (``tarry.model.ids``): ``get``, ``cancel`` and
  ``reschedule`` read one partition (following MOVED markers), never all of them.
- Snapshots (``snapshot.py`` + ``manifest.py``) every ``snapshot_interval_ms`` and on close;
  ``recovery.py`` on open; ``cleanup.py`` deletes released partitions.
"""

from __future__ import annotations

import asyncio
import bisect
import builtins
import heapq
import logging
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tarry.engine.types import MessageQuery
from tarry.errors import NotCancellable, NotFound, TarryError, Unavailable
from tarry.model.message import Message
from tarry.model.state import MessageState, transition
from tarry.store.base import StoreOutcome
from tarry.store.log import clean, cleanup
from tarry.store.log.adopt import adopt_imports
from tarry.store.log.batch import group_records
from tarry.store.log.figures import SnapshotTimes
from tarry.store.log.forecast import due_counts
from tarry.store.log.fs import Files
from tarry.store.log.held import STATE_CODES, Failure, Held, dedupe_hash
from tarry.store.log.index import DueIndex
from tarry.store.log.locate import Located, list_page, locate_many
from tarry.store.log.partition import Partition, split
from tarry.store.log.record import (
    CANCELLED,
    FAILED,
    MESSAGE,
    MOVED,
    RELEASED,
    Record,
    decode_message,
    encode_marker,
    encode_markers,
    encode_message,
    encode_messages,
)
from tarry.store.log.recovery import Recovered, load_snapshot, replay, snapshot_root, sweep_orphans
from tarry.store.log.scrub import damage_line, scrub_partition
from tarry.store.log.segment import SegmentFiles
from tarry.store.log.snapshot import capture, write_snapshot
from tarry.store.log.writer import GroupWriter

__all__ = ["LogStore"]

log = logging.getLogger(__name__)

#: Messages sent without delay, remembered by id so that their release at once (by the send
#: path, not a fetch) needs no lookup; bounded.
_RECENT_MAX = 200_000


class LogStore:
    #: Local queues live in a queue database of their own (``tarry.store.base``).
    shares_queue_database = False

    def __init__(
        self,
        root: Path,
        *,
        granularity_ms: int = 300_000,
        segment_bytes: int = 64 * 1024 * 1024,
        fsync: str = "batch",
        commit_interval_ms: int = 2,
        snapshot_interval_ms: int = 60_000,
        prefetch_ms: int = 30_000,
        barrier: Callable[[], Awaitable[None]] | None = None,
        fs: Files | None = None,
    ) -> None:
        self.root = root
        self.granularity_ms = granularity_ms
        self.snapshot_interval_ms = snapshot_interval_ms
        self.prefetch_ms = prefetch_ms
        #: Makes the queue database's releases durable before a partition's files go.
        self.barrier = barrier
        self.partitions: dict[int, Partition] = {}
        self._numbers: list[int] = []
        self.state = Recovered()
        #: Every change to the store's files goes through ``files.fs`` (``fs.py``).
        self.files = SegmentFiles(fs)
        self.snapshot_times = SnapshotTimes()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tarry-log")
        self._scrub_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tarry-scrub")
        self._scrubbing: asyncio.Task[None] | None = None
        #: Partitions the start-up scrub has checked (``scrub.py``), and whether it is done.
        self.scrubbed = 0
        self.scrub_done = False
        self.writer = GroupWriter(
            self.files,
            self._executor,
            fsync=fsync,
            commit_interval_ms=commit_interval_ms,
            segment_bytes=segment_bytes,
        )
        self._claims: dict[str, Held] = {}
        #: Released claims and failed messages, due again at ``Held.due`` (heap of (due, id)).
        self._waiting: dict[str, Held] = {}
        self._retry_heap: list[tuple[int, str]] = []
        self._leaving: dict[str, Held] = {}
        self._recent: dict[str, Held] = {}
        #: De-duplication keys of messages being written (not yet in ``state.dedupe``).
        self._unwritten: dict[int, Message] = {}
        self._seq = 0
        self._changes = 0
        self._last_upkeep_ms = 0
        self._now_ms = 0
        self._opened = False
        self._snapshotting = False
        self._upkeeping: asyncio.Task[None] | None = None
        self.recovery_seconds = 0.0
        #: The last start trusted a clean-close record (``clean.py``): no partition checked.
        self.clean_start = False

    # --- lifecycle --------------------------------------------------------------------------
    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._recover)
        self._opened = True
        self._scrubbing = loop.create_task(self._scrub(), name="tarry-log-scrub")

    async def _scrub(self) -> None:
        """Check every partition found at the start, nearest due first (``scrub.py``)."""
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        for number in list(self._numbers):
            partition = self.partitions.get(number)
            if partition is None or not partition.written:
                continue
            began = time.perf_counter()
            try:
                lines = await loop.run_in_executor(
                    self._scrub_pool, scrub_partition, partition, list(partition.written)
                )
            except Exception as exc:  # unreadable (EIO, permissions): that is damage too
                lines = [f"{partition.dir}: cannot be read ({exc})"]
            for line in lines:
                if self.state.report(line):
                    log.error("damaged record found by the start-up check: %s", line)
            self.scrubbed += 1
            await asyncio.sleep(time.perf_counter() - began)
        self.scrub_done = True
        log.info(
            "start-up check: %d partitions read in %.3f s, %d damaged records or files known",
            self.scrubbed,
            time.perf_counter() - started,
            len(self.state.damaged),
        )

    def _recover(self) -> None:
        started = time.perf_counter()
        fs = self.files.fs
        if not snapshot_root(self.root).is_dir():
            # A new store: its directories' entries are made durable before any write is
            # acknowledged, or a power loss could take the store's directory with everything.
            fs.mkdir(snapshot_root(self.root))
            fs.fsync_dir(self.root.parent)
            fs.fsync_dir(self.root)
        with os.scandir(self.root) as entries:
            numbers = sorted(
                int(e.name[2:])
                for e in entries
                if e.name.startswith("p-") and e.name[2:].isdigit() and e.is_dir()
            )
        for number in numbers:  # in order: each insertion lands at the end
            self._partition(number)
        load_snapshot(self.root, self.partitions, self.state)
        manifest = self.state.manifest
        # New snapshots number past every manifest on disk, usable or not.
        on_disk = [
            int(p.name.split("-", 1)[1])
            for p in snapshot_root(self.root).glob("manifest-*")
            if p.name.split("-", 1)[1].isdigit()
        ]
        self._seq = max(on_disk, default=0)
        sweep_orphans(self.root, manifest.seq if manifest else None, fs=fs)
        record = clean.take(self.root, fs=fs)
        trusted = record is not None and record.matches(
            manifest.seq if manifest else None,
            sum(1 for p in self.partitions.values() if p.sizes),
        )
        if record is not None and not trusted:
            log.info("clean-close record %s does not match the snapshot loaded; checking", record)
        self.clean_start = trusted
        for partition in self.partitions.values():
            replay(
                partition,
                self.state,
                build_index=partition.index is not None,
                trusted=trusted,
                fs=fs,
            )
        adopt_imports(  # bulk imports (tarry pipeline import --into), all or nothing
            self.root,
            granularity_ms=self.granularity_ms,
            partition_of=self._partition,
            state=self.state,
            fs=fs,
        )
        self.recovery_seconds = time.perf_counter() - started
        log.info(
            "log store recovered %d partitions (%d pending) in %.3f s: snapshot %s, %d records "
            "replayed, %s",
            len(self.partitions),
            sum(p.live for p in self.partitions.values()),
            self.recovery_seconds,
            manifest.seq if manifest else "none",
            self.state.replayed_records,
            "after a clean close (files unchecked)" if trusted else "every partition checked",
        )

    async def close(self) -> None:
        if self._scrubbing is not None:
            self._scrubbing.cancel()
            await asyncio.gather(self._scrubbing, return_exceptions=True)
        if self._upkeeping is not None:
            await asyncio.gather(self._upkeeping, return_exceptions=True)
        while not self.writer.idle:
            await asyncio.sleep(0.002)
        loop = asyncio.get_running_loop()
        try:  # what a failed write left must go before a clean close vouches for the sizes
            await loop.run_in_executor(self._executor, self.writer.repair)
        except TarryError as exc:
            log.error("closing without a clean-close record: %s", exc)
        if self._opened and not self.writer.cut_pending:
            try:
                groups = self.writer.groups
                manifest = await self.snapshot()
                if manifest is not None and self.writer.idle and self.writer.groups == groups:
                    # Nothing written since the snapshot's capture, and nothing from now on: a
                    # restart may take its partition sizes without checking the files.
                    self.writer.seal()
                    written = sum(1 for p in self.partitions.values() if p.written)
                    record = clean.CleanClose(self._seq, written)
                    await loop.run_in_executor(
                        self._executor,
                        lambda: clean.mark(self.root, record, fs=self.files.fs),
                    )
            except OSError as exc:  # a full disk: the next start checks every file instead
                log.error("closing without a final snapshot or clean-close record: %s", exc)
        self._opened = False
        self.files.close()
        self._executor.shutdown(wait=True)
        self._scrub_pool.shutdown(wait=True)

    def _partition(self, number: int, *, now_ms: int | None = None) -> Partition:
        """The partition ``number``, made when it is new. A partition made for a new message
        (``now_ms`` given: it has no files yet) within ``prefetch_ms`` of falling due is indexed
        from birth, as ``_ensure_loaded`` would index it (empty: nothing to read back)."""
        partition = self.partitions.get(number)
        if partition is None:
            partition = Partition(self.root, number, self.granularity_ms)
            if now_ms is not None and partition.start_ms <= now_ms + self.prefetch_ms:
                partition.index = DueIndex()
            self.partitions[number] = partition
            bisect.insort(self._numbers, number)
        return partition

    async def probe(self) -> None:
        """The store breaker's trial: cut back what failed writes left, and write and fsync a
        scratch page (``GroupWriter.probe``). Raises ``StorageFault``."""
        self._check()
        await asyncio.get_running_loop().run_in_executor(
            self._executor, self.writer.probe, self.root
        )

    def _check(self) -> None:
        self.writer.check()
        if not self._opened:
            raise Unavailable("the store is not open; wait for the server to finish starting")

    # --- storing ----------------------------------------------------------------------------
    async def store(self, messages: Sequence[Message]) -> list[StoreOutcome]:
        """Batch-shaped: the records are encoded in one pass and grouped by partition
        (``batch.py``); each group gets one contiguous append (one reservation, one write in
        the group commit) and its partition's index one ``add`` of arrays."""
        self._check()
        keys = [dedupe_hash(m) if m.message_id is not None else 0 for m in messages]
        accepted: Sequence[Message]
        if any(keys):
            outcomes, accepted, hashes, keyed = await self._admit(messages, keys)
        else:  # nothing to de-duplicate: every message is new
            outcomes = [StoreOutcome(m, True) for m in messages]
            accepted, hashes, keyed = messages, keys, []
        if not accepted:
            return outcomes
        order = group_records(
            accepted,
            encode_messages(accepted, hashes),
            granularity_ms=self.granularity_ms,
            segment_bytes=self.writer.segment_bytes,
            partition_of=lambda number, first: self._partition(
                number, now_ms=max(self._now_ms, first.sent_at_ms)
            ),
        )
        dedupe = self.state.dedupe

        def on_written(positions: list[int]) -> None:
            for key, message in keyed:
                dedupe[key] = message.id
                self._unwritten.pop(key, None)
            scheduled = self.state.scheduled
            for group, base in zip(order, positions, strict=True):
                partition, batch = group.partition, group.messages
                partition.total += len(batch)
                if len({m.destination for m in batch}) == 1:
                    scheduled[batch[0].destination] += len(batch)
                else:
                    scheduled.update(m.destination for m in batch)
                if partition.index is None:
                    continue
                # One contiguous blob in one segment: positions are base + record offsets.
                poss = group.offsets + base
                partition.index.add(group.dues, poss)
                sent_now = [i for i, m in enumerate(batch) if m.deliver_at_ms <= m.sent_at_ms]
                for i in sent_now:  # sent without delay: released at once
                    m = batch[i]
                    self._recent[m.id] = Held(
                        partition.number, int(poss[i]), m.deliver_at_ms, m.destination
                    )
            if len(self._recent) > _RECENT_MAX:
                self._recent.clear()
            self._changes += len(accepted)

        items = [(g.partition, b"".join(g.records)) for g in order]
        try:
            await self.writer.append(items, durable=True, on_written=on_written)
        except BaseException:
            for key, message in keyed:
                if self._unwritten.get(key) is message:
                    del self._unwritten[key]
            raise
        return outcomes

    async def _admit(
        self, messages: Sequence[Message], keys: builtins.list[int]
    ) -> tuple[
        builtins.list[StoreOutcome],
        builtins.list[Message],
        builtins.list[int],
        builtins.list[tuple[int, Message]],
    ]:
        """De-duplication of a batch with keys (``keys``: each message's hash, 0 for none):
        the outcome of each message, the messages to write with their hashes, and the keyed
        ones among them (now in ``_unwritten``)."""
        outcomes: list[StoreOutcome] = []
        accepted: list[Message] = []
        hashes: list[int] = []
        keyed: list[tuple[int, Message]] = []
        dedupe = self.state.dedupe
        kept_ids = [dedupe[key] for key in keys if key in dedupe]
        # Repeats of pending messages are read back in one pass over each partition they name,
        # before the loop: a rerun of an import repeats a whole batch.
        kept = await self._locate_many(kept_ids) if kept_ids else {}
        looked = set(kept_ids)
        for message, key in zip(messages, keys, strict=True):
            if key:
                writing = self._unwritten.get(key)
                if writing is not None:  # the same key earlier in this or a concurrent batch
                    outcomes.append(StoreOutcome(replace(writing), False))
                    continue
                if key in dedupe:
                    kept_id = dedupe[key]
                    if kept_id in kept:
                        found: Message | None = kept[kept_id].message
                    else:  # gone since, or named by a batch written while we looked
                        found = None if kept_id in looked else await self.get(kept_id)
                    if found is not None:
                        outcomes.append(StoreOutcome(found, False))
                        continue
                self._unwritten[key] = message
                keyed.append((key, message))
            accepted.append(message)
            hashes.append(key)
            outcomes.append(StoreOutcome(message, True))
        return outcomes, accepted, hashes, keyed

    # --- due messages -----------------------------------------------------------------------
    def _load(self, partition: Partition) -> None:
        """Build the index of a partition that becomes due (reading its records once)."""
        if partition.index is not None:
            return
        started = time.perf_counter()
        replay(partition, self.state, build_index=True, index_only=True)
        assert partition.index is not None
        held = {h.pos for h in self._held() if h.number == partition.number}
        if held:  # never index twice what is claimed, waiting or leaving
            partition.index.drop_positions(np.fromiter(held, np.int64, len(held)))
        log.info(
            "indexed partition %d: %d pending in %.3f s",
            partition.number,
            len(partition.index),
            time.perf_counter() - started,
        )

    def _held(self) -> list[Held]:
        return [*self._claims.values(), *self._waiting.values(), *self._leaving.values()]

    def _ensure_loaded(self, now_ms: int) -> None:
        horizon = (now_ms + self.prefetch_ms) // self.granularity_ms
        overdue_indexed = 0
        for number in self._numbers[: bisect.bisect_right(self._numbers, horizon)]:
            partition = self.partitions[number]
            partition.settle(now_ms)
            if partition.live <= 0:
                continue
            if partition.index is None:
                # After downtime, overdue partitions are indexed a few at a time, in due order.
                if overdue_indexed >= 2 and partition.end_ms <= now_ms:
                    break
                self._load(partition)
            assert partition.index is not None
            if partition.end_ms <= now_ms and len(partition.index):
                overdue_indexed += 1

    def _wait(self, message_id: str, held: Held, due: int) -> None:
        held.due = due
        self._waiting[message_id] = held
        heapq.heappush(self._retry_heap, (due, message_id))

    async def fetch_due(self, now_ms: int, *, limit: int, lease_ms: int) -> list[Message]:
        self._check()
        self._now_ms = max(self._now_ms, now_ms)
        for message_id, held in list(self._claims.items()):
            if held.until <= now_ms:
                del self._claims[message_id]
                self._wait(message_id, held, held.due)
        self._ensure_loaded(now_ms)
        picked: list[tuple[str | None, Held]] = []
        heap = self._retry_heap
        while heap and heap[0][0] <= now_ms and len(picked) < limit:
            due, message_id = heapq.heappop(heap)
            waiting = self._waiting.get(message_id)
            if waiting is not None and waiting.due == due:
                del self._waiting[message_id]
                picked.append((message_id, waiting))
        for number in self._numbers:
            if len(picked) >= limit:
                break
            partition = self.partitions[number]
            if partition.start_ms > now_ms:
                break
            if partition.index is not None:
                for due, pos in partition.index.pop_due(now_ms, limit - len(picked)):
                    picked.append((None, Held(number, pos, due, "")))
        out: list[Message] = []
        helds = [held for _, held in picked]
        for held, message in zip(helds, self._read_messages(helds), strict=True):
            if message is None:
                continue
            failure = self.state.failures.get(message.id)
            if failure is not None:
                if failure.retry_at_ms > now_ms:  # a back-off that outlived a restart
                    self._wait(message.id, held, failure.retry_at_ms)
                    continue
                message.failures, message.last_error = failure.attempts, failure.error
            held.destination, held.until = message.destination, now_ms + lease_ms
            self._claims[message.id] = held
            out.append(message)
        if now_ms - self._last_upkeep_ms >= self.snapshot_interval_ms and self._upkeeping is None:
            self._last_upkeep_ms = now_ms
            self._upkeeping = asyncio.get_running_loop().create_task(self._upkeep(now_ms))
        return out

    def _read_message(self, held: Held) -> Message | None:
        partition = self.partitions.get(held.number)
        if partition is None:
            return None
        return self._message_of(partition, held.pos, self.files.read(partition, held.pos))

    def _read_messages(self, helds: list[Held]) -> list[Message | None]:
        """``_read_message`` of each, reading each partition's records in one go."""
        out: list[Message | None] = [None] * len(helds)
        by_number: dict[int, list[int]] = {}
        for i, held in enumerate(helds):
            by_number.setdefault(held.number, []).append(i)
        for number, indexes in by_number.items():
            partition = self.partitions.get(number)
            if partition is None:
                continue
            positions = [helds[i].pos for i in indexes]
            got = self.files.read_messages(partition, positions)
            for i, pos, message in zip(indexes, positions, got, strict=True):
                if isinstance(message, Message):
                    out[i] = message
                else:
                    self._damaged(partition, pos, message)
        return out

    def _message_of(self, partition: Partition, pos: int, got: Record | str) -> Message | None:
        if isinstance(got, Record) and got.kind == MESSAGE:
            return decode_message(got.payload)[0]
        self._damaged(partition, pos, got if isinstance(got, str) else "not a message record")
        return None

    def _damaged(self, partition: Partition, pos: int, reason: str) -> None:
        """Never deliver garbage: the damaged message is reported and left out."""
        segment, offset = split(pos)
        line = damage_line(partition.segment_path(segment), offset, reason)
        if self.state.report(line):
            log.error("cannot read a message (%s); it is skipped", line)

    async def _upkeep(self, now_ms: int) -> None:
        """Cleanup, then a snapshot if anything changed (every ``snapshot_interval_ms``)."""
        try:
            await cleanup.delete_released(self, now_ms)
            if self._changes:
                await self.snapshot()
        except Exception:
            log.exception("log store upkeep failed")
        finally:
            self._upkeeping = None

    async def next_due_time(self) -> int | None:
        self._check()
        best: int | None = None
        for due, message_id in self._retry_heap:
            held = self._waiting.get(message_id)
            if held is not None and held.due == due:
                best = due if best is None else min(best, due)
        for number in self._numbers:
            partition = self.partitions[number]
            if best is not None and best < partition.start_ms:
                break
            if partition.live <= 0:
                continue
            # The earliest partition with pending messages is the next to fall due: indexing
            # it now gives the exact time (and it is needed next anyway).
            self._load(partition)
            assert partition.index is not None
            candidate = partition.index.next_due()
            if candidate is not None:
                best = candidate if best is None else min(best, candidate)
        return best

    def release_claims(self, ids: Sequence[str]) -> None:
        for message_id in ids:
            held = self._claims.pop(message_id, None)
            if held is not None:
                self._wait(message_id, held, held.due)

    def hold_claims(self, ids: Sequence[str], *, until_ms: int) -> None:
        """Keep claimed messages back until ``until_ms`` without counting a failure (their
        destination is away); they wait beside the retries and fall due again then."""
        for message_id in ids:
            held = self._claims.pop(message_id, None)
            if held is not None:
                self._wait(message_id, held, until_ms)

    # --- finishing --------------------------------------------------------------------------
    def _take(self, message_id: str) -> Held | None:
        """Take a pending message out of circulation (claims, waiting, or the index)."""
        held = self._claims.pop(message_id, None) or self._waiting.pop(message_id, None)
        if held is not None:
            return held
        recent = self._recent.pop(message_id, None)
        if recent is not None:
            partition = self.partitions.get(recent.number)
            if partition is not None and partition.index is not None:
                if partition.index.discard(recent.due, recent.pos):
                    return recent
        return None

    def _finished(self, message_id: str, held: Held) -> None:
        """Bookkeeping once a message's RELEASED / CANCELLED / MOVED marker is written."""
        self._finished_many([(message_id, held)])

    def _finished_many(self, taken: Sequence[tuple[str, Held]]) -> None:
        """``_finished`` of each, the counts changed once per partition and destination (a
        released batch mostly shares both)."""
        leaving, failures = self._leaving.pop, self.state.failures.pop
        for message_id, _ in taken:
            leaving(message_id, None)
            failures(message_id, None)
        for number, count in Counter(held.number for _, held in taken).items():
            partition = self.partitions.get(number)
            if partition is not None:
                partition.finished += count
        for destination, count in Counter(held.destination for _, held in taken).items():
            self.state.scheduled[destination] -= count
        self._changes += len(taken)

    async def remove(self, ids: Sequence[str], *, state: MessageState, now_ms: int) -> int:
        self._check()
        taken: list[tuple[str, Held]] = []
        # One contiguous append per partition (one reservation, one part of the write).
        markers: dict[int, list[tuple[str, int, str]]] = {}
        code = STATE_CODES[state]
        for message_id in ids:
            held = self._take(message_id)
            if held is None or held.number not in self.partitions:
                continue
            if not held.destination:
                message = self._read_message(held)
                held.destination = message.destination if message else ""
            self._leaving[message_id] = held
            markers.setdefault(held.number, []).append((message_id, held.pos, held.destination))
            taken.append((message_id, held))
        items = [
            (self.partitions[n], encode_markers(RELEASED, code, entries))
            for n, entries in markers.items()
        ]

        def on_written(_: list[int]) -> None:
            self._finished_many(taken)

        if items:
            # A release into a local queue is recorded in the queue database first: its
            # marker need not wait for an fsync. Other ends (delivered, dead-lettered) do.
            try:
                await self.writer.append(
                    items, durable=state is not MessageState.READY, on_written=on_written
                )
            except TarryError:
                self._put_back(taken)
                raise
        return len(taken)

    def _put_back(self, taken: Sequence[tuple[str, Held]]) -> None:
        """Markers that could not be written: their messages wait, due again at once, so the
        step is retried (a release again is a no-op in the queue database; its marker is
        written then) instead of staying out of circulation until a restart."""
        for message_id, held in taken:
            if self._leaving.pop(message_id, None) is not None:
                self._wait(message_id, held, held.due)

    async def record_failure(self, message_id: str, *, error: str, retry_at_ms: int) -> int:
        self._check()
        held = self._claims.pop(message_id, None)
        if held is None:
            return 0
        before = self.state.failures.get(message_id)
        count = (before.attempts if before else 0) + 1
        marker = encode_marker(
            FAILED, message_id, held.pos, retry_at_ms, failures=count, error=error[:2000]
        )
        self.state.failures[message_id] = Failure(count, error[:2000], retry_at_ms)
        self._wait(message_id, held, retry_at_ms)
        await self.writer.append([(self.partitions[held.number], marker)], durable=False)
        return count

    # --- by id ------------------------------------------------------------------------------
    async def _locate(self, message_id: str) -> Located:
        found = (await self._locate_many([message_id])).get(message_id)
        if found is None:
            raise NotFound(f"no message with id {message_id}")
        return found

    async def _locate_many(self, message_ids: builtins.list[str]) -> dict[str, Located]:
        return await asyncio.get_running_loop().run_in_executor(
            None, locate_many, self, message_ids
        )

    def _refuse_claimed(self, message_id: str) -> None:
        if message_id in self._claims or message_id in self._leaving:
            raise NotCancellable(
                f"message {message_id} is being delivered right now; it can no longer be changed"
            )

    def _take_located(self, found: Located) -> Held:
        """Take a located scheduled message out of circulation for a cancel or a move."""
        message = found.message
        self._refuse_claimed(message.id)
        held = self._waiting.pop(message.id, None)
        self._recent.pop(message.id, None)
        if held is None:
            held = Held(found.partition.number, found.pos, found.due, message.destination)
            index = found.partition.index
            if index is not None and not index.discard(found.due, found.pos):
                # Not indexed any more and not held: another path finished it meanwhile.
                raise NotCancellable(
                    f"message {message.id} is being delivered right now; it can no longer be "
                    "changed"
                )
        held.destination = message.destination
        self._leaving[message.id] = held
        return held

    async def cancel(self, message_id: str, *, now_ms: int) -> Message:
        self._check()
        self._refuse_claimed(message_id)
        found = await self._locate(message_id)
        message = found.message
        transition(message_id, message.state, MessageState.CANCELLED)
        held = self._take_located(found)
        marker = encode_marker(
            CANCELLED, message_id, found.pos, now_ms, destination=message.destination
        )
        try:
            await self.writer.append(
                [(found.partition, marker)],
                durable=True,
                on_written=lambda _: self._finished(message_id, held),
            )
        except TarryError:
            self._put_back([(message_id, held)])
            raise
        message.state, message.updated_at_ms = MessageState.CANCELLED, now_ms
        return message

    async def reschedule(self, message_id: str, *, deliver_at_ms: int, now_ms: int) -> Message:
        self._check()
        self._refuse_claimed(message_id)
        found = await self._locate(message_id)
        message = found.message
        if message.state is not MessageState.SCHEDULED:
            raise NotCancellable(
                f"message {message_id} is {message.state.value}; only scheduled messages can "
                "be rescheduled"
            )
        held = self._take_located(found)
        moved = replace(message, deliver_at_ms=deliver_at_ms, updated_at_ms=now_ms)
        target = self._partition(deliver_at_ms // self.granularity_ms, now_ms=now_ms)
        marker = encode_marker(
            MOVED, message_id, found.pos, deliver_at_ms, destination=message.destination
        )

        def on_written(positions: list[int]) -> None:
            self._finished(message_id, held)
            self.state.forwards[message_id] = deliver_at_ms
            target.total += 1
            self.state.scheduled[message.destination] += 1
            if target.index is not None:
                target.index.add([deliver_at_ms], [positions[1]])

        try:
            await self.writer.append(
                [(found.partition, marker), (target, encode_message(moved, 0))],
                durable=True,
                on_written=on_written,
            )
        except TarryError:
            self._put_back([(message_id, held)])
            raise
        return moved

    async def get(self, message_id: str) -> Message | None:
        self._check()
        try:
            return (await self._locate(message_id)).message
        except NotFound:
            return None

    async def list(self, query: MessageQuery) -> tuple[builtins.list[Message], str | None]:
        self._check()
        return await list_page(self, query)

    async def count_scheduled(self, destination: str | None = None) -> int:
        if destination is None:
            return sum(p.live for p in self.partitions.values())
        return max(0, self.state.scheduled.get(destination, 0))

    async def due_counts(self, start_ms: int, width_ms: int, buckets: int) -> builtins.list[int]:
        self._check()
        return due_counts(
            self.partitions,
            self._numbers,
            granularity_ms=self.granularity_ms,
            start_ms=start_ms,
            width_ms=width_ms,
            buckets=buckets,
        )

    # --- snapshots --------------------------------------------------------------------------
    async def snapshot(self) -> Path | None:
        """Snapshot every indexed partition (``snapshot.py``); the state is captured in one
        event-loop step, so it agrees with the ``written`` sizes it records."""
        if self._snapshotting:
            return None
        self._snapshotting = True
        started = time.perf_counter()
        try:
            self._seq += 1
            manifest, indexes, (hashes, ids) = capture(self, self._seq)
            self._changes = 0

            def write() -> Path:
                # The manifest must not name bytes the disk may not have: markers (and under
                # ``never`` everything) are written without an fsync. On the writer thread,
                # after every group the capture saw.
                self.writer.sync_dirty()
                return write_snapshot(
                    snapshot_root(self.root), manifest, indexes, (hashes, ids), fs=self.files.fs
                )

            path = await asyncio.get_running_loop().run_in_executor(self._executor, write)
            self.snapshot_times.observe(time.perf_counter() - started)
            sweep_orphans(self.root, manifest.seq, fs=self.files.fs)
            return path
        finally:
            self._snapshotting = False

    def inspect(self) -> dict[str, Any]:
        """Figures for ``tarry store inspect`` and the benchmarks."""
        indexed = {n: p.index for n, p in self.partitions.items() if p.index is not None}
        return {
            "partitions": len(self.partitions),
            "pending": sum(p.live for p in self.partitions.values()),
            "indexed_entries": sum(len(i) for i in indexed.values()),
            "index_bytes": sum(i.nbytes for i in indexed.values()),
            "write_groups": self.writer.groups,
            "damaged": list(self.state.damaged),
            "clean_start": self.clean_start,
            "scrubbed_partitions": self.scrubbed,
            "scrub_done": self.scrub_done,
        }

    def write_path(self) -> dict[str, Any]:
        """What the write path has done (``/metrics``): fsyncs by what they made durable,
        group commits, and snapshot durations (``figures.py``)."""
        return {
            "fsyncs": dict(self.files.fs.fsyncs),
            "group_commits": self.writer.groups,
            "snapshot_seconds": self.snapshot_times.figures(),
        }

    @property
    def damaged(self) -> builtins.list[str]:
        """Damaged files and records found so far, one line each (``/healthz``)."""
        return list(self.state.damaged)

    async def check(self) -> builtins.list[str]:
        """Damage found so far (empty when every record read was sound)."""
        return list(self.state.damaged)
