"""UnavailabilityBudget: maxUnavailable resolved as Cluster API does."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.world.budget import InvalidMaxUnavailableError, UnavailabilityBudget


@pytest.mark.parametrize(
    ("value", "replicas", "limit"),
    [
        (2, 6, 2),
        ("2", 6, 2),
        (10, 6, 6),  # capped at replicas
        ("25%", 12, 3),
        ("25%", 10, 2),  # 2.5 rounds down
        ("30%", 3, 0),  # 0.9 rounds down to 0: impossible
        ("100%", 5, 5),
        ("150%", 4, 4),
        (None, 6, 0),  # CAPI default for RollingUpdate
        (3, 0, 0),  # zero replicas
        (0, 6, 0),
        (" 50 % ", 4, 2),
    ],
)
def test_resolve(value: int | str | None, replicas: int, limit: int) -> None:
    budget = UnavailabilityBudget.resolve(value, replicas)
    assert budget.limit == limit
    assert budget.impossible == (limit == 0)


@pytest.mark.parametrize("value", [-1, "-1", "abc", "1.5", "%", "25%%", True, 1.5, [1]])
def test_invalid(value: object) -> None:
    with pytest.raises(InvalidMaxUnavailableError) as e:
        UnavailabilityBudget.resolve(value, 6)  # type: ignore[arg-type]
    assert "maxUnavailable" in str(e.value)


@given(st.integers(0, 200), st.integers(0, 1000))
def test_percent_is_floor_and_capped(pct: int, replicas: int) -> None:
    budget = UnavailabilityBudget.resolve(f"{pct}%", replicas)
    assert budget.limit == min(replicas, math.floor(pct * replicas / 100))
    assert 0 <= budget.limit <= replicas


@given(st.integers(0, 50), st.integers(0, 50), st.integers(0, 60))
def test_room_never_negative_and_never_exceeds(limit: int, replicas: int,
                                               unavailable: int) -> None:
    budget = UnavailabilityBudget.resolve(limit, replicas)
    room = budget.room(unavailable)
    assert room >= 0
    assert room == 0 or unavailable + room <= budget.limit


def test_control_plane_budget_is_one() -> None:
    assert UnavailabilityBudget.one().limit == 1


@pytest.mark.parametrize(("unavailable", "surge", "replicas", "limit"), [
    (0, 0, 3, 1),  # both 0: Cluster API makes maxUnavailable 1
    ("0%", "0%", 3, 1),
    ("30%", "10%", 3, 0),  # surge rounds up to 1: no fencepost, in-place impossible
    (0, None, 3, 0),  # maxSurge missing = CAPI's default 1
    (0, 1, 3, 0),
    (2, 0, 3, 2),
    (0, 0, 0, 0),  # nothing to upgrade
])
def test_max_surge_and_max_unavailable_both_zero_mean_one(
        unavailable: int | str, surge: int | str | None, replicas: int, limit: int) -> None:
    assert UnavailabilityBudget.resolve(unavailable, replicas, surge).limit == limit


def test_invalid_max_surge_is_named() -> None:
    with pytest.raises(InvalidMaxUnavailableError, match="maxSurge"):
        UnavailabilityBudget.resolve(0, 3, "lots")
