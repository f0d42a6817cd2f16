"""Delivery lag: how late the consumers of a local queue would receive a message entering it now.

Release lag (``tarry.dispatch.lag``) is the server's own: due messages it has not yet put into
their queue. Once released, a message waits in its queue until a consumer takes it; a queue
whose consumers take less than arrives grows, and every message in it is received later than
the last. Per queue, the delivery lag is the longer of:

- the age of its head: now minus the due time of the oldest ready message (a requeued one
  counts from its requeue: it was received once already); it is the lateness the next
  receive gives;
- its forecast: how late a message entering it within the refusal limit from now will be
  taken, in arrival order, at the pace its consumers keep: for each time ``d`` ahead, (ready
  messages + messages accepted for it due by then) ÷ that pace − ``d``, the worst of them.
  The pace is what they received per second over the last ``RATE_WINDOW_MS``, once they have
  received for ``RATE_MIN_SPAN_MS``. It measures what they can take only while their receives
  come back full: consumers keeping up take what arrives, so their pace is the arrival rate.
  Once a receive emptied the queue (it came back with less than it asked for, or with all
  there was), nothing is ready, but what was accepted for it still falls due: the forecast
  then counts that at the pace last measured at full receives (within
  ``FULL_PACE_KEPT_MS``; or the pace now, if higher). Without a full receive's measure, a
  burst for such a queue is not refused on a forecast (only the head's age counts).
  Without the first, an overloaded queue swung: a receive that emptied it opened the door to
  everything offered until those messages fell due, up to a second later, and were late.

Sends to a queue are refused when its delivery lag is over half of ``[dispatch]
overload_lag_ms`` (``refusal_limit_ms``), so that what was accepted before the refusal began
is still received within it.

Only a queue being consumed counts: one that a consumer received from within ``window_ms``
(``[dispatch] delivery_lag_window_ms``). A queue nobody reads is storage, not a delivery: it
never makes the server refuse anything. Its lag is 0.

The figures come from a sampler (``sample``; the engine runs it every ``SAMPLE_MS``): per
queue being consumed, one indexed look at the head and a count of the ready messages that
stops at ``count_cap`` (twice what the consumers take in the refusal limit); the messages
accepted for it are counted per ``_BUCKET_MS`` of their due time as they are stored
(``accepted``; a cancelled one still counts until its time). A send reads the last sample
(``lag_ms``), never the database; what is accepted after it adds, at once, the most it can
add to the forecast (their count ÷ the pace; ``took_in``), so that a sample's 100 ms of
sends at full speed do not all get in. A receive that emptied the queue sets its lag to the
forecast of what still falls due (``received``): a sample taken while it was behind would
otherwise refuse sends to a queue its consumers have just drained.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tarry.errors import Overloaded
from tarry.model.message import Message
from tarry.model.rules import BEHIND_HORIZON_MS
from tarry.store.sql import SqlConnection

__all__ = [
    "RATE_WINDOW_MS",
    "refusal_limit_ms",
    "SAMPLE_MS",
    "DeliveryLag",
    "QueueHead",
    "read_head",
]

I64 = npt.NDArray[np.int64]

#: How often the engine samples the queues being consumed.
SAMPLE_MS = 100
#: How far ahead messages accepted for a queue are kept for its forecast (the limit, which
#: is how far the forecast looks, may grow up to it).
FORECAST_MS = BEHIND_HORIZON_MS
#: The span the consumers' receive rate is measured over, in buckets of ``_BUCKET_MS``.
RATE_WINDOW_MS = 2_000
#: The drain time counts once the consumers received for this long (a rate over a shorter
#: span is mostly the first receive's size, not the consumers' pace).
RATE_MIN_SPAN_MS = 1_000
_BUCKET_MS = 100
#: How long a pace measured at full receives stands for what the consumers can take once
#: they emptied their queue (more of them may have come since).
FULL_PACE_KEPT_MS = 10_000
#: Ready messages counted when no refusal limit is set (the drain time is exact to there).
_COUNT_CAP_FLOOR = 1_000


def refusal_limit_ms(overload_lag_ms: int) -> int:
    """The delivery lag above which sends to a queue are refused: half of ``overload_lag_ms``
    (0: never). The other half is headroom for what no refusal can take back: messages accepted
    before it began, still falling due, and a receive's way to its consumer."""
    return 0 if overload_lag_ms <= 0 else max(1, overload_lag_ms // 2)


@dataclass(frozen=True, slots=True)
class QueueHead:
    """What a sample reads of one queue."""

    #: The due time the head's lag counts from (None: nothing ready).
    oldest_due_ms: int | None
    #: Ready messages, counted up to the cap the sample was given.
    ready: int


def read_head(conn: SqlConnection, queue: str, count_cap: int) -> QueueHead:
    """The oldest ready message of ``queue`` (in arrival order, the next a receive takes) and
    the number of ready ones up to ``count_cap`` (0: not counted). Both read the queue's
    ready index (``messages_ready``: queue, seq where state is ready)."""
    row = conn.execute(
        "SELECT CASE WHEN redelivered <> 0 THEN visible_at_ms ELSE deliver_at_ms END "
        "FROM messages WHERE queue = ? AND state = 'ready' ORDER BY seq LIMIT 1",
        (queue,),
    ).fetchone()
    if row is None:
        return QueueHead(None, 0)
    ready = 0
    if count_cap > 0:
        ready = int(
            conn.execute(
                "SELECT count(*) FROM (SELECT 1 FROM messages "
                "WHERE queue = ? AND state = 'ready' ORDER BY seq LIMIT ?) AS head",
                (queue, count_cap),
            ).fetchone()[0]
        )
    return QueueHead(int(row[0]), ready)


@dataclass(slots=True)
class _Consumed:
    """One queue being consumed: its receives in ``_BUCKET_MS`` buckets, and its last lag."""

    last_received_ms: int
    #: Since when its consumers have received without a pause as long as ``RATE_WINDOW_MS``.
    since_ms: int
    #: Whether the last receive left nothing takeable (the queue was empty).
    emptied: bool = False
    #: [bucket start ms, messages received] for the last ``RATE_WINDOW_MS``.
    buckets: list[list[int]] = field(default_factory=list)
    #: Messages accepted for the queue, by due-time bucket (due ms // ``_BUCKET_MS``).
    due: dict[int, int] = field(default_factory=dict)
    lag_ms: int = 0
    #: The pace last measured while receives came back full, and when: what the consumers
    #: can take (0: not within ``FULL_PACE_KEPT_MS``).
    full_pace_per_s: float = 0.0
    full_pace_at_ms: int = 0
    #: The last forecast and the pace it took (0: none made): each send accepted until the
    #: next sample adds its share to it (``DeliveryLag.accepted_due``).
    ahead_ms: float = 0.0
    ahead_pace_per_s: float = 0.0

    def emptied_lag_ms(self, now_ms: int, horizon_ms: int) -> int:
        """The lag of a queue its consumers emptied: nothing is ready, but what was accepted
        for it still falls due, and they take it no faster than they last could (or than
        they take now, if more). Without that measure, a burst is no lag."""
        if now_ms - self.full_pace_at_ms > FULL_PACE_KEPT_MS:
            self.full_pace_per_s = 0.0
        if not self.full_pace_per_s:
            self.ahead_ms = self.ahead_pace_per_s = 0.0
            return 0
        pace = max(self.full_pace_per_s, self.pace_per_s(now_ms))
        return max(0, self.forecast_ms(now_ms, 0, pace, horizon_ms))

    def took_in(self, count: int) -> None:
        """``count`` more messages were accepted for the queue, due within the forecast's
        horizon: each is taken after all the others, so the worst lateness grows by at most
        the time the consumers need for them. Counted at once, not at the next sample: a
        sample's 100 ms of sends at full speed let in more than the consumers take in it."""
        if self.ahead_pace_per_s:
            self.ahead_ms += count * 1000 / self.ahead_pace_per_s
            self.lag_ms = max(self.lag_ms, round(self.ahead_ms))

    def pace_per_s(self, now_ms: int) -> float:
        """Messages its consumers take per second (0: too short a span to tell)."""
        start = now_ms - RATE_WINDOW_MS
        if self.buckets and self.buckets[0][0] < start:
            self.buckets = [b for b in self.buckets if b[0] >= start]
        span = min(now_ms - self.since_ms, RATE_WINDOW_MS)
        if span < RATE_MIN_SPAN_MS:
            return 0.0
        return sum(b[1] for b in self.buckets) * 1000 / span

    def forecast_ms(self, now_ms: int, ready: int, pace: float, horizon_ms: int) -> int:
        """The worst lateness of a message entering within ``horizon_ms`` (module docstring)."""
        here, last = now_ms // _BUCKET_MS, (now_ms + horizon_ms) // _BUCKET_MS
        for bucket in [b for b in self.due if b < here]:
            del self.due[bucket]
        worst = ready * 1000 / pace
        waiting = ready
        for bucket in sorted(b for b in self.due if b <= last):
            waiting += self.due[bucket]
            worst = max(worst, waiting * 1000 / pace - ((bucket + 1) * _BUCKET_MS - now_ms))
        self.ahead_ms, self.ahead_pace_per_s = worst, pace
        return round(worst)


def _as_list(values: Sequence[int] | I64) -> list[int]:
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


class DeliveryLag:
    """Per queue being consumed, its delivery lag as last sampled (see the module docstring)."""

    def __init__(self) -> None:
        self._queues: dict[str, _Consumed] = {}
        #: At least the largest lag (set by each sample, raised by what raises a lag between
        #: two): a send finds nothing behind without looking at every queue.
        self._worst_ms = 0
        self._horizon_ms = 1_000

    # --- fed by consumers and the sampler -----------------------------------------------------
    def received(self, queue: str, *, taken: int, emptied: bool, now_ms: int) -> None:
        """A receive on ``queue`` took ``taken`` messages; ``emptied``: it left nothing
        takeable (it took fewer than it asked for, or all there was)."""
        entry = self._queues.get(queue)
        if entry is None or now_ms - entry.last_received_ms >= RATE_WINDOW_MS:
            entry = self._queues[queue] = _Consumed(now_ms, now_ms)
        entry.last_received_ms = now_ms
        entry.emptied = emptied
        if taken:
            bucket = now_ms - now_ms % _BUCKET_MS
            if entry.buckets and entry.buckets[-1][0] == bucket:
                entry.buckets[-1][1] += taken
            else:
                entry.buckets.append([bucket, taken])
        if emptied:  # it took everything ready: only what is still falling due waits
            entry.lag_ms = entry.emptied_lag_ms(now_ms, self._horizon_ms)
            self._worst_ms = max(self._worst_ms, entry.lag_ms)

    def accepted(self, messages: Iterable[Message], now_ms: int) -> None:
        """``messages`` were stored, each for the queue it names (``destination``)."""
        if not self._queues:
            return
        pairs = [(m.destination, m.deliver_at_ms) for m in messages]
        self.accepted_due([d for d, _ in pairs], [due for _, due in pairs], now_ms)

    def accepted_due(
        self, destinations: Sequence[str], due_ms: Sequence[int] | I64, now_ms: int
    ) -> None:
        """Messages were stored for the queues ``destinations`` names, row ``k`` due at
        ``due_ms[k]``: ``accepted`` read from columns (a batch of plain sends), so that no
        message object is made for the forecast. A batch for one queue is counted per bucket
        in one pass over its due times."""
        queues = self._queues
        if not queues or not len(destinations):
            return
        until, soon = now_ms + FORECAST_MS, (now_ms + self._horizon_ms) // _BUCKET_MS
        first = destinations[0]
        if destinations.count(first) == len(destinations):  # one queue (the common case)
            entry = queues.get(first)
            if entry is None:
                return
            due = np.asarray(due_ms, dtype=np.int64)
            buckets, counts = np.unique(due[due <= until] // _BUCKET_MS, return_counts=True)
            into = entry.due
            for bucket, count in zip(buckets.tolist(), counts.tolist(), strict=True):
                into[bucket] = into.get(bucket, 0) + count
            entry.took_in(int(counts[buckets <= soon].sum()))
            self._worst_ms = max(self._worst_ms, entry.lag_ms)
            return
        for destination, due_at in zip(destinations, _as_list(due_ms), strict=True):
            entry = queues.get(destination)
            if entry is not None and due_at <= until:
                bucket = due_at // _BUCKET_MS
                entry.due[bucket] = entry.due.get(bucket, 0) + 1
                if bucket <= soon:
                    entry.took_in(1)
                    self._worst_ms = max(self._worst_ms, entry.lag_ms)

    def to_sample(
        self, now_ms: int, *, window_ms: int, waiting: Mapping[str, int], limit_ms: int
    ) -> dict[str, int]:
        """The queues a sample should look at now, each with its ``count_cap``. Queues not
        received from within ``window_ms`` are forgotten; a queue whose last receive emptied
        it and whose consumer still waits has nothing ready (it would have been woken)."""
        gone = [q for q, e in self._queues.items() if now_ms - e.last_received_ms > window_ms]
        for queue in gone:
            del self._queues[queue]
        counted_ms = limit_ms or 1_000
        wanted: dict[str, int] = {}
        for queue, entry in self._queues.items():
            pace = entry.pace_per_s(now_ms)
            if entry.emptied and waiting.get(queue):  # nothing ready, consumers have room
                entry.lag_ms = entry.emptied_lag_ms(now_ms, self._horizon_ms)
                continue
            # No pace yet: only the head's age counts, so nothing is counted.
            cap = max(math.ceil(pace * 2 * counted_ms / 1000), _COUNT_CAP_FLOOR) if pace else 0
            wanted[queue] = cap
        self._worst_ms = self.worst_ms()
        return wanted

    def sampled(
        self, now_ms: int, heads: Iterable[tuple[str, QueueHead]], *, limit_ms: int
    ) -> None:
        """What a sample read (``read_head`` per queue of ``to_sample``); the forecast looks
        ``limit_ms`` ahead (0: 1 s)."""
        horizon_ms = self._horizon_ms = limit_ms or 1_000
        for queue, head in heads:
            entry = self._queues.get(queue)
            if entry is None:  # forgotten meanwhile
                continue
            age = 0 if head.oldest_due_ms is None else max(0, now_ms - head.oldest_due_ms)
            pace = entry.pace_per_s(now_ms)
            # A pace is a capacity only while receives come back full (the module docstring).
            if pace and not entry.emptied:
                entry.full_pace_per_s, entry.full_pace_at_ms = pace, now_ms
                ahead = entry.forecast_ms(now_ms, head.ready, pace, horizon_ms)
            else:
                ahead = entry.emptied_lag_ms(now_ms, horizon_ms)
            entry.lag_ms = max(age, ahead)
        self._worst_ms = self.worst_ms()

    # --- read by intake, /healthz, /v1/stats and /metrics -------------------------------------
    def lag_ms(self, queue: str) -> int:
        """``queue``'s delivery lag as last sampled (0: not being consumed, or on time)."""
        entry = self._queues.get(queue)
        return 0 if entry is None else entry.lag_ms

    def worst_ms(self) -> int:
        """The largest delivery lag of any queue being consumed (0: none)."""
        return max((e.lag_ms for e in self._queues.values()), default=0)

    def behind(self, limit_ms: int) -> dict[str, int]:
        """Queues whose lag is over ``limit_ms`` (0: none ever is), with their lag."""
        if limit_ms <= 0 or self._worst_ms <= limit_ms:
            return {}
        return {q: e.lag_ms for q, e in self._queues.items() if e.lag_ms > limit_ms}

    def refuse_if_all_behind(
        self,
        destinations: Iterable[object],
        limit_ms: int,
        *,
        queues_of: Callable[[str], Collection[str]],
        may_send: Callable[[str], bool] | None = None,
    ) -> None:
        """Raise ``Overloaded`` when every one of ``destinations`` (a request's, one per send)
        has a queue (``queues_of``: a queue itself, a topic's subscribed ones) further behind
        than ``limit_ms``: the send rules would refuse each send of it alike, so it is refused
        whole, before any of it is checked. Anything else (a route, a name that is not one, a
        destination ``may_send`` refuses) leaves the request to the rules."""
        behind = self.behind(limit_ms)
        if not behind:
            return
        worst: tuple[int, str] | None = None
        for destination in set(destinations):
            if not isinstance(destination, str) or (may_send and not may_send(destination)):
                return
            lag = max(((behind.get(q, 0), q) for q in queues_of(destination)), default=None)
            if lag is None or lag[0] == 0:
                return
            worst = lag if worst is None else max(worst, lag)
        if worst is not None:
            raise Overloaded.consumers_behind(worst[1], worst[0], limit_ms)

    def snapshot(self) -> dict[str, int]:
        """Every queue being consumed with its lag, by name."""
        return {q: e.lag_ms for q, e in sorted(self._queues.items())}
