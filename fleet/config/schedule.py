"""Time arithmetic for the fleet: Go-style durations, cron expressions, maintenance windows.

Everything here is pure: no clock is read; callers pass ``now``.

Maintenance windows are evaluated in the window's own time zone:

- A window *starts* at every local wall-clock minute matched by its 5-field cron
  expression and stays open for ``duration`` of elapsed (not wall-clock) time.
- A start time that does not exist locally (skipped by a DST jump forward) is read with
  the offset in force before the jump, i.e. it moves forward by the size of the gap
  (02:30 on a 02:00->03:00 night starts at 03:30). The window still opens that day.
- A start time that exists twice (repeated by a DST jump back) opens the window once,
  at its first occurrence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

# ---------------------------------------------------------------------------------------
# Durations


class DurationError(ValueError):
    """A value that is not a duration."""


_NS_PER_UNIT = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign, as Go spells it
    "μs": 1_000,  # U+03BC greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_PLAIN_NUMBER = re.compile(r"[+-]?(\d+(?:\.\d*)?|\.\d+)")


def parse_duration(value: str | int | float | timedelta) -> timedelta:
    """A duration from a Go-style string (``"30s"``, ``"10m"``, ``"1h30m"``, ``"1.5h"``,
    ``"250ms"``) or a number of seconds (``600``, ``"600"``, ``0.5``).

    Precision is one microsecond (``timedelta``'s); anything finer is rejected rather
    than silently rounded.
    """
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise DurationError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        try:
            return _from_ns(Decimal(str(value)) * 1_000_000_000, value)
        except InvalidOperation:
            raise DurationError(f"not a duration: {value!r}") from None
    if not isinstance(value, str):
        raise DurationError(f"not a duration: {value!r}")
    text = value.strip()
    if _PLAIN_NUMBER.fullmatch(text):
        return _from_ns(Decimal(text) * 1_000_000_000, value)
    sign = 1
    if text and text[0] in "+-":
        sign = -1 if text[0] == "-" else 1
        text = text[1:]
    if text == "0":
        return timedelta(0)
    pos = 0
    total = Decimal(0)
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            raise DurationError(
                f"not a duration: {value!r} (expected e.g. 30s, 10m, 1h30m, or seconds)"
            )
        total += Decimal(m[1]) * _NS_PER_UNIT[m[2]]
        pos = m.end()
    if pos == 0:
        raise DurationError(f"not a duration: {value!r} (expected e.g. 30s, 10m, 1h30m)")
    return _from_ns(total * sign, value)


def _from_ns(ns: Decimal, original: object) -> timedelta:
    if not ns.is_finite():
        raise DurationError(f"not a duration: {original!r}")
    micros = ns / 1000
    if micros != micros.to_integral_value():
        raise DurationError(f"duration {original!r} is finer than one microsecond")
    try:
        return timedelta(microseconds=int(micros))
    except OverflowError:
        raise DurationError(f"duration {original!r} is too large") from None


def format_duration(td: timedelta) -> str:
    """The Go-style spelling of ``td`` that :func:`parse_duration` reads back exactly,
    e.g. ``1h30m``, ``45s``, ``1.5s``, ``0s``."""
    micros = (td.days * 86_400 + td.seconds) * 1_000_000 + td.microseconds
    if micros == 0:
        return "0s"
    sign = "-" if micros < 0 else ""
    micros = abs(micros)
    hours, rest = divmod(micros, 3600 * 1_000_000)
    minutes, rest = divmod(rest, 60 * 1_000_000)
    seconds, frac = divmod(rest, 1_000_000)
    out = sign
    if hours:
        out += f"{hours}h"
    if minutes:
        out += f"{minutes}m"
    if frac:
        out += f"{seconds}.{frac:06d}".rstrip("0") + "s"
    elif seconds:
        out += f"{seconds}s"
    return out


# ---------------------------------------------------------------------------------------
# Cron


class CronError(ValueError):
    """A cron expression that cannot be parsed or can never fire."""


_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTH_NAMES = {
    n: i + 1
    for i, n in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
    )
}
_DOW_NAMES = {n: i for i, n in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}


@dataclass(frozen=True, slots=True)
class _FieldSpec:
    name: str
    low: int
    high: int
    names: dict[str, int]


_FIELDS = (
    _FieldSpec("minute", 0, 59, {}),
    _FieldSpec("hour", 0, 23, {}),
    _FieldSpec("day-of-month", 1, 31, {}),
    _FieldSpec("month", 1, 12, _MONTH_NAMES),
    # 7 is accepted as another Sunday and folded to 0 after parsing.
    _FieldSpec("day-of-week", 0, 7, _DOW_NAMES),
)


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A parsed 5-field cron expression (minute hour day-of-month month day-of-week).

    Day matching follows Vixie cron: when both day fields are restricted (neither starts
    with ``*``) a day matches if *either* matches; otherwise both must match.
    """

    expression: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    days_restricted: bool
    weekdays_restricted: bool

    def matches_date(self, d: date) -> bool:
        if d.month not in self.months:
            return False
        dom = d.day in self.days
        dow = (d.isoweekday() % 7) in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return dom or dow
        return dom and dow

    def matches(self, wall: datetime) -> bool:
        """Whether the wall-clock minute of ``wall`` (its tzinfo is ignored) is matched."""
        return (
            wall.minute in self.minutes
            and wall.hour in self.hours
            and self.matches_date(wall.date())
        )

    def wall_times(self, start: datetime, until: date) -> Iterator[datetime]:
        """Matching naive wall-clock minutes >= ``start`` (naive), in order, up to the end
        of day ``until``."""
        d = start.date()
        while d <= until:
            if d.month not in self.months:
                # Jump to the first day of the next month.
                d = date(d.year + d.month // 12, d.month % 12 + 1, 1)
                continue
            if self.matches_date(d):
                for h in self.hours:
                    for m in self.minutes:
                        w = datetime.combine(d, time(h, m))
                        if w >= start:
                            yield w
            d += timedelta(days=1)

    def ever_fires(self) -> bool:
        """False for expressions such as ``0 0 30 2 *`` that match no real date.

        Weekdays of the Gregorian calendar repeat every 28 years within a century, so
        one such span decides it.
        """
        d = date(2024, 1, 1)
        end = date(2052, 12, 31)
        while d <= end:
            if self.matches_date(d):
                return True
            d += timedelta(days=1)
        return False


def _parse_value(text: str, spec: _FieldSpec, expr: str) -> int:
    low = text.lower()
    if low in spec.names:
        return spec.names[low]
    if not text.isdigit():
        raise CronError(f"{spec.name} field: {text!r} is not a number in {expr!r}")
    v = int(text)
    if not spec.low <= v <= spec.high:
        raise CronError(
            f"{spec.name} field: {v} is out of range {spec.low}-{spec.high} in {expr!r}"
        )
    return v


def _parse_field(text: str, spec: _FieldSpec, expr: str) -> set[int]:
    out: set[int] = set()
    for item in text.split(","):
        if not item:
            raise CronError(f"{spec.name} field: empty list item in {expr!r}")
        rng, slash, step_s = item.partition("/")
        has_step = bool(slash)
        step = 1
        if has_step:
            if not step_s.isdigit() or int(step_s) == 0:
                raise CronError(f"{spec.name} field: bad step {step_s!r} in {expr!r}")
            step = int(step_s)
        if rng == "*":
            lo, hi = spec.low, spec.high
        elif "-" in rng:
            a, _sep, b = rng.partition("-")
            lo, hi = _parse_value(a, spec, expr), _parse_value(b, spec, expr)
            if lo > hi:
                raise CronError(f"{spec.name} field: range {rng!r} is backwards in {expr!r}")
        else:
            lo = _parse_value(rng, spec, expr)
            # "5/15" means "from 5 to the end, every 15" (as in most cron implementations).
            hi = spec.high if has_step else lo
        out.update(range(lo, hi + 1, step))
    return out


@lru_cache(maxsize=512)
def parse_cron(expression: str) -> CronSchedule:
    """Parse a 5-field cron expression, or one of ``@yearly @monthly @weekly @daily
    @hourly``. Fields accept ``*``, numbers, ``a-b`` ranges, ``/step``, comma lists and
    English month / weekday abbreviations; day-of-week 7 is Sunday.
    """
    if not isinstance(expression, str):
        raise CronError(f"not a cron expression: {expression!r}")
    expr = expression.strip()
    if expr.startswith("@") and expr.lower() not in _MACROS:
        raise CronError(
            f"unsupported cron macro {expression!r}; use one of {', '.join(sorted(_MACROS))}"
        )
    fields = _MACROS.get(expr.lower(), expr).split()
    if len(fields) != 5:
        raise CronError(
            f"cron expression {expression!r} has {len(fields)} fields; expected 5 "
            "(minute hour day-of-month month day-of-week)"
        )
    parsed = [_parse_field(f, spec, expression) for f, spec in zip(fields, _FIELDS, strict=True)]
    weekdays = {0 if d == 7 else d for d in parsed[4]}
    sched = CronSchedule(
        expression=expr,
        minutes=tuple(sorted(parsed[0])),
        hours=tuple(sorted(parsed[1])),
        days=frozenset(parsed[2]),
        months=frozenset(parsed[3]),
        weekdays=frozenset(weekdays),
        days_restricted=not fields[2].startswith("*"),
        weekdays_restricted=not fields[4].startswith("*"),
    )
    if not sched.ever_fires():
        raise CronError(f"cron expression {expression!r} never matches a real date")
    return sched


# ---------------------------------------------------------------------------------------
# Maintenance windows


class WindowSpec(Protocol):
    """What a maintenance window needs; the config model's window satisfies it."""

    @property
    def schedule(self) -> str: ...

    @property
    def duration(self) -> timedelta: ...

    @property
    def time_zone(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Window:
    """A plain window, for callers that do not come from the fleet YAML."""

    schedule: str
    duration: timedelta
    time_zone: str = "UTC"


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; raises ``ValueError`` for unknown or malformed names."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValueError(f"unknown time zone {name!r} (expected an IANA name)") from None


# Local wall time -> instant is monotone except around offset changes, which move an
# instant by less than this (the largest in tzdata is Samoa's 24 h skip in 2011).
_MAX_OFFSET_JUMP = timedelta(hours=26)
# How far ahead to look for a start: long enough for "Feb 29 that is a Sunday".
_HORIZON_DAYS = 366 * 29


def _aware(now: datetime) -> datetime:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be timezone-aware")
    return now.astimezone(UTC)


def _next_start(window: WindowSpec, after: datetime, *, strict: bool) -> datetime | None:
    """The first start of ``window`` at or after (``strict``: after) ``after`` (UTC)."""
    tz = zone(window.time_zone)
    cron = parse_cron(window.schedule)
    local = after.astimezone(tz).replace(tzinfo=None)
    scan_from = (local - _MAX_OFFSET_JUMP).replace(second=0, microsecond=0)
    until = local.date() + timedelta(days=_HORIZON_DAYS)
    best: datetime | None = None
    best_wall: datetime | None = None
    for wall in cron.wall_times(scan_from, until):
        if best_wall is not None and wall > best_wall + _MAX_OFFSET_JUMP:
            break
        # fold=0: a skipped time moves forward by the gap; a repeated one is its first.
        instant = wall.replace(tzinfo=tz).astimezone(UTC)
        if (instant > after or (not strict and instant == after)) and (
            best is None or instant < best
        ):
            best, best_wall = instant, wall
    return best


def window_open(windows: Iterable[WindowSpec], now: datetime) -> bool:
    """Whether ``now`` (timezone-aware) lies inside one of ``windows``.

    No windows at all means no restriction: always open.
    """
    now_utc = _aware(now)
    ws = list(windows)
    if not ws:
        return True
    for w in ws:
        # Open iff some start lies in (now - duration, now].
        start = _next_start(w, now_utc - w.duration, strict=True)
        if start is not None and start <= now_utc:
            return True
    return False


def next_window_start(windows: Iterable[WindowSpec], now: datetime) -> datetime | None:
    """The earliest instant at or after ``now`` at which a window is open, in UTC.

    That is ``now`` itself when a window is open already (or when there are no windows),
    otherwise the start of the next window; ``None`` if no window ever starts again.
    """
    now_utc = _aware(now)
    ws = list(windows)
    if window_open(ws, now_utc):
        return now_utc
    starts = [s for w in ws if (s := _next_start(w, now_utc, strict=False)) is not None]
    return min(starts, default=None)
