"""Durations, cron parsing and maintenance windows (pure; `now` is always injected)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.config.schedule import (
    CronError,
    DurationError,
    Window,
    format_duration,
    next_window_start,
    parse_cron,
    parse_duration,
    window_open,
)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, *, s: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, s, tzinfo=UTC)


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("10m", timedelta(minutes=10)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1h30m15s", timedelta(hours=1, minutes=30, seconds=15)),
        ("1.5h", timedelta(minutes=90)),
        ("250ms", timedelta(milliseconds=250)),
        ("10us", timedelta(microseconds=10)),
        ("10µs", timedelta(microseconds=10)),
        ("1000ns", timedelta(microseconds=1)),
        ("0", timedelta(0)),
        ("0s", timedelta(0)),
        ("-1m", timedelta(minutes=-1)),
        (" 2h ", timedelta(hours=2)),
        ("600", timedelta(minutes=10)),
        ("0.5", timedelta(milliseconds=500)),
        (600, timedelta(minutes=10)),
        (1.5, timedelta(seconds=1.5)),
        (timedelta(days=2), timedelta(days=2)),
        ("48h", timedelta(days=2)),
    ],
)
def test_parse_duration(raw: str | int | float | timedelta, expected: timedelta) -> None:
    assert parse_duration(raw) == expected


@pytest.mark.parametrize(
    "bad", ["", "-", "h", "1x", "1h1", "1d", "1 h", "1ns", "--1s", "1.2.3s", True, None]
)
def test_parse_duration_rejects(bad: object) -> None:
    with pytest.raises(DurationError):
        parse_duration(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("td", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(hours=1, minutes=30), "1h30m"),
        (timedelta(hours=25), "25h"),
        (timedelta(seconds=45), "45s"),
        (timedelta(seconds=1.5), "1.5s"),
        (timedelta(microseconds=1), "0.000001s"),
        (timedelta(minutes=-90), "-1h30m"),
    ],
)
def test_format_duration(td: timedelta, text: str) -> None:
    assert format_duration(td) == text


@given(st.timedeltas(min_value=timedelta(days=-400), max_value=timedelta(days=400)))
def test_duration_round_trip(td: timedelta) -> None:
    assert parse_duration(format_duration(td)) == td


@given(st.integers(0, 1000), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999))
def test_go_style_composition(h: int, m: int, s: int, ms: int) -> None:
    text = f"{h}h{m}m{s}s{ms}ms"
    assert parse_duration(text) == timedelta(hours=h, minutes=m, seconds=s, milliseconds=ms)


# --------------------------------------------------------------------------------- cron


def test_parse_cron_fields() -> None:
    c = parse_cron("*/15 1-3,22 1,15 jan-mar,DEC mon-fri")
    assert c.minutes == (0, 15, 30, 45)
    assert c.hours == (1, 2, 3, 22)
    assert c.days == {1, 15}
    assert c.months == {1, 2, 3, 12}
    assert c.weekdays == {1, 2, 3, 4, 5}


def test_parse_cron_details() -> None:
    assert parse_cron("0 0 * * 7").weekdays == {0}  # 7 is Sunday too
    assert parse_cron("0 0 * * 5-7").weekdays == {5, 6, 0}
    assert parse_cron("5/20 * * * *").minutes == (5, 25, 45)
    daily = parse_cron("@daily")
    assert (daily.minutes, daily.hours, daily.days_restricted) == ((0,), (0,), False)
    assert parse_cron("@hourly").hours == tuple(range(24))
    assert parse_cron("@weekly").weekdays == {0}


@pytest.mark.parametrize(
    ("expr", "fragment"),
    [
        ("* * * *", "has 4 fields"),
        ("* * * * * *", "has 6 fields"),
        ("60 * * * *", "minute field: 60 is out of range 0-59"),
        ("* 24 * * *", "hour field: 24 is out of range 0-23"),
        ("* * 0 * *", "day-of-month field: 0 is out of range 1-31"),
        ("* * * 13 *", "month field: 13 is out of range 1-12"),
        ("* * * * 8", "day-of-week field: 8 is out of range 0-7"),
        ("* * * foo *", "month field: 'foo' is not a number"),
        ("5-1 * * * *", "range '5-1' is backwards"),
        ("*/0 * * * *", "bad step '0'"),
        ("1,,2 * * * *", "empty list item"),
        ("0 0 30 2 *", "never matches a real date"),
        ("0 0 31 4,6,9,11 *", "never matches a real date"),
        ("@reboot", "unsupported cron macro"),
    ],
)
def test_parse_cron_errors(expr: str, fragment: str) -> None:
    with pytest.raises(CronError) as e:
        parse_cron(expr)
    assert fragment in str(e.value)


def test_cron_day_fields_or_when_both_restricted() -> None:
    # Vixie cron: "the 13th, or any Friday" when both day fields are restricted ...
    c = parse_cron("0 0 13 * 5")
    assert c.matches(datetime(2024, 9, 13))  # Friday the 13th
    assert c.matches(datetime(2024, 9, 6))  # a Friday
    assert c.matches(datetime(2024, 8, 13))  # a Tuesday the 13th
    assert not c.matches(datetime(2024, 9, 12))
    # ... but "the 13th, if a Sunday or Friday" when one of them starts with '*'.
    c2 = parse_cron("0 0 13 * */5")
    assert c2.weekdays == {0, 5}
    assert c2.matches(datetime(2024, 9, 13))
    assert not c2.matches(datetime(2024, 9, 6))
    assert not c2.matches(datetime(2024, 8, 13))


def test_feb_29_fires() -> None:
    w = [Window("0 0 29 2 *", timedelta(hours=1))]
    assert next_window_start(w, utc(2025, 1, 1)) == utc(2028, 2, 29)


# ------------------------------------------------------------------- maintenance windows


def test_no_windows_means_always_open() -> None:
    now = utc(2024, 5, 5, 12, 34, s=56)
    assert window_open([], now)
    assert next_window_start([], now) == now


def test_naive_now_is_rejected() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        window_open([Window("@daily", timedelta(hours=1))], datetime(2024, 1, 1))


def test_window_utc_bounds() -> None:
    w = [Window("0 22 * * *", timedelta(hours=4))]
    assert not window_open(w, utc(2024, 6, 1, 21, 59, s=59))
    assert window_open(w, utc(2024, 6, 1, 22))
    assert window_open(w, utc(2024, 6, 2, 2) - timedelta(microseconds=1))
    assert not window_open(w, utc(2024, 6, 2, 2))  # end is exclusive
    assert next_window_start(w, utc(2024, 6, 2, 2)) == utc(2024, 6, 2, 22)
    assert next_window_start(w, utc(2024, 6, 1, 23)) == utc(2024, 6, 1, 23)


def test_now_in_another_zone_is_the_same_instant() -> None:
    w = [Window("0 22 * * *", timedelta(hours=1))]
    tokyo = datetime(2024, 6, 2, 7, 30, tzinfo=ZoneInfo("Asia/Tokyo"))  # 22:30 UTC
    assert window_open(w, tokyo)


def test_any_of_several_windows() -> None:
    ws = [
        Window("0 2 * * sat", timedelta(hours=2)),
        Window("0 14 * * wed", timedelta(minutes=30), "America/New_York"),
    ]
    assert window_open(ws, utc(2024, 6, 1, 3))  # Saturday 03:00 UTC
    assert window_open(ws, utc(2024, 6, 5, 18, 10))  # Wednesday 14:10 EDT
    assert not window_open(ws, utc(2024, 6, 5, 14, 10))
    assert next_window_start(ws, utc(2024, 6, 3)) == utc(2024, 6, 5, 18)


def test_time_zone_with_non_hour_offset() -> None:
    w = [Window("0 0 * * *", timedelta(minutes=15), "Asia/Kathmandu")]  # UTC+5:45
    assert window_open(w, utc(2024, 1, 1, 18, 20))
    assert next_window_start(w, utc(2024, 1, 1, 12)) == utc(2024, 1, 1, 18, 15)


def test_weekday_window_across_us_dst_start() -> None:
    w = [Window("0 9 * * 1-5", timedelta(hours=8), "America/New_York")]
    # Friday before the change: 09:00 EST = 14:00 UTC.
    assert window_open(w, utc(2024, 3, 8, 14))
    assert not window_open(w, utc(2024, 3, 8, 13, 30))
    # Weekend: closed; next opening is Monday 09:00 EDT = 13:00 UTC.
    assert not window_open(w, utc(2024, 3, 9, 15))
    assert next_window_start(w, utc(2024, 3, 9, 15)) == utc(2024, 3, 11, 13)
    assert window_open(w, utc(2024, 3, 11, 13))
    assert not window_open(w, utc(2024, 3, 11, 12, 59))


def test_start_in_the_spring_forward_gap_moves_forward_by_the_gap() -> None:
    # Berlin, 2024-03-31: 02:00 CET -> 03:00 CEST at 01:00 UTC; 02:30 does not exist.
    w = [Window("30 2 * * *", timedelta(hours=1), "Europe/Berlin")]
    assert next_window_start(w, utc(2024, 3, 30, 12)) == utc(2024, 3, 31, 1, 30)  # 03:30 CEST
    assert not window_open(w, utc(2024, 3, 31, 1, 15))
    assert window_open(w, utc(2024, 3, 31, 1, 45))
    # Asked at 03:10 CEST, i.e. after the wall time 02:30 but before its shifted start.
    assert next_window_start(w, utc(2024, 3, 31, 1, 10)) == utc(2024, 3, 31, 1, 30)
    # The next day is normal again: 02:30 CEST = 00:30 UTC.
    assert next_window_start(w, utc(2024, 3, 31, 3)) == utc(2024, 4, 1, 0, 30)


def test_repeated_start_in_the_fall_back_hour_opens_once() -> None:
    # Berlin, 2024-10-27: 03:00 CEST -> 02:00 CET at 01:00 UTC; 02:30 happens twice.
    w = [Window("30 2 * * *", timedelta(minutes=30), "Europe/Berlin")]
    assert window_open(w, utc(2024, 10, 27, 0, 45))  # first 02:30 (CEST)
    assert not window_open(w, utc(2024, 10, 27, 1, 45))  # second 02:30 (CET): no window
    assert next_window_start(w, utc(2024, 10, 27, 1)) == utc(2024, 10, 28, 1, 30)


def test_cronsim_breaks_two_window_rules_so_schedule_keeps_its_own_cron() -> None:
    """Why fleet.config.schedule evaluates cron itself instead of using cronsim (issue #10): cronsim
    breaks two of the window rules in fleet.config.schedule's docstring. Should cronsim come to
    agree, this fails: then switch to it."""
    berlin = ZoneInfo("Europe/Berlin")
    # Rule "a skipped start moves forward by the size of the gap": 02:30 on the 2024-03-31
    # spring-forward night must start at 03:30 CEST; cronsim fires at 03:00.
    ours = next_window_start([Window("30 2 * * *", timedelta(hours=1), "Europe/Berlin")],
                             utc(2024, 3, 30, 12))
    theirs = next(CronSim("30 2 * * *", datetime(2024, 3, 30, 13, 0, tzinfo=berlin)))
    assert ours == utc(2024, 3, 31, 1, 30)
    assert theirs.astimezone(UTC) == utc(2024, 3, 31, 1, 0)
    # Rule "a start that exists twice opens the window once, at its first occurrence":
    # with a wildcard hour cronsim fires 02:30 twice on the 2024-10-27 fall-back night.
    fires = CronSim("30 * * * *", datetime(2024, 10, 27, 1, 45, tzinfo=berlin))
    half_past_two = [t for t in (next(fires) for _ in range(4)) if t.hour == 2]
    assert len(half_past_two) == 2
    w = [Window("30 * * * *", timedelta(minutes=10), "Europe/Berlin")]
    assert window_open(w, utc(2024, 10, 27, 0, 35))  # first 02:30 (CEST)
    assert not window_open(w, utc(2024, 10, 27, 1, 35))  # second 02:30 (CET): not again


def test_duration_is_elapsed_time_across_fall_back() -> None:
    # 01:00 CEST (= 23:00 UTC) plus three real hours ends at 03:00 CET wall time.
    w = [Window("0 1 * * *", timedelta(hours=3), "Europe/Berlin")]
    assert window_open(w, utc(2024, 10, 26, 23))
    assert window_open(w, utc(2024, 10, 27, 1, 59))
    assert not window_open(w, utc(2024, 10, 27, 2))


def test_half_hour_dst_shift() -> None:
    # Lord Howe Island leaves DST on 2024-04-07: 02:00 (+11) -> 01:30 (+10:30).
    w = [Window("45 1 * * *", timedelta(minutes=10), "Australia/Lord_Howe")]
    assert window_open(w, utc(2024, 4, 6, 14, 50))  # 01:50 at +11
    assert not window_open(w, utc(2024, 4, 6, 15, 20))  # the repeated 01:50 at +10:30


def test_skipped_day() -> None:
    # Samoa skipped 2011-12-30 entirely (UTC-10 -> UTC+14). A start on that day moves
    # forward by the gap, onto the 31st.
    w = [Window("0 12 30 12 *", timedelta(hours=1), "Pacific/Apia")]
    start = next_window_start(w, utc(2011, 12, 20))
    assert start == utc(2011, 12, 30, 22)
    assert start is not None
    assert start.astimezone(ZoneInfo("Pacific/Apia")).day == 31
    # Asked on the 31st at 11:00 local, wall-clock "after" the 30th: still found.
    assert next_window_start(w, utc(2011, 12, 30, 21)) == utc(2011, 12, 30, 22)


# ------------------------------------------------------ properties against a brute force

ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "America/Santiago",
    "Asia/Kathmandu",
]
TRANSITIONS = [
    utc(2024, 3, 31, 1),
    utc(2024, 10, 27, 1),
    utc(2024, 3, 10, 7),
    utc(2024, 11, 3, 6),
    utc(2024, 4, 6, 15),
    utc(2024, 10, 5, 15, 30),
    utc(2024, 9, 8, 4),
    utc(2024, 6, 15, 12),
]
crons = st.builds(
    lambda m, h, dom, dow: f"{m} {h} {dom} * {dow}",
    st.sampled_from(["0", "30", "*/20", "15,45", "*"]),
    st.sampled_from(["*", "0", "1", "2", "1-3", "*/6", "22"]),
    st.sampled_from(["*", "1-10", "7"]),
    st.sampled_from(["*", "0", "1-5", "sat,sun"]),
)
windows = st.builds(
    Window,
    crons,
    st.integers(1, 240).map(lambda m: timedelta(minutes=m)),
    st.sampled_from(ZONES),
)
instants = st.builds(
    lambda base, secs: base + timedelta(seconds=secs),
    st.sampled_from(TRANSITIONS),
    st.integers(-2 * 86400, 2 * 86400),
)


def brute_force_open(w: Window, now: datetime) -> bool:
    """Same definition, no cleverness: every local minute around now."""
    tz = ZoneInfo(w.time_zone)
    cron = parse_cron(w.schedule)
    wall = now.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0)
    t = wall - w.duration - timedelta(hours=27)
    while t <= wall + timedelta(hours=27):
        if cron.matches(t):
            start = t.replace(tzinfo=tz).astimezone(UTC)
            if start <= now < start + w.duration:
                return True
        t += timedelta(minutes=1)
    return False


@settings(max_examples=60, deadline=None)
@given(windows, instants)
def test_window_open_matches_brute_force(w: Window, now: datetime) -> None:
    assert window_open([w], now) == brute_force_open(w, now)


@settings(max_examples=100, deadline=None)
@given(st.lists(windows, min_size=1, max_size=3), instants)
def test_next_window_start_is_the_first_open_instant(ws: list[Window], now: datetime) -> None:
    start = next_window_start(ws, now)
    assert start is not None  # every generated schedule fires often
    assert start >= now
    assert window_open(ws, start)
    if window_open(ws, now):
        assert start == now
    else:
        assert start > now
        assert start.second == 0 and start.microsecond == 0
        just_before = start - timedelta(microseconds=1)
        assert not window_open(ws, just_before)
        midway = now + (start - now) / 2
        assert not window_open(ws, midway)
