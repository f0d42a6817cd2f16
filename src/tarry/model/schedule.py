"""Recurring schedules: the validated spec (``parse_schedule``) and when its occurrences fall
(``Schedule.occurrences_after``, ``plan_top_up``). Pure: no I/O, no clock of its own.

Cron expressions are read and evaluated by ``cronsim`` (the evaluator of Healthchecks), not by
tarry: 5 fields (``minute hour day-of-month month day-of-week``), or 6 with seconds first
(``second minute hour ...``, as Quartz, BullMQ and Sidekiq-cron write them), plus the nicknames
``@yearly``, ``@monthly``, ``@weekly``, ``@daily`` and ``@hourly``. Times are wall-clock times in
an IANA zone (``zoneinfo``), and daylight-saving changes follow Debian's cron, which is what cron
users expect:

- a time that does not exist (spring forward, e.g. 02:30 on the night clocks go from 02:00 to
  03:00) runs once, at the first instant after the jump (03:00);
- a time that exists twice (fall back, e.g. 01:30 when clocks go from 02:00 back to 01:00) runs
  once, the first time;
- an expression whose minute or hour field starts with ``*`` ("every 15 minutes", "every
  hour") is a rhythm, not a time of day: it runs on real time, so it skips the hour that does
  not exist and runs in both passes of the hour that repeats.

A 6-field expression gets the same treatment: the seconds are added to each minute the other
five fields pick (cronsim's own 6-field mode drops the Debian rules).

Each occurrence becomes an ordinary message with ``message_id`` ``sched:{name}:{epoch ms}``
(``occurrence_message_id``); ``tarry.engine.schedules`` stores them ahead of time.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from tarry.errors import InvalidArgument
from tarry.model.message import MAX_DELAY_MS
from tarry.model.time import parse_instant_ms
from tarry.model.validate import check_name, parse_send

__all__ = [
    "CatchUp",
    "Occurrence",
    "Schedule",
    "TopUp",
    "check_has_future",
    "occurrence_message_id",
    "parse_schedule",
    "plan_top_up",
]

#: Every field of ``PUT /v1/schedules/{name}``.
SCHEDULE_FIELDS = frozenset(
    {
        "cron",
        "timezone",
        "destination",
        "body",
        "body_base64",
        "headers",
        "ttl_ms",
        "start_at",
        "end_at",
        "catch_up",
    }
)

#: The nicknames Vixie cron accepts, as the 5-field expressions they stand for.
_NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

#: A probe instant for reading the seconds field (any whole minute will do).
_EPOCH_2000 = datetime(2000, 1, 1, tzinfo=UTC)


class CatchUp(enum.StrEnum):
    """What happens to the occurrences that fell while no node was running."""

    #: Missed occurrences are dropped; the schedule goes on from now.
    SKIP = "skip"
    #: One occurrence (the latest missed one) is delivered now for all of them.
    ONCE = "once"


def occurrence_message_id(name: str, at_ms: int) -> str:
    """The ``message_id`` of the occurrence of schedule ``name`` at ``at_ms``: the same on every
    node and after every restart, so the store keeps it once."""
    return f"sched:{name}:{at_ms}"


def correlation_id(name: str) -> str:
    """Every occurrence of schedule ``name`` carries this ``correlation_id`` (list them with
    ``GET /v1/messages?correlation_id=sched:NAME``)."""
    return f"sched:{name}"


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One occurrence to store: its cron time, and when it is delivered (its time, or now for the
    one a ``once`` catch-up delivers late)."""

    at_ms: int
    deliver_at_ms: int


@dataclass(frozen=True, slots=True)
class Schedule:
    name: str
    cron: str
    timezone: str
    destination: str
    #: ``{"body": ...}`` or ``{"body_base64": ...}`` as given (or empty).
    body: Mapping[str, str]
    headers: Mapping[str, str]
    ttl_ms: int | None
    start_at_ms: int | None
    end_at_ms: int | None
    catch_up: CatchUp
    #: The 5-field expression cronsim evaluates (minutes and coarser).
    _minutes: str
    #: The seconds of a 6-field expression (None: 5 fields, second 0).
    _seconds: tuple[int, ...] | None

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    def to_dict(self) -> dict[str, Any]:
        """The definition as stored and shown (times in epoch ms)."""
        return {
            "cron": self.cron,
            "timezone": self.timezone,
            "destination": self.destination,
            **self.body,
            "headers": dict(self.headers),
            "ttl_ms": self.ttl_ms,
            "start_at": self.start_at_ms,
            "end_at": self.end_at_ms,
            "catch_up": self.catch_up.value,
        }

    # --- when ---------------------------------------------------------------------------------
    def _in_bounds(self, at_ms: int) -> bool:
        return (self.start_at_ms is None or at_ms >= self.start_at_ms) and (
            self.end_at_ms is None or at_ms <= self.end_at_ms
        )

    def _cron(self, after_ms: int, *, reverse: bool = False) -> Iterator[int]:
        """cronsim's matches of the minute expression, as epoch ms (whole seconds): strictly
        after ``after_ms``'s whole second going forward, at or before it going back (cronsim
        counts a fraction of a second as the first step back)."""
        try:
            start = datetime.fromtimestamp(after_ms // 1000, tz=self.zone)
            if after_ms % 1000:
                start = start.replace(microsecond=(after_ms % 1000) * 1000)
            for moment in CronSim(self._minutes, start, reverse=reverse):
                yield int(moment.timestamp()) * 1000
        except StopIteration:  # cronsim found nothing within 50 years
            return
        except (OverflowError, ValueError):  # past year 9999 (a start_at near it): none after
            return

    def _matches(self, after_ms: int) -> Iterator[int]:
        """Every cron time strictly after ``after_ms``, ascending (bounds not applied)."""
        if self._seconds is None:
            for at in self._cron(after_ms):
                if at > after_ms:  # a wall-clock repeat (fall back) can name an earlier instant
                    yield at
            return
        # The minute holding ``after_ms`` is a candidate too: start just before it.
        for minute in self._cron((after_ms // 60_000) * 60_000 - 1000):
            for second in self._seconds:
                at = minute + second * 1000
                if at > after_ms:
                    yield at

    def occurrences_after(self, after_ms: int) -> Iterator[int]:
        """The occurrences strictly after ``after_ms``, ascending, within start and end."""
        if self.start_at_ms is not None and after_ms < self.start_at_ms:
            after_ms = self.start_at_ms - 1
        for at in self._matches(after_ms):
            if self.end_at_ms is not None and at > self.end_at_ms:
                return
            yield at

    def latest_at_or_before(self, at_ms: int) -> int | None:
        """The last occurrence at or before ``at_ms`` (within start and end), or None."""
        if self.end_at_ms is not None:
            at_ms = min(at_ms, self.end_at_ms)
        if self._seconds is None:
            found = next(self._cron(at_ms + 1, reverse=True), None)
        else:
            found = None
            minutes = self._cron((at_ms // 60_000) * 60_000 + 1, reverse=True)
            for minute in (next(minutes, None), next(minutes, None)):
                if minute is None:
                    break
                fitting = [minute + s * 1000 for s in self._seconds if minute + s * 1000 <= at_ms]
                if fitting:
                    found = max(fitting)
                    break
        if found is None or found > at_ms or not self._in_bounds(found):
            return None
        return found

    def next_occurrences(self, after_ms: int, count: int) -> list[int]:
        found = []
        for at in self.occurrences_after(after_ms):
            found.append(at)
            if len(found) == count:
                break
        return found

    def local_time(self, at_ms: int) -> str:
        """``at_ms`` as an RFC 3339 time in the schedule's zone (its offset shows DST)."""
        moment = datetime.fromtimestamp(at_ms / 1000, tz=self.zone)
        return moment.isoformat(timespec="seconds")

    # --- what ---------------------------------------------------------------------------------
    def occurrence_send(self, occurrence: Occurrence, *, now_ms: int) -> dict[str, Any]:
        """The send (as the HTTP API takes it) that stores ``occurrence``. ``ttl_ms`` counts
        from the occurrence's delivery time, whenever it is stored."""
        data: dict[str, Any] = {
            "destination": self.destination,
            **self.body,
            "headers": dict(self.headers),
            "deliver_at": occurrence.deliver_at_ms,
            "message_id": occurrence_message_id(self.name, occurrence.at_ms),
            "correlation_id": correlation_id(self.name),
        }
        if self.ttl_ms is not None:
            data["ttl_ms"] = self.ttl_ms + max(0, occurrence.deliver_at_ms - now_ms)
        return data


def _timezone(value: object) -> str:
    if value is None:
        return "UTC"
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument("timezone must be an IANA time zone name such as Europe/Paris")
    try:
        ZoneInfo(value)
    # OSError: a key too long for a file name (ZoneInfo looks it up as a path).
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidArgument(
            f"timezone {value!r} is not a known IANA time zone; use a name such as "
            "Europe/Paris, America/New_York or UTC"
        ) from None
    return value


def _cron(value: object, zone: str) -> tuple[str, tuple[int, ...] | None]:
    """Check ``value`` with cronsim; return the 5-field expression and the seconds (6 fields)."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgument(
            "cron must be a cron expression such as '0 9 * * 1-5' (5 fields) or "
            "'*/15 * * * * *' (6 fields, seconds first)"
        )
    text = _NICKNAMES.get(value.strip().lower(), value.strip())
    fields = text.split()
    if len(fields) not in (5, 6):
        raise InvalidArgument(
            f"cron {value!r} has {len(fields)} fields; write 5 (minute hour day-of-month "
            "month day-of-week) or 6 (second first), e.g. '0 9 * * 1-5'"
        )
    try:
        CronSim(text, _EPOCH_2000.astimezone(ZoneInfo(zone)))
    except CronSimError as exc:
        raise InvalidArgument(f"cron {value!r} is not valid: {exc}") from None
    if len(fields) == 5:
        return text, None
    # The seconds a 6-field expression names: cronsim's matches within one minute.
    probe = CronSim(f"{fields[0]} * * * * *", _EPOCH_2000 - timedelta(seconds=1))
    seconds = []
    for moment in probe:
        if moment.minute != 0:
            break
        seconds.append(moment.second)
    return " ".join(fields[1:]), tuple(seconds)


def parse_schedule(name: str, data: Mapping[str, Any]) -> Schedule:
    """Validate ``PUT /v1/schedules/{name}``'s body. The message part is checked by the send
    rules' own parser (``parse_send``); what needs the destination (that it exists, that the
    token may send there) is checked when the engine stores the first occurrence."""
    check_name(name, field="schedule name")
    if not isinstance(data, Mapping):
        raise InvalidArgument("a schedule must be a JSON object")
    unknown = set(data) - SCHEDULE_FIELDS
    if unknown:
        raise InvalidArgument(
            f"unknown schedule field(s) {', '.join(sorted(unknown))}; "
            f"allowed: {', '.join(sorted(SCHEDULE_FIELDS))}"
        )
    if data.get("cron") is None:
        raise InvalidArgument("cron is required, e.g. '0 9 * * 1-5' for 09:00 on weekdays")
    zone = _timezone(data.get("timezone"))
    minutes, seconds = _cron(data["cron"], zone)
    body = {k: data[k] for k in ("body", "body_base64") if data.get(k) is not None}
    # The message every occurrence is: the send rules' parser checks it (destination name,
    # body or body_base64, headers, ttl_ms).
    template = {"destination": data.get("destination"), **body, "headers": data.get("headers")}
    if data.get("ttl_ms") is not None:
        template["ttl_ms"] = data["ttl_ms"]
    request = parse_send(template)
    start = data.get("start_at")
    end = data.get("end_at")
    start_ms = None if start is None else parse_instant_ms(start, field="start_at")
    end_ms = None if end is None else parse_instant_ms(end, field="end_at")
    if start_ms is not None and end_ms is not None and end_ms < start_ms:
        raise InvalidArgument(f"end_at ({end_ms}) is before start_at ({start_ms}); swap them")
    given = data.get("catch_up")
    try:
        # (None only means the default: "", {} or 0 are answered as what they are)
        catch_up = CatchUp.SKIP if given is None else CatchUp(given)
    except (ValueError, TypeError):
        raise InvalidArgument(
            f"catch_up {data.get('catch_up')!r} is unknown; use 'skip' (drop occurrences missed "
            "while tarry was down) or 'once' (deliver one for them)"
        ) from None
    return Schedule(
        name=name,
        cron=str(data["cron"]).strip(),
        timezone=zone,
        destination=request.destination,
        body=body,
        headers=dict(request.headers),
        ttl_ms=request.ttl_ms,
        start_at_ms=start_ms,
        end_at_ms=end_ms,
        catch_up=catch_up,
        _minutes=minutes,
        _seconds=seconds,
    )


@dataclass(frozen=True, slots=True)
class TopUp:
    """What one top-up of a schedule stores, and what it leaves behind."""

    occurrences: list[Occurrence]
    #: The time of the last occurrence stored (every occurrence up to it is stored or was
    #: dropped by the catch-up policy); unchanged when nothing was stored.
    planned_through_ms: int
    #: True when occurrences fell while no node was running (the catch-up policy applied).
    missed: bool
    #: True when the schedule has no occurrence left (past ``end_at``).
    finished: bool


def plan_top_up(
    schedule: Schedule,
    *,
    planned_through_ms: int,
    now_ms: int,
    horizon_ms: int,
    max_ahead: int,
    late_after_ms: int,
) -> TopUp:
    """The occurrences to store now: every one after ``planned_through_ms`` up to
    ``now_ms + horizon_ms`` and the first one past it (so the next occurrence is always stored,
    however far, within the maximum delay), with at most ``max_ahead`` stored ahead of now.

    Occurrences due more than ``late_after_ms`` ago that were never stored fell while no node
    ran: ``skip`` drops them, ``once`` stores the latest of them, due now."""
    found: list[Occurrence] = []
    after = planned_through_ms
    missed = False
    cutoff = now_ms - late_after_ms
    if after < cutoff:
        latest = schedule.latest_at_or_before(cutoff)
        if latest is not None and latest > after:
            missed = True
            if schedule.catch_up is CatchUp.ONCE:
                found.append(Occurrence(latest, now_ms))
            after = latest
    # Occurrences already stored ahead of now count against ``max_ahead``.
    room = max_ahead
    for at in schedule.occurrences_after(now_ms):
        if at > after or room == 0:
            break
        room -= 1
    room += len(found)  # a catch-up occurrence is due now, not ahead
    exhausted = True
    for at in schedule.occurrences_after(after):
        if at - now_ms > MAX_DELAY_MS or len(found) >= room:
            exhausted = False
            break
        found.append(Occurrence(at, at))  # one due already is delivered at once
        if at > now_ms + horizon_ms:
            exhausted = False
            break
    last = found[-1].at_ms if found else after
    return TopUp(found, max(planned_through_ms, last), missed, exhausted)


def check_has_future(schedule: Schedule, *, now_ms: int) -> None:
    """Refuse a schedule that would never run again."""
    if next(schedule.occurrences_after(now_ms), None) is None:
        bound = " before end_at" if schedule.end_at_ms is not None else ""
        raise InvalidArgument(
            f"cron {schedule.cron!r} in {schedule.timezone} has no occurrence after now{bound}; "
            "check the expression and end_at"
        )
