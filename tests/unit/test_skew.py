"""k0s's version skew rules and the ladder (fleet/contract/skew.py), with property tests over random
fleets, versions and release lists: no reachable state breaks a rule, every refusal names
its rule."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.contract.skew import (
    RULE_MISSING_RUNG,
    RULE_NO_DIGEST,
    RULE_NO_DOWNGRADE,
    RULE_NOT_A_VERSION,
    RULE_ONE_MINOR_AT_A_TIME,
    RULE_WORKERS_AT_MOST_ONE_MINOR_OLDER,
    RULE_WORKERS_NOT_NEWER,
    RULES,
    ReleaseCatalog,
    SkewRefusal,
    check_control_plane_move,
    check_move,
    check_worker_move,
    climb,
    ladder,
    minors_apart,
)
from fleet.contract.versions import K0sVersion

versions = st.builds(lambda minor, patch, k0s: K0sVersion(1, minor, patch, k0s),
                     st.integers(28, 36), st.integers(0, 6), st.integers(0, 2))


def test_a_one_minor_upgrade_is_allowed() -> None:
    assert check_move("v1.31.3+k0s.0", "v1.32.1+k0s.0") is None
    assert check_move("v1.31.3+k0s.0", "v1.31.4+k0s.0") is None
    assert check_move(None, "v1.36.0+k0s.0") is None


def test_a_downgrade_is_refused_naming_both_versions() -> None:
    r = check_move("v1.32.1+k0s.0", "v1.31.3+k0s.0", what="K0sControlPlane cp")
    assert r is not None and r.rule == RULE_NO_DOWNGRADE
    assert "v1.32.1+k0s.0" in r.message and "v1.31.3+k0s.0" in r.message
    assert "K0sControlPlane cp" in r.message


def test_two_minors_at_once_is_refused_and_names_the_next_minor() -> None:
    r = check_move("v1.34.2+k0s.0", "v1.36.0+k0s.0")
    assert r is not None and r.rule == RULE_ONE_MINOR_AT_A_TIME
    assert "v1.35" in r.message


def test_a_major_change_is_refused() -> None:
    r = check_move("v1.34.2+k0s.0", "v2.0.0+k0s.0")
    assert r is not None and r.rule == RULE_ONE_MINOR_AT_A_TIME


def test_not_a_version_is_refused() -> None:
    r = check_move("v1.31.3+k0s.0", "latest")
    assert r is not None and r.rule == RULE_NOT_A_VERSION


def test_control_planes_wait_for_workers_two_minors_behind() -> None:
    r = check_control_plane_move(["v1.31.3+k0s.0"], ["v1.30.9+k0s.0"], "v1.32.1+k0s.0")
    assert r is not None and r.rule == RULE_WORKERS_AT_MOST_ONE_MINOR_OLDER
    assert check_control_plane_move(["v1.31.3+k0s.0"], ["v1.31.0+k0s.0"],
                                    "v1.32.1+k0s.0") is None


def test_workers_never_pass_the_oldest_control_plane() -> None:
    r = check_worker_move(["v1.31.3+k0s.0"], ["v1.32.1+k0s.0", "v1.31.3+k0s.0"],
                          "v1.32.1+k0s.0")
    assert r is not None and r.rule == RULE_WORKERS_NOT_NEWER
    assert check_worker_move(["v1.31.3+k0s.0"], ["v1.32.1+k0s.0"], "v1.32.1+k0s.0") is None
    # a hosted control plane not reported: nothing to compare with
    assert check_worker_move(["v1.31.3+k0s.0"], [], "v1.32.1+k0s.0") is None


def test_the_ladder_takes_the_newest_patch_of_each_minor_between() -> None:
    rungs = ladder("v1.30.2+k0s.0", "v1.33.0+k0s.0",
                   ["v1.31.1+k0s.0", "v1.31.5+k0s.1", "v1.32.0+k0s.0", "v1.32.3-rc.1+k0s.0",
                    "v1.32.2+k0s.0", "v1.34.0+k0s.0"])
    assert [str(r) for r in rungs] == ["v1.31.5+k0s.1", "v1.32.2+k0s.0", "v1.33.0+k0s.0"]


def test_a_ladder_with_a_missing_minor_is_refused_before_anything_moves() -> None:
    r = ladder("v1.30.2+k0s.0", "v1.33.0+k0s.0", ["v1.31.1+k0s.0"])
    assert isinstance(r, SkewRefusal) and r.rule == RULE_MISSING_RUNG and "v1.32" in r.message


def test_a_rung_without_a_digest_is_refused_when_nothing_else_verifies_it() -> None:
    strict = ReleaseCatalog.of(["v1.31.1+k0s.0"], [], rungs_need_digest=True)
    r = climb("v1.30.2+k0s.0", "v1.32.0+k0s.0", strict)
    assert isinstance(r, SkewRefusal) and r.rule == RULE_NO_DIGEST
    target_unpinned = ReleaseCatalog.of([], ["v1.31.1+k0s.0"], rungs_need_digest=True)
    r = climb("v1.30.2+k0s.0", "v1.32.0+k0s.0", target_unpinned)
    assert isinstance(r, SkewRefusal) and r.rule == RULE_NO_DIGEST and "the target" in r.message
    pinned = ReleaseCatalog.of([], ["v1.31.1+k0s.0", "v1.32.0+k0s.0"], rungs_need_digest=True)
    assert [str(v) for v in climb("v1.30.2+k0s.0", "v1.32.0+k0s.0", pinned)] == [  # type: ignore[union-attr]
        "v1.31.1+k0s.0", "v1.32.0+k0s.0"]
    # a digest manifest (or unverified downloads allowed) verifies any rung
    loose = ReleaseCatalog.of(["v1.31.1+k0s.0"], [], rungs_need_digest=False)
    assert not isinstance(climb("v1.30.2+k0s.0", "v1.32.0+k0s.0", loose), SkewRefusal)


@settings(max_examples=300, deadline=None)
@given(current=versions, target=versions, releases=st.lists(versions, max_size=12))
def test_every_ladder_moves_one_minor_at_a_time_and_never_down(
        current: K0sVersion, target: K0sVersion, releases: list[K0sVersion]) -> None:
    rungs = ladder(current, target, releases)
    if isinstance(rungs, SkewRefusal):
        assert rungs.rule in RULES and rungs.message
        if rungs.rule == RULE_NO_DOWNGRADE:
            assert target < current
        else:
            assert rungs.rule == RULE_MISSING_RUNG
            missing = [m for m in range(current.minor + 1, target.minor)
                       if not any(r.minor == m for r in releases)]
            assert missing
        return
    assert target >= current
    walk = [current, *rungs]
    for a, b in itertools.pairwise(walk):
        assert check_move(a, b) is None, (a, b)
        assert b > a
    assert not rungs or rungs[-1] == target


@settings(max_examples=300, deadline=None)
@given(cps=st.lists(versions, min_size=1, max_size=3),
       workers=st.lists(versions, min_size=1, max_size=4), target=versions,
       moving_workers=st.booleans())
def test_an_allowed_move_keeps_every_skew_rule(cps: list[K0sVersion], workers: list[K0sVersion],
                                               target: K0sVersion,
                                               moving_workers: bool) -> None:
    """Whatever the cluster runs, a move the rules allow leaves no rule broken that was not
    broken before, and a refusal names a rule."""
    if moving_workers:
        r = check_worker_move(workers, cps, target)
        after_cps, after_workers = cps, [target]
    else:
        r = check_control_plane_move(cps, workers, target)
        after_cps, after_workers = [target], workers
    if r is not None:
        assert r.rule in RULES and r.message
        return
    before = set(cps) | set(workers)
    assert all(target >= v for v in (workers if moving_workers else cps))
    assert all(minors_apart(v, target) <= 1 for v in before if v in
               (workers if moving_workers else cps))
    if moving_workers:
        assert minors_apart(min(after_cps), max(after_workers)) <= 0
    else:
        assert minors_apart(min(after_workers), max(after_cps)) <= 1
