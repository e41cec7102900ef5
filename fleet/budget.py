"""How many nodes of an object may be unavailable at once, resolved as Cluster API does."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_PERCENT = re.compile(r"^\s*(\d+)\s*%\s*$")
_INT = re.compile(r"^\s*(\d+)\s*$")


class InvalidMaxUnavailableError(ValueError):
    """maxUnavailable is neither a non-negative integer nor a percentage."""

    def __init__(self, value: object) -> None:
        super().__init__(
            f"maxUnavailable {value!r} is not a non-negative integer or percentage (e.g. 2, '25%')"
        )
        self.value = value


@dataclass(frozen=True, slots=True)
class UnavailabilityBudget:
    """``limit`` nodes may be unavailable; ``limit == 0`` means in-place is impossible."""

    limit: int
    source: str  # the value it was resolved from, for messages

    @classmethod
    def resolve(cls, max_unavailable: int | str | None, replicas: int) -> UnavailabilityBudget:
        """CAPI's rule: int, or percent of replicas rounded down; capped at replicas.

        A missing value is CAPI's default for RollingUpdate, 0. Zero replicas give 0.
        """
        replicas = max(0, int(replicas))
        raw = 0 if max_unavailable is None else max_unavailable
        if isinstance(raw, bool):
            raise InvalidMaxUnavailableError(raw)
        if isinstance(raw, int):
            if raw < 0:
                raise InvalidMaxUnavailableError(raw)
            value = raw
        elif isinstance(raw, str):
            if m := _PERCENT.match(raw):
                value = math.floor(int(m[1]) * replicas / 100)
            elif m := _INT.match(raw):
                value = int(m[1])
            else:
                raise InvalidMaxUnavailableError(raw)
        else:
            raise InvalidMaxUnavailableError(raw)
        return cls(limit=min(value, replicas), source=str(raw))

    @classmethod
    def one(cls) -> UnavailabilityBudget:
        """Control planes: one node at a time."""
        return cls(limit=1, source="1 (control plane)")

    @property
    def impossible(self) -> bool:
        return self.limit <= 0

    def room(self, unavailable: int) -> int:
        """How many more nodes may be taken down now."""
        return max(0, self.limit - unavailable)
