"""``LogStore``: the time-partitioned log store (Pulsar PIP-26's design) behind the
``DelayedStore`` contract, with a separate queue database (``tarry.store.base``).

- Every accepted change is one group commit of the write-ahead log (``wal.py``: one write, one
  fsync per group, ``writer.py``), then appended to the partition covering its due time
  (``partition.py``; coarser partitions far ahead, ``layout.py``) without an fsync; only
  partitions that are due (and the next, ``prefetch_ms`` ahead) carry a ``DueIndex``.
- In-memory bookkeeping changes in the writer's ``on_written`` step, together with the sizes a
  snapshot records; a message taken out of circulation before its marker is on disk (cancel,
  reschedule, release) stays in ``_leaving`` meanwhile, and snapshots include it; one released
  into a local queue kept in memory stays there until that queue is done with it (``leave``,
  ``finish_left``; ``leaving.py``).
- A message id carries its due time (``tarry.model.ids``): ``get``, ``cancel`` and
  ``reschedule`` read one partition (following MOVED markers), never all of them.
- Checkpoints (``checkpoint.py``: partitions fsynced, then a snapshot and its manifest naming
  the WAL position) every ``snapshot_interval_ms`` and on close; ``opening.py`` on open (the
  checkpoint, then the WAL tail); ``cleanup.py`` deletes released partitions. The partitions
  and their state are owned by a ``PartitionTable`` (``table.py``).
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from itertools import repeat
from operator import attrgetter
from pathlib import Path
from typing import Any

from tarry.errors import NotCancellable, NotFound, TarryError, Unavailable
from tarry.model.accepted import AcceptedColumns
from tarry.model.message import Message
from tarry.model.query import MessageQuery
from tarry.model.state import MessageState, transition
from tarry.store.base import StoreOutcome
from tarry.store.log import clean, cleanup, leaving
from tarry.store.log.appending import Appender, NewRecords
from tarry.store.log.checkpoint import Checkpoints
from tarry.store.log.claiming import claim_due
from tarry.store.log.dedupe import admit
from tarry.store.log.figures import write_path
from tarry.store.log.forecast import due_counts
from tarry.store.log.fs import Files
from tarry.store.log.held import Failure, Held, dedupe_hash, key_hash
from tarry.store.log.indexing import IndexAhead
from tarry.store.log.layout import Layout
from tarry.store.log.locate import Located, list_page, locate_many
from tarry.store.log.opening import recover
from tarry.store.log.reading import pick_due
from tarry.store.log.record import (
    CANCELLED,
    FAILED,
    MOVED,
    encode_marker,
    encode_message,
    encode_messages,
)
from tarry.store.log.record_columns import encode_plain_columns
from tarry.store.log.recovery import Recovered
from tarry.store.log.scrub import scrub_all
from tarry.store.log.segment import SegmentFiles
from tarry.store.log.table import PartitionTable, by_destination
from tarry.store.log.wal import WalLog
from tarry.store.log.writer import GroupWriter
from tarry.store.sqlite.rows import queue_dedupe_key

__all__ = ["LogStore"]

log = logging.getLogger(__name__)

#: A time later than any lease runs out.
_NEVER = 2**63 - 1

_sent_at = attrgetter("sent_at_ms")
_message_id, _destination = attrgetter("message_id"), attrgetter("destination")


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
        wal_segment_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.root = root
        self.granularity_ms = granularity_ms
        self.snapshot_interval_ms = snapshot_interval_ms
        self.prefetch_ms = prefetch_ms
        #: Makes the queue database's releases durable before a partition's files go.
        self.barrier = barrier
        self.layout = Layout(granularity_ms)
        #: Every change to the store's files goes through ``files.fs`` (``fs.py``).
        self.files = SegmentFiles(fs)
        #: The partitions and everything that goes with them (``table.py``).
        self.table = table = PartitionTable(
            root, self.layout, prefetch_ms=prefetch_ms, flush=self.files.flush
        )
        self.partitions = table.partitions
        self._numbers = table.numbers
        #: Builds partitions' indexes in the background as they come within ``prefetch_ms``
        #: (and large ones found due unindexed, after downtime: ``reading.ensure_loaded``).
        self._ahead = IndexAhead(table)
        self._claims, self._waiting, self._leaving = table.claims, table.waiting, table.leaving
        #: No claim's lease runs out before this (claims given back since may leave it early).
        self._claims_lapse_ms = _NEVER
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tarry-log")
        self._scrub_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tarry-scrub")
        self._scrubbing: asyncio.Task[None] | None = None
        #: Partitions the start-up scrub has checked (``scrub.py``), and whether it is done.
        self.scrubbed = 0
        self.scrub_done = False
        self.writer = GroupWriter(
            self.files,
            WalLog(root, self.files.fs, segment_bytes=wal_segment_bytes),
            self._executor,
            fsync=fsync,
            commit_interval_ms=commit_interval_ms,
            segment_bytes=segment_bytes,
        )
        self.checkpoints = Checkpoints(
            root, table=table, files=self.files, writer=self.writer, executor=self._executor
        )
        #: De-duplication keys of messages being written (not yet in ``state.dedupe``).
        self._unwritten: dict[int, Message] = {}
        self._appender = Appender(table, self.layout, self.writer, self._unwritten)
        self._last_upkeep_ms = 0
        self._opened = False
        self._upkeeping: asyncio.Task[None] | None = None
        self.recovery_seconds = 0.0
        #: The last start trusted a clean-close record (``clean.py``): no partition checked.
        self.clean_start = False

    @property
    def state(self) -> Recovered:
        return self.table.state

    # --- lifecycle --------------------------------------------------------------------------
    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        opened = await loop.run_in_executor(
            self._executor, lambda: recover(self.root, table=self.table, files=self.files)
        )
        self.checkpoints.seq = opened.seq
        self.clean_start = opened.clean_start
        self.recovery_seconds = opened.seconds
        wal = self.writer.wal
        await loop.run_in_executor(self._executor, wal.start, opened.next_wal_seq)
        self.writer.wal_end = wal.position
        self._opened = True
        if opened.migrated or opened.adopted:  # an older tarry's directory; imports adopted
            await self.snapshot()
        self._scrubbing = loop.create_task(self._scrub(), name="tarry-log-scrub")

    async def _scrub(self) -> None:
        """Check every partition found at the start, nearest due first (``scrub.py``)."""

        def counted() -> None:
            self.scrubbed += 1

        await scrub_all(self.table, self._scrub_pool, on_partition=counted, log=log)
        self.scrub_done = True

    async def close(self) -> None:
        await self._ahead.close()
        if self._scrubbing is not None:
            self._scrubbing.cancel()
            await asyncio.gather(self._scrubbing, return_exceptions=True)
        if self._upkeeping is not None:
            await asyncio.gather(self._upkeeping, return_exceptions=True)
        await asyncio.gather(self.writer.drain(), return_exceptions=True)
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
                    record = clean.CleanClose(self.checkpoints.seq, written)
                    await loop.run_in_executor(
                        self._executor,
                        lambda: clean.mark(self.root, record, fs=self.files.fs),
                    )
            except OSError as exc:  # a full disk: the next start checks every file instead
                log.error("closing without a final snapshot or clean-close record: %s", exc)
        self._opened = False
        self.writer.wal.close()
        self.files.close()
        self._executor.shutdown(wait=True)
        self._scrub_pool.shutdown(wait=True)

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
        """Batch-shaped: the records are encoded in one pass and laid out by partition in one
        vectorised pass (``batch.py``); each partition's run gets one contiguous append (one
        reservation, one slice of the group commit's write) and, when indexed, one ``add`` of
        arrays."""
        self._check()
        n = len(messages)
        keys = [0] * n  # most batches: no message_id to de-duplicate by (checked in C)
        if list(map(_message_id, messages)).count(None) < n:
            keys = [dedupe_hash(m) if m.message_id is not None else 0 for m in messages]
        accepted: Sequence[Message]
        if any(keys):
            admitted = await admit(
                messages,
                keys,
                dedupe=self.state.dedupe,
                unwritten=self._unwritten,
                locate_many=self._locate_many,
                get=self.get,
            )
            outcomes, accepted = admitted.outcomes, admitted.accepted
            hashes, keyed = admitted.hashes, admitted.keyed
        else:  # nothing to de-duplicate: every message is new
            outcomes = list(map(StoreOutcome, messages, repeat(True, n)))
            accepted, hashes, keyed = messages, keys, []
        if not accepted:
            return outcomes
        new = NewRecords(
            encode_messages(accepted, hashes),
            [m.deliver_at_ms for m in accepted],
            list(map(_destination, accepted)),
            max(map(_sent_at, accepted)),
            accepted,
            keyed,
        )
        await self._appender.append(new, now_ms=max(self.table.now_ms, accepted[0].sent_at_ms))
        return outcomes

    async def store_columns(self, batch: AcceptedColumns) -> bool:
        """``store`` of plain messages given as columns (``ColumnStore``): their records are
        encoded from the columns, no message object made for them unless keyed. False, with
        nothing stored, when a ``message_id`` names a message this store holds or is writing
        (``store`` answers those)."""
        self._check()
        if not len(batch):
            return True
        hashes, keyed = None, []
        if batch.message_id is not None:
            hashes = list(map(key_hash, map(queue_dedupe_key, batch.destination, batch.message_id)))
            dedupe, unwritten = self.state.dedupe, self._unwritten
            keys = [key for key in hashes if key]
            if len(set(keys)) < len(keys) or any(k in dedupe or k in unwritten for k in keys):
                return False  # repeated in the batch, or a message here has it
            messages = batch.messages()
            keyed = [(key, messages[k]) for k, key in enumerate(hashes) if key]
            # Known from here on (no await since the look-up): a concurrent batch repeating one
            # of these keys is answered with its message (``admit``).
            unwritten.update(keyed)
        new = NewRecords(
            encode_plain_columns(batch, hashes),
            batch.deliver_at_ms,
            batch.destination,
            batch.sent_at_ms,
            batch.messages(),
            keyed,
        )
        await self._appender.append(new, now_ms=max(self.table.now_ms, batch.sent_at_ms))
        return True

    # --- due messages -----------------------------------------------------------------------
    async def fetch_due(self, now_ms: int, *, limit: int, lease_ms: int) -> Sequence[Message]:
        self._check()
        table = self.table
        table.now_ms = max(table.now_ms, now_ms)
        if self._claims_lapse_ms <= now_ms:
            self._lapse_claims(now_ms)
        helds = pick_due(table, self.files, now_ms, limit, self._ahead.start)
        until = now_ms + lease_ms
        out = claim_due(table, self.files, helds, now_ms=now_ms, until_ms=until)
        if out:
            self._claims_lapse_ms = min(self._claims_lapse_ms, until)
        if now_ms - self._last_upkeep_ms >= self.snapshot_interval_ms and self._upkeeping is None:
            self._last_upkeep_ms = now_ms
            self._upkeeping = asyncio.get_running_loop().create_task(self._upkeep(now_ms))
        return out

    def _lapse_claims(self, now_ms: int) -> None:
        """Claims whose lease ran out wait again at their due time. Looked for only once the
        earliest lease may have run out (``_claims_lapse_ms``), not at every round: a round
        would otherwise walk every claim still out."""
        table, lapse = self.table, _NEVER
        for message_id, held in list(self._claims.items()):
            if held.until <= now_ms:
                del self._claims[message_id]
                table.wait(message_id, held, held.due)
            else:
                lapse = min(lapse, held.until)
        self._claims_lapse_ms = lapse

    async def _upkeep(self, now_ms: int) -> None:
        """Cleanup, then a snapshot if anything changed (every ``snapshot_interval_ms``)."""
        try:
            await self.delete_released(now_ms)
            if self.table.changes:
                await self.snapshot()
        except Exception:
            log.exception("log store upkeep failed")
        finally:
            self._upkeeping = None

    async def next_due_time(self) -> int | None:
        self._check()
        best = self.table.next_waiting()
        for number in list(self._numbers):  # indexing below yields: partitions may come and go
            partition = self.partitions.get(number)
            if partition is None or partition.live <= 0:
                continue
            if best is not None and best < partition.start_ms:
                break
            # The earliest partition with pending messages is the next to fall due: indexing
            # it now gives the exact time (and it is needed next anyway).
            await self._ahead.index(partition)
            assert partition.index is not None
            candidate = partition.index.next_due()
            if candidate is not None:
                best = candidate if best is None else min(best, candidate)
        return best

    def release_claims(self, ids: Sequence[str]) -> None:
        for message_id in ids:
            held = self._claims.pop(message_id, None)
            if held is not None:
                self.table.wait(message_id, held, held.due)

    def hold_claims(self, ids: Sequence[str], *, until_ms: int) -> None:
        """Keep claimed messages back until ``until_ms`` without counting a failure (their
        destination is away); they wait beside the retries and fall due again then."""
        for message_id in ids:
            held = self._claims.pop(message_id, None)
            if held is not None:
                self.table.wait(message_id, held, until_ms)

    # --- finishing --------------------------------------------------------------------------
    def _finished(self, message_id: str, held: Held) -> None:
        self.table.finished([(message_id, held)])

    async def remove(self, ids: Sequence[str], *, state: MessageState, now_ms: int) -> int:
        self._check()
        taken = leaving.take_out(self.table, self.files, ids)
        if state is MessageState.READY:
            # A release into a local queue is in the queue database already: its marker needs
            # no fsync, nor a group of its own (``GroupWriter.defer``). Other ends wait.
            self._defer_markers(taken, state, self.table.defer(taken))
        elif taken:
            try:
                await self.writer.append(
                    leaving.markers(self.table, taken, state),
                    durable=True,
                    on_written=lambda _: self.table.finished(taken),
                )
            except TarryError:
                self.table.put_back(taken)
                raise
        return len(taken)

    def may_leave(self, ids: Sequence[str]) -> bool:
        """Whether ``leave`` would take every message of ``ids`` (each claimed) and none came
        back after a marker failed (its release may be in the queue database already)."""
        came_back, claims = self.table.came_back, self._claims
        return all(map(claims.__contains__, ids)) and (not came_back or came_back.isdisjoint(ids))

    def leave(self, ids: Sequence[str]) -> None:
        """Released into a local queue kept in memory: out of circulation (and no longer
        counted as scheduled), with no marker yet; ``finish_left`` writes it. A crash before
        then finds them due again."""
        self._check()
        self.table.defer(leaving.take_out(self.table, self.files, ids))

    async def finish_left(
        self, ids: Sequence[str], *, state: MessageState, now_ms: int, durable: bool
    ) -> int:
        """Write the markers of messages ``leave`` took out, ended in ``state``, and return
        once they are written (fsynced too when ``durable`` and the policy fsyncs). A marker
        that fails puts its message back, due again at once, and raises."""
        self._check()
        taken = leaving.left(self.table, ids)
        if not taken:
            return 0
        counts = by_destination(taken)
        try:
            await self.writer.append(
                leaving.markers(self.table, taken, state),
                durable=durable,
                on_written=lambda _: self.table.deferred_done(taken, counts, written=True),
            )
        except TarryError:
            self.table.deferred_done(taken, counts, written=False)
            raise
        return len(taken)

    def _defer_markers(
        self, taken: leaving.Taken, state: MessageState, counts: dict[str, int]
    ) -> None:
        if not taken:
            return
        table = self.table
        self.writer.defer(
            leaving.markers(table, taken, state),
            on_written=lambda _: table.deferred_done(taken, counts, written=True),
            on_failed=lambda: table.deferred_done(taken, counts, written=False),
        )

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
        self.table.wait(message_id, held, retry_at_ms)
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
            None, locate_many, self.table, message_ids
        )

    async def cancel(self, message_id: str, *, now_ms: int) -> Message:
        self._check()
        leaving.refuse_claimed(self.table, message_id)
        found = await self._locate(message_id)
        message = found.message
        transition(message_id, message.state, MessageState.CANCELLED)
        held = leaving.take_located(self.table, found)
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
            self.table.put_back([(message_id, held)])
            raise
        message.state, message.updated_at_ms = MessageState.CANCELLED, now_ms
        return message

    async def reschedule(self, message_id: str, *, deliver_at_ms: int, now_ms: int) -> Message:
        self._check()
        leaving.refuse_claimed(self.table, message_id)
        found = await self._locate(message_id)
        message = found.message
        if message.state is not MessageState.SCHEDULED:
            raise NotCancellable(
                f"message {message_id} is {message.state.value}; only scheduled messages can "
                "be rescheduled"
            )
        held = leaving.take_located(self.table, found)
        moved = replace(message, deliver_at_ms=deliver_at_ms, updated_at_ms=now_ms)
        target = self.table.partition(self.layout.key_for(deliver_at_ms, now_ms), now_ms=now_ms)
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
            self.table.put_back([(message_id, held)])
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
        return await list_page(self.table, query)

    async def count_scheduled(self, destination: str | None = None) -> int:
        return self.table.scheduled(destination)

    async def due_counts(self, start_ms: int, width_ms: int, buckets: int) -> builtins.list[int]:
        self._check()
        return due_counts(self.table, start_ms=start_ms, width_ms=width_ms, buckets=buckets)

    # --- checkpoints ------------------------------------------------------------------------
    async def snapshot(self) -> Path | None:
        """Write a checkpoint (``checkpoint.py``); its manifest's path, or None while another
        is being written. The state is captured in one event-loop step, so it agrees with the
        ``written`` sizes and the WAL position it records."""
        if self.checkpoints.running:
            return None
        self.table.changes = 0
        return await self.checkpoints.take()

    async def delete_released(self, now_ms: int) -> int:
        """Delete the partitions whose every message is released (``cleanup.py``), their
        deferred release markers written first."""
        await self.writer.drain()
        return await cleanup.delete_released(
            self.table, now_ms, files=self.files, checkpoint=self._checkpoint, barrier=self.barrier
        )

    async def _checkpoint(self) -> Path | None:
        """A checkpoint begun now (after the one being written, if any)."""
        for _ in range(2_000):
            path = await self.snapshot()
            if path is not None:
                return path
            await asyncio.sleep(0.005)
        return None

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
        """What the write path has done (``/metrics``; ``figures.write_path``)."""
        return write_path(self.files.fs.fsyncs, self.writer, self.checkpoints.times)

    @property
    def damaged(self) -> builtins.list[str]:
        """Damaged files and records found so far, one line each (``/healthz``)."""
        return list(self.state.damaged)

    async def check(self) -> builtins.list[str]:
        """Damage found so far (empty when every record read was sound)."""
        return list(self.state.damaged)
