"""Value types of the fleet configuration: durations, failure budgets, Kubernetes names
and label keys, URL templates, digests, versions; and :class:`ConfigModel`, the strict
camelCase base of every configuration model."""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Union
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainSerializer,
    PlainValidator,
)

from fleet.config.schedule import DurationError, format_duration, parse_duration
from fleet.contract.signal import ALLOWED_URL_SCHEMES
from fleet.contract.versions import InvalidVersionError, K0sVersion


def _duration_in(value: Any) -> timedelta:
    try:
        return parse_duration(value)
    except DurationError as e:
        raise ValueError(str(e)) from None


def _positive(td: timedelta) -> timedelta:
    if td <= timedelta(0):
        raise ValueError(f"must be > 0s (got {format_duration(td)})")
    return td


def _non_negative(td: timedelta) -> timedelta:
    if td < timedelta(0):
        raise ValueError(f"must be >= 0s (got {format_duration(td)})")
    return td


_DurationSerializer = PlainSerializer(format_duration, return_type=str, when_used="json")
PositiveDuration = Annotated[
    timedelta, BeforeValidator(_duration_in), AfterValidator(_positive), _DurationSerializer
]
"""A duration > 0: Go-style string ("30s", "10m", "1h30m") or a number of seconds."""
NonNegativeDuration = Annotated[
    timedelta, BeforeValidator(_duration_in), AfterValidator(_non_negative), _DurationSerializer
]


@dataclass(frozen=True, slots=True)
class FailureBudget:
    """How many failures are tolerated: an absolute count or a percentage of a total."""

    value: int
    percent: bool = False

    @classmethod
    def parse(cls, raw: object) -> FailureBudget:
        if isinstance(raw, FailureBudget):
            return raw
        if isinstance(raw, bool):
            raise ValueError(f"must be a count or a percentage such as '10%' (got {raw!r})")
        if isinstance(raw, int):
            budget = cls(raw)
        elif isinstance(raw, str) and re.fullmatch(r"\s*\d+\s*%\s*", raw):
            budget = cls(int(raw.strip().rstrip("%")), percent=True)
        elif isinstance(raw, str) and re.fullmatch(r"\s*-?\d+\s*", raw):
            budget = cls(int(raw))
        else:
            raise ValueError(f"must be a count or a percentage such as '10%' (got {raw!r})")
        if budget.value < 0:
            raise ValueError(f"must be >= 0 (got {budget})")
        if budget.percent and budget.value > 100:
            raise ValueError(f"must be <= 100% (got {budget})")
        return budget

    def tolerated(self, total: int) -> int:
        """Failures tolerated out of ``total``; percentages round down (never more lenient
        than asked)."""
        if not self.percent:
            return self.value
        return total * self.value // 100

    def __str__(self) -> str:
        return f"{self.value}%" if self.percent else str(self.value)


def _budget_out(b: FailureBudget) -> int | str:
    return str(b) if b.percent else b.value


Budget = Annotated[
    FailureBudget,
    PlainValidator(FailureBudget.parse, json_schema_input_type=Union[int, str]),  # noqa: UP007
    PlainSerializer(_budget_out),
]

Port = Annotated[int, Field(ge=1, le=65535)]


def check_url(v: str, *, placeholders: frozenset[str], required: frozenset[str]) -> str:
    try:
        names = {f for _, f, _, _ in string.Formatter().parse(v) if f is not None}
    except ValueError as e:
        raise ValueError(f"bad template {v!r}: {e}") from None
    unknown = names - placeholders
    if unknown:
        raise ValueError(
            f"unknown placeholder(s) {', '.join('{' + n + '}' for n in sorted(unknown))}; "
            f"allowed: {', '.join('{' + n + '}' for n in sorted(placeholders))}"
        )
    missing = required - names
    if missing:
        raise ValueError(
            f"must contain {' and '.join('{' + n + '}' for n in sorted(missing))} (got {v!r})"
        )
    sample = v.format(**{n: "x" for n in names})
    parts = urlsplit(sample)
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_URL_SCHEMES:
        raise ValueError(
            f"URL scheme {scheme or '(none)'!r} not allowed; use one of "
            f"{', '.join(sorted(ALLOWED_URL_SCHEMES))}"
        )
    if scheme != "file" and not parts.netloc:
        raise ValueError(f"URL {v!r} has no host")
    return v


Arch = Annotated[str, Field(pattern=r"^[a-z0-9_]+$")]


def _sha256(v: object) -> str:
    if not isinstance(v, str):
        raise ValueError(f"must be a sha256 hex string (got {v!r})")
    d = v.strip().lower().removeprefix("sha256:")
    if not re.fullmatch(r"[0-9a-f]{64}", d):
        raise ValueError(f"must be 64 hex characters (got {v!r})")
    return d


def _version_key(v: str) -> str:
    try:
        return str(K0sVersion.parse(v))
    except InvalidVersionError as e:
        raise ValueError(str(e)) from None


Sha256 = Annotated[str, PlainValidator(_sha256, json_schema_input_type=str)]
VersionKey = Annotated[str, AfterValidator(_version_key)]
