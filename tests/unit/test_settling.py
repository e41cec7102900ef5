"""Start-up settling (fleet.controllers.settling), without a server: the first pass waits
for every cluster's first answer up to its bound, a cluster taken later is planned once
it answered (or its bound passed), and the start-up's two marks are told once each."""

from __future__ import annotations

from typing import Any

from fleet.controllers.settling import Settling
from fleet.world.model import ClusterKey

A, B = ("ns", "a"), ("ns", "b")


class Registry:
    """The part of fleet.world.clusters.ClusterRegistry settling asks."""

    def __init__(self) -> None:
        self.answered: set[ClusterKey] = set()

    def settled(self, key: ClusterKey) -> bool:
        return key in self.answered

    def waiting_for(self, key: ClusterKey) -> str:
        return "its Nodes"


class Parts:
    def __init__(self) -> None:
        self.touched_all = 0

    def touch_all(self) -> None:
        self.touched_all += 1


def _settling(bound: float) -> tuple[Settling, Registry, Parts, list[str]]:
    registry, parts, marks = Registry(), Parts(), []
    s = Settling(registry, parts, bound=bound, after_start_up=marks.append)  # type: ignore[arg-type]
    return s, registry, parts, marks


def test_the_first_pass_waits_for_every_first_answer_then_plans_all() -> None:
    s, registry, parts, marks = _settling(bound=3600)
    s.asked_for({A, B})
    registry.answered.add(A)
    assert not s.first_pass() and not s.settled and marks == []
    registry.answered.add(B)
    assert s.first_pass() and s.settled
    assert marks == ["first pass"] and parts.touched_all == 1
    assert s.answered({A, B}) == {A, B}


def test_past_its_bound_the_first_pass_plans_without_the_answer() -> None:
    s, _, _, marks = _settling(bound=0)
    s.asked_for({A})
    assert s.first_pass() and marks == ["first pass"]
    assert s.answered({A}) == {A}  # waited for (given up on) before the first pass


def test_a_cluster_taken_later_is_planned_once_it_answered() -> None:
    s, registry, _, _ = _settling(bound=3600)
    s.asked_for({A})
    registry.answered.add(A)
    assert s.first_pass()
    s.planned = s.answered({A})
    s.asked_for({A, B})  # B became this replica's (a shard taken over)
    assert s.answered({A, B}) == {A}
    registry.answered.add(B)
    assert s.answered({A, B}) == {A, B}


def test_first_quiet_is_told_once_and_only_after_the_first_pass() -> None:
    s, registry, _, marks = _settling(bound=3600)
    idle: list[Any] = []

    def quiet() -> bool:
        idle.append(1)
        return True

    s.asked_for({A})
    s.after_pass(quiet)
    assert marks == [] and idle == []  # no first pass yet: not even asked
    registry.answered.add(A)
    assert s.first_pass()
    s.after_pass(quiet)
    s.after_pass(quiet)
    assert marks == ["first pass", "first quiet"] and len(idle) == 1


def test_a_cluster_past_its_bound_stays_planned_and_one_back_is_waited_for_afresh(
        monkeypatch: Any) -> None:
    from fleet.controllers import settling  # noqa: PLC0415

    clock = [0.0]
    monkeypatch.setattr(settling.time, "monotonic", lambda: clock[0])
    s, _, _, _ = _settling(bound=10)
    s.asked_for({A, B})
    clock[0] = 5.0
    assert s.answered({A, B}) == set()
    clock[0] = 11.0
    assert s.answered({A, B}) == {A, B}  # neither answered: planned past the bound
    assert s.answered({A, B}) == {A, B}  # and from then on
    s.asked_for({A})  # B is another replica's now ...
    clock[0] = 12.0
    s.asked_for({A, B})  # ... and this one's again: its bound runs from now
    assert s.answered({A, B}) == {A}
    clock[0] = 22.5
    assert s.answered({A, B}) == {A, B}
