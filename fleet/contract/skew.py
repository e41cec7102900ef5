"""k0s's version skew rules: which version moves k0s supports. Pure.

k0s is stricter than upstream Kubernetes about version skew:

- nothing is downgraded;
- a control plane or a worker pool moves at most one minor at a time
  (v1.30 -> v1.31 -> v1.32, never v1.30 -> v1.32);
- control planes stay within one minor of each other (they move one at a time, so a
  one-minor move keeps this);
- workers are never newer than the oldest control plane of their cluster, and at most
  one minor older.

Every path that moves a version (a FleetUpgrade, the runtime extension, adoption of what
an object says) asks these functions first. A refusal names its rule and the versions, so
that a condition, an Event or an HTTP answer can say exactly why. A version more than one
minor ahead is reached as a *ladder* of rungs, one minor each (:func:`ladder`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleet.contract.versions import K0sVersion, parse_or_none

RULE_NOT_A_VERSION = "NotAVersion"
RULE_NO_DOWNGRADE = "NoDowngrade"
RULE_ONE_MINOR_AT_A_TIME = "OneMinorAtATime"
RULE_WORKERS_NOT_NEWER = "WorkersNotNewerThanControlPlanes"
RULE_WORKERS_AT_MOST_ONE_MINOR_OLDER = "WorkersAtMostOneMinorOlder"
RULE_MISSING_RUNG = "MissingRung"
RULE_NO_DIGEST = "NoDigestForRung"

RULES = (RULE_NOT_A_VERSION, RULE_NO_DOWNGRADE, RULE_ONE_MINOR_AT_A_TIME,
         RULE_WORKERS_NOT_NEWER, RULE_WORKERS_AT_MOST_ONE_MINOR_OLDER, RULE_MISSING_RUNG,
         RULE_NO_DIGEST)


@dataclass(frozen=True, slots=True)
class SkewRefusal:
    """Why a version move is not one k0s supports: the rule broken and a sentence naming
    the versions."""

    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}"


def _parse(value: str | K0sVersion) -> K0sVersion | None:
    return parse_or_none(value)


def minor_of(v: K0sVersion) -> tuple[int, int]:
    return (v.major, v.minor)


def minors_apart(older: K0sVersion, newer: K0sVersion) -> int:
    """How many minors ``newer`` is ahead of ``older`` (negative when behind). A change of
    major counts as many minors: k0s has never supported one in place."""
    if older.major != newer.major:
        return 1_000 * (newer.major - older.major)
    return newer.minor - older.minor


def _versions(values: Iterable[str | K0sVersion | None]) -> list[K0sVersion]:
    out = []
    for v in values:
        if v is None:
            continue
        p = _parse(v)
        if p is not None:
            out.append(p)
    return out


def check_move(current: str | K0sVersion | None, target: str | K0sVersion, *,
               what: str = "the object") -> SkewRefusal | None:
    """A move of one object (a control plane, a worker pool, a Machine) from ``current`` to
    ``target``: no downgrade, at most one minor up. ``current`` None (never seen) allows
    anything that is a version."""
    t = _parse(target)
    if t is None:
        return SkewRefusal(RULE_NOT_A_VERSION, f"{target!s} is not a k0s version")
    if current is None:
        return None
    c = _parse(current)
    if c is None:
        return None
    if t < c:
        return SkewRefusal(RULE_NO_DOWNGRADE,
                           f"{what} would go down from {c} to {t}; k0s is never downgraded")
    apart = minors_apart(c, t)
    if apart > 1:
        return SkewRefusal(RULE_ONE_MINOR_AT_A_TIME,
                           f"{what} would move from {c} to {t}, {apart} minors at once; k0s "
                           f"upgrades one minor at a time (v{c.major}.{c.minor + 1} first)")
    return None


def _each_moves(current: Iterable[str | K0sVersion | None], t: K0sVersion | None,
                target: str | K0sVersion, what: str) -> SkewRefusal | None:
    """:func:`check_move` from each version in ``current`` to ``t`` (the parsed target)."""
    if t is None:
        return SkewRefusal(RULE_NOT_A_VERSION, f"{target!s} is not a k0s version")
    for c in sorted(set(_versions(current))):
        refusal = check_move(c, t, what=what)
        if refusal is not None:
            return refusal
    return None


def check_control_plane_move(current: Iterable[str | K0sVersion | None],
                             workers: Iterable[str | K0sVersion | None],
                             target: str | K0sVersion, *,
                             what: str = "the control plane") -> SkewRefusal | None:
    """A move of a cluster's control plane to ``target``, given the versions its control
    plane nodes run (``current``) and its workers run: each control plane moves at most one
    minor and never down, and no worker may end up more than one minor older."""
    t = _parse(target)
    refusal = _each_moves(current, t, target, what)
    if refusal is not None or t is None:
        return refusal
    ws = _versions(workers)
    if ws:
        oldest = min(ws)
        if minors_apart(oldest, t) > 1:
            return SkewRefusal(
                RULE_WORKERS_AT_MOST_ONE_MINOR_OLDER,
                f"{what} would move to {t} while workers still run {oldest}; workers may be "
                f"at most one minor older than the control plane, so they go to "
                f"v{t.major}.{t.minor - 1} first")
    return None


def check_worker_move(current: Iterable[str | K0sVersion | None],
                      control_planes: Iterable[str | K0sVersion | None],
                      target: str | K0sVersion, *,
                      what: str = "the workers") -> SkewRefusal | None:
    """A move of worker nodes to ``target``, given the versions they run (``current``) and
    the versions the cluster's control plane nodes run: each worker moves at most one minor
    and never down, and never past the oldest control plane's minor. ``control_planes``
    empty (not known, or hosted elsewhere and not reported) refuses nothing here."""
    t = _parse(target)
    refusal = _each_moves(current, t, target, what)
    if refusal is not None or t is None:
        return refusal
    cps = _versions(control_planes)
    if cps:
        oldest = min(cps)
        if minors_apart(oldest, t) > 0:
            return SkewRefusal(
                RULE_WORKERS_NOT_NEWER,
                f"{what} would move to {t} while the oldest control plane runs {oldest}; "
                f"workers are never newer than the control plane's minor")
    return None


def ladder(current: str | K0sVersion, target: str | K0sVersion,
           releases: Iterable[str | K0sVersion]) -> list[K0sVersion] | SkewRefusal:
    """The rungs from ``current`` to ``target``: for each minor strictly between them, the
    newest release of that minor in ``releases``, then ``target`` itself. A target at most
    one minor ahead is one rung. A downgrade, or a minor on the way with no release, is a
    refusal (before anything is written)."""
    c, t = _parse(current), _parse(target)
    if t is None:
        return SkewRefusal(RULE_NOT_A_VERSION, f"{target!s} is not a k0s version")
    if c is None:
        return [t]
    if t < c:
        return SkewRefusal(RULE_NO_DOWNGRADE,
                           f"{t} is older than {c}; k0s is never downgraded")
    if t == c:
        return []
    if c.major != t.major:
        return SkewRefusal(RULE_ONE_MINOR_AT_A_TIME,
                           f"{c} to {t} changes the major version; k0s supports no such move")
    offered = [r for r in _versions(releases) if r.pre is None and r.major == c.major]
    rungs: list[K0sVersion] = []
    for minor in range(c.minor + 1, t.minor):
        of_minor = [r for r in offered if r.minor == minor]
        if not of_minor:
            return SkewRefusal(RULE_MISSING_RUNG,
                               f"no release of v{c.major}.{minor} is offered; {c} to {t} "
                               f"must pass through it")
        rungs.append(max(of_minor))
    rungs.append(t)
    return rungs


@dataclass(frozen=True, slots=True)
class ReleaseCatalog:
    """The releases a ladder may pass through (the fleet YAML's ``download.releases`` and
    the versions it pins digests for), and whether a rung needs a pinned digest (no digest
    manifest and unverified downloads refused: nothing else could verify its binary)."""

    offered: frozenset[K0sVersion] = frozenset()
    pinned: frozenset[K0sVersion] = frozenset()
    rungs_need_digest: bool = False

    @classmethod
    def of(cls, releases: Iterable[str], pinned: Iterable[str], *,
           rungs_need_digest: bool) -> ReleaseCatalog:
        p = frozenset(_versions(pinned))
        return cls(offered=frozenset(_versions(releases)) | p, pinned=p,
                   rungs_need_digest=rungs_need_digest)


EMPTY_CATALOG = ReleaseCatalog()


def climb(current: str | K0sVersion | None, target: str | K0sVersion,
          catalog: ReleaseCatalog = EMPTY_CATALOG) -> list[K0sVersion] | SkewRefusal:
    """:func:`ladder` over ``catalog``; a rung (the target included) that needs a pinned
    digest and has none is refused before anything is written, not at its dispatch."""
    if current is None:
        t = _parse(target)
        return [t] if t is not None else SkewRefusal(RULE_NOT_A_VERSION,
                                                     f"{target!s} is not a k0s version")
    rungs = ladder(current, target, catalog.offered)
    if isinstance(rungs, SkewRefusal) or not catalog.rungs_need_digest:
        return rungs
    for r in rungs:
        if r not in catalog.pinned:
            what = "the target" if r == rungs[-1] else f"rung {r} on the way to {rungs[-1]}"
            return SkewRefusal(RULE_NO_DIGEST,
                               f"{what} has no pinned digest (download.digests), no digest "
                               f"manifest is configured and unverified downloads are refused: "
                               f"no node could verify its binary")
    return rungs


__all__ = [
    "EMPTY_CATALOG",
    "RULES",
    "RULE_MISSING_RUNG",
    "RULE_NOT_A_VERSION",
    "RULE_NO_DIGEST",
    "RULE_NO_DOWNGRADE",
    "RULE_ONE_MINOR_AT_A_TIME",
    "RULE_WORKERS_AT_MOST_ONE_MINOR_OLDER",
    "RULE_WORKERS_NOT_NEWER",
    "ReleaseCatalog",
    "SkewRefusal",
    "check_control_plane_move",
    "check_move",
    "check_worker_move",
    "climb",
    "ladder",
    "minors_apart",
]
