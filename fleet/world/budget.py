"""How many nodes of an object may be unavailable at once, resolved as Cluster API does."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

_PERCENT = re.compile(r"^\s*(\d+)\s*%\s*$")
_INT = re.compile(r"^\s*(\d+)\s*$")


class InvalidMaxUnavailableError(ValueError):
    """maxUnavailable is neither a non-negative integer nor a percentage."""

    def __init__(self, value: object, field: str = "maxUnavailable") -> None:
        super().__init__(
            f"{field} {value!r} is not a non-negative integer or percentage (e.g. 2, '25%')"
        )
        self.value = value


def _resolve(raw: object, replicas: int, rounding: Callable[[float], int],
             field: str = "maxUnavailable") -> int:
    if isinstance(raw, bool):
        raise InvalidMaxUnavailableError(raw, field)
    if isinstance(raw, int):
        if raw < 0:
            raise InvalidMaxUnavailableError(raw, field)
        return raw
    if isinstance(raw, str):
        if m := _PERCENT.match(raw):
            return int(rounding(int(m[1]) * replicas / 100))
        if m := _INT.match(raw):
            return int(m[1])
    raise InvalidMaxUnavailableError(raw, field)


@dataclass(frozen=True, slots=True)
class UnavailabilityBudget:
    """``limit`` nodes may be unavailable; ``limit == 0`` means in-place is impossible."""

    limit: int
    source: str  # the value it was resolved from, for messages

    @classmethod
    def resolve(cls, max_unavailable: int | str | None, replicas: int,
                max_surge: int | str | None = None) -> UnavailabilityBudget:
        """CAPI's rule: int, or percent of replicas rounded down; capped at replicas.

        A missing value is CAPI's default for RollingUpdate, 0 (and maxSurge's is 1).
        Zero replicas give 0. When maxSurge (percent rounded up) and maxUnavailable both
        resolve to 0, maxUnavailable is 1, as Cluster API (and Deployments) do: a rollout
        must be able to make progress.
        """
        replicas = max(0, int(replicas))
        raw = 0 if max_unavailable is None else max_unavailable
        value = _resolve(raw, replicas, math.floor)
        surge = 1 if max_surge is None else _resolve(max_surge, replicas, math.ceil, "maxSurge")
        if value == 0 and surge == 0 and replicas > 0:
            return cls(limit=1, source=f"{raw} (maxSurge {max_surge} also 0: 1, as Cluster "
                                       "API resolves it)")
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
