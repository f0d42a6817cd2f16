"""When a schedule's occurrences fall (cron read by cronsim, wall-clock times in IANA zones, the
daylight-saving rules of Debian's cron), and what one top-up stores."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from tarry.errors import InvalidArgument
from tarry.model.schedule import (
    CatchUp,
    Occurrence,
    Schedule,
    check_has_future,
    occurrence_message_id,
    parse_schedule,
    plan_top_up,
)


def ms(text: str) -> int:
    """An instant written in RFC 3339 (with its offset), as epoch ms."""
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def schedule(cron: str, zone: str = "UTC", **more: Any) -> Schedule:
    return parse_schedule("job", {"cron": cron, "timezone": zone, "destination": "q", **more})


def local_times(s: Schedule, after: str, count: int) -> list[str]:
    return [s.local_time(at) for at in s.next_occurrences(ms(after), count)]


# --- daylight saving: the spring-forward gap ---------------------------------------------------
@pytest.mark.parametrize(
    ("zone", "day_before", "jump_day"),
    [
        ("Europe/Paris", "2027-03-27", "2027-03-28T03:00:00+02:00"),
        ("America/New_York", "2027-03-13", "2027-03-14T03:00:00-04:00"),
    ],
)
def test_a_daily_time_inside_the_spring_forward_gap_runs_once_right_after_the_jump(
    zone: str, day_before: str, jump_day: str
) -> None:
    # Given 02:30 every day, a time that does not exist on the night clocks jump 02:00 -> 03:00
    s = schedule("30 2 * * *", zone)
    # When the occurrences around that night are computed
    found = local_times(s, f"{day_before}T12:00:00+00:00", 3)
    # Then that night's runs once at 03:00 (Debian cron), and 02:30 again the day after
    assert found[0] == jump_day
    assert found[1].startswith(jump_day[:8] + str(int(jump_day[8:10]) + 1).zfill(2) + "T02:30:00")
    assert len(set(found)) == 3


@pytest.mark.parametrize("zone", ["Europe/Paris", "America/New_York"])
def test_an_every_30_minutes_rhythm_skips_the_hour_that_does_not_exist(zone: str) -> None:
    # Given a rhythm (the minute field starts with *), not a time of day
    s = schedule("*/30 * * * *", zone)
    day = "2027-03-28" if zone == "Europe/Paris" else "2027-03-14"
    start = s.zone.utcoffset(datetime(2027, 3, 1))
    assert start is not None
    # When the occurrences of the jump night are computed from 01:00 local
    found = [
        s.local_time(at)
        for at in s.next_occurrences(
            ms(f"{day}T01:00:00+00:00") - int(start.total_seconds()) * 1000, 3
        )
    ]
    # Then real time goes on every 30 minutes: 01:30, then 03:00 (02:00 and 02:30 do not exist)
    assert [f[11:16] for f in found] == ["01:30", "03:00", "03:30"]
    assert ms(found[1]) - ms(found[0]) == 30 * 60_000


# --- daylight saving: the fall-back repeat -----------------------------------------------------
@pytest.mark.parametrize(
    ("zone", "cron", "day", "first"),
    [
        ("Europe/Paris", "30 2 * * *", "2027-10-31", "2027-10-31T02:30:00+02:00"),
        ("America/New_York", "30 1 * * *", "2027-11-07", "2027-11-07T01:30:00-04:00"),
    ],
)
def test_a_daily_time_inside_the_fall_back_repeat_runs_once_the_first_time(
    zone: str, cron: str, day: str, first: str
) -> None:
    # Given a time of day that happens twice when clocks go back one hour
    s = schedule(cron, zone)
    # When the occurrences from the day before are computed
    found = local_times(s, f"{day}T00:00:00+14:00", 2)
    # Then it runs once, in the first pass (summer time), and next the following day
    assert found[0] == first
    assert ms(found[1]) - ms(found[0]) == 25 * 3_600_000  # the next day is 25 hours away


def test_an_every_30_minutes_rhythm_runs_in_both_passes_of_the_repeated_hour() -> None:
    # Given every 30 minutes in New York on the night clocks go back 02:00 -> 01:00
    s = schedule("*/30 * * * *", "America/New_York")
    # When the occurrences from 00:30 local are computed
    found = local_times(s, "2027-11-07T00:30:00-04:00", 5)
    # Then 01:00 and 01:30 come twice, each half an hour of real time apart
    assert found == [
        "2027-11-07T01:00:00-04:00",
        "2027-11-07T01:30:00-04:00",
        "2027-11-07T01:00:00-05:00",
        "2027-11-07T01:30:00-05:00",
        "2027-11-07T02:00:00-05:00",
    ]


def test_weekday_mornings_stay_at_nine_local_across_the_change() -> None:
    # Given every weekday at 09:00 in Paris, across the last Sunday of March
    s = schedule("0 9 * * 1-5", "Europe/Paris")
    found = local_times(s, "2027-03-25T12:00:00+00:00", 3)
    # Then it is 09:00 local before and after (08:00 UTC, then 07:00 UTC), no weekend run
    assert found == [
        "2027-03-26T09:00:00+01:00",
        "2027-03-29T09:00:00+02:00",
        "2027-03-30T09:00:00+02:00",
    ]


def test_six_fields_put_seconds_first_and_keep_the_repeat_rule() -> None:
    # Given every 20 seconds of 01:30 in New York
    s = schedule("*/20 30 1 * * *", "America/New_York")
    found = local_times(s, "2027-11-07T00:00:00-04:00", 4)
    # Then the three seconds of 01:30 in the first pass only, then the next day
    assert found == [
        "2027-11-07T01:30:00-04:00",
        "2027-11-07T01:30:20-04:00",
        "2027-11-07T01:30:40-04:00",
        "2027-11-08T01:30:00-05:00",
    ]


# --- the calendar ------------------------------------------------------------------------------
def test_a_leap_day_schedule_runs_only_on_the_29th_of_february() -> None:
    s = schedule("0 9 29 2 *", "Europe/Paris")
    found = local_times(s, "2027-01-01T00:00:00+00:00", 3)
    assert found == [
        "2028-02-29T09:00:00+01:00",
        "2032-02-29T09:00:00+01:00",
        "2036-02-29T09:00:00+01:00",
    ]
    # And the last one before 2030 is 2028's
    assert s.local_time(s.latest_at_or_before(ms("2030-01-01T00:00:00+00:00")) or 0) == found[0]


def test_nicknames_stand_for_their_five_fields() -> None:
    assert local_times(schedule("@daily", "UTC"), "2027-01-01T10:00:00+00:00", 1) == [
        "2027-01-02T00:00:00+00:00"
    ]
    assert local_times(schedule("@hourly"), "2027-01-01T10:10:00+00:00", 1) == [
        "2027-01-01T11:00:00+00:00"
    ]


def test_start_and_end_bound_the_occurrences() -> None:
    s = schedule("0 * * * *", start_at="2027-01-01T05:30:00Z", end_at="2027-01-01T08:00:00Z")
    found = local_times(s, "2027-01-01T00:00:00+00:00", 10)
    assert found == [
        "2027-01-01T06:00:00+00:00",
        "2027-01-01T07:00:00+00:00",
        "2027-01-01T08:00:00+00:00",
    ]
    with pytest.raises(InvalidArgument, match="no occurrence after now before end_at"):
        check_has_future(s, now_ms=ms("2027-01-02T00:00:00+00:00"))


# --- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"cron": "61 * * * *"}, "cron '61 * * * *' is not valid: Bad minute"),
        ({"cron": "* * *"}, "has 3 fields; write 5"),
        ({"cron": "0 0 30 2 *"}, "Bad day-of-month"),
        ({"cron": "every day"}, "has 2 fields"),
        ({"cron": "* * * * *", "timezone": "Europe/Pariss"}, "not a known IANA time zone"),
        ({"cron": "* * * * *", "timezone": "../../etc/passwd"}, "not a known IANA time zone"),
        ({"cron": "* * * * *", "catch_up": "all"}, "use 'skip'"),
        ({"cron": "* * * * *", "end_at": 1, "start_at": 2}, "end_at (1) is before start_at"),
        ({"cron": "* * * * *", "every": 2}, "unknown schedule field(s) every"),
        ({"cron": "* * * * *", "ttl_ms": -1}, "ttl_ms"),
        ({"cron": "* * * * *", "body": "a", "body_base64": "YQ=="}, "not both"),
        ({}, "cron is required"),
    ],
)
def test_a_bad_schedule_is_refused_with_what_to_fix(data: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_schedule("job", {"destination": "q", **data})
    assert says in caught.value.message


def test_a_schedule_without_destination_or_with_a_bad_name_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="destination"):
        parse_schedule("job", {"cron": "* * * * *"})
    with pytest.raises(InvalidArgument, match="schedule name"):
        parse_schedule("bad name", {"cron": "* * * * *", "destination": "q"})


# --- one top-up --------------------------------------------------------------------------------
NOW = ms("2027-06-01T12:00:00+00:00")


def test_a_top_up_stores_the_horizon_and_the_first_occurrence_past_it() -> None:
    s = schedule("*/10 * * * *")
    plan = plan_top_up(
        s,
        planned_through_ms=NOW,
        now_ms=NOW,
        horizon_ms=30 * 60_000,
        max_ahead=100,
        late_after_ms=60_000,
    )
    assert [o.at_ms - NOW for o in plan.occurrences] == [m * 60_000 for m in (10, 20, 30, 40)]
    assert plan.planned_through_ms == NOW + 40 * 60_000
    assert not plan.missed and not plan.finished


def test_a_sparse_schedule_stores_its_next_occurrence_however_far() -> None:
    s = schedule("0 9 29 2 *", "Europe/Paris")
    plan = plan_top_up(
        s,
        planned_through_ms=NOW,
        now_ms=NOW,
        horizon_ms=600_000,
        max_ahead=100,
        late_after_ms=60_000,
    )
    assert [s.local_time(o.at_ms) for o in plan.occurrences] == ["2028-02-29T09:00:00+01:00"]


def test_max_ahead_caps_a_top_up() -> None:
    plan = plan_top_up(
        schedule("* * * * * *"),
        planned_through_ms=NOW,
        now_ms=NOW,
        horizon_ms=3_600_000,
        max_ahead=7,
        late_after_ms=60_000,
    )
    assert [o.at_ms - NOW for o in plan.occurrences] == [i * 1000 for i in range(1, 8)]
    assert plan.planned_through_ms == NOW + 7000


@pytest.mark.parametrize("policy", ["skip", "once"])
def test_occurrences_never_stored_during_downtime_follow_the_catch_up_policy(policy: str) -> None:
    # Given a minutely schedule stored up to an hour ago (no node ran since)
    s = schedule("* * * * *", catch_up=policy)
    plan = plan_top_up(
        s,
        planned_through_ms=NOW - 3_600_000,
        now_ms=NOW + 5_000,
        horizon_ms=120_000,
        max_ahead=100,
        late_after_ms=60_000,
    )
    # Then the missed ones are dropped, or the latest of them is delivered now
    assert plan.missed
    regular = [o for o in plan.occurrences if o.at_ms > NOW - 60_000]
    assert [o.at_ms - NOW for o in regular] == [0, 60_000, 120_000, 180_000]
    missed = [o for o in plan.occurrences if o not in regular]
    if policy == "skip":
        assert missed == []
    else:
        assert missed == [Occurrence(NOW - 60_000, NOW + 5_000)]


def test_occurrences_a_little_late_are_not_missed() -> None:
    plan = plan_top_up(
        schedule("* * * * * *"),
        planned_through_ms=NOW - 10_000,
        now_ms=NOW,
        horizon_ms=2_000,
        max_ahead=100,
        late_after_ms=60_000,
    )
    assert not plan.missed
    assert plan.occurrences[0] == Occurrence(NOW - 9_000, NOW - 9_000)


def test_the_occurrence_message_is_an_ordinary_send_with_a_stable_message_id() -> None:
    s = schedule("0 9 * * *", body="hello", headers={"k": "v"}, ttl_ms=60_000)
    at = ms("2027-06-02T09:00:00+00:00")
    send = s.occurrence_send(Occurrence(at, at), now_ms=NOW)
    assert send["message_id"] == occurrence_message_id("job", at) == f"sched:job:{at}"
    assert send["deliver_at"] == at and send["body"] == "hello" and send["headers"] == {"k": "v"}
    # The TTL counts from the occurrence, whenever it is stored
    assert NOW + send["ttl_ms"] == at + 60_000
    assert s.catch_up is CatchUp.SKIP
    assert parse_schedule("job", s.to_dict() | {}).to_dict() == s.to_dict()
