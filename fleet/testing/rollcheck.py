"""Independent check of a fleet rollout from the node side's record (bench/scale.py).

Input: what kubesim's node-agent stand-in saw (:class:`NodeRun`: when each request for a
node first arrived, when that node wrote Completed) and how many distinct requests each
node was sent; nothing the controller says about itself. Output: every breach of the
rules a rollout must keep, and how long the clusters of a killed replica waited.

A node is *unavailable* from its request until its Completed (a request never completed
stays unavailable to the end). The rules:

* one request per node (one NodePlan, one signal);
* per cluster: at most ``max_unavailable`` workers and one control plane (etcd quorum
  of three) unavailable at once;
* per wave: at most ``max_concurrent`` clusters upgrading at once, a cluster counted
  from its first request to its last node's Completed (a subset of the slot the gate
  holds for it: admission -> complete);
* waves in order: no request in a wave before every node of the previous wave completed.

Intervals that touch (one ends at t, the next starts at t) do not overlap: a completion
comes before the request it lets through.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class NodeRun:
    cluster: str
    node: str
    plan: str
    seen: float
    completed: float | None = None

    @property
    def end(self) -> float:
        return math.inf if self.completed is None else self.completed


@dataclass(frozen=True, slots=True)
class Topology:
    """What the fleet looks like: each cluster's wave and nodes."""

    waves: Sequence[str]  # in rollout order
    wave_of: Mapping[str, str]  # cluster -> wave
    nodes: Mapping[str, Sequence[tuple[str, bool]]]  # cluster -> (node, control plane)
    max_unavailable: int = 1
    max_concurrent: Mapping[str, int] = field(default_factory=dict)  # wave -> clusters


@dataclass
class Verdict:
    double_dispatch: list[str] = field(default_factory=list)
    budget: list[str] = field(default_factory=list)
    quorum: list[str] = field(default_factory=list)
    concurrency: list[str] = field(default_factory=list)
    wave_order: list[str] = field(default_factory=list)
    not_completed: list[str] = field(default_factory=list)
    max_clusters_at_once: dict[str, int] = field(default_factory=dict)

    @property
    def violations(self) -> list[str]:
        return [*self.double_dispatch, *self.budget, *self.quorum, *self.concurrency,
                *self.wave_order]

    def summary(self) -> dict[str, object]:
        return {"double_dispatch": len(self.double_dispatch), "budget": len(self.budget),
                "quorum": len(self.quorum), "concurrency": len(self.concurrency),
                "wave_order": len(self.wave_order),
                "not_completed": len(self.not_completed),
                "max_clusters_at_once": dict(self.max_clusters_at_once),
                "examples": self.violations[:10] + self.not_completed[:5]}


def max_overlap(intervals: Iterable[tuple[float, float]]) -> tuple[int, float]:
    """Most intervals open at one instant, and the first instant it is reached."""
    spans = list(intervals)
    # At equal times an end (-1) sorts before a start: touching is not overlapping.
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    best, at, open_ = 0, math.nan, 0
    for t, delta in events:
        open_ += delta
        if open_ > best:
            best, at = open_, t
    return best, at


def check(runs: Sequence[NodeRun], signals: Mapping[tuple[str, str], int],
          topo: Topology) -> Verdict:
    """Every rule breach in ``runs`` (one per node and plan) and ``signals`` (distinct
    requests written to each (cluster, node))."""
    v = Verdict()
    by_node: dict[tuple[str, str], list[NodeRun]] = defaultdict(list)
    for r in runs:
        by_node[(r.cluster, r.node)].append(r)
    for (c, n), rs in sorted(by_node.items()):
        if len(rs) > 1:
            v.double_dispatch.append(f"{c}/{n}: {len(rs)} plans "
                                     f"{sorted(r.plan for r in rs)}")
    for (c, n), count in sorted(signals.items()):
        if count > 1 and len(by_node.get((c, n), ())) <= 1:
            v.double_dispatch.append(f"{c}/{n}: {count} distinct requests for one plan")
    per_cluster: dict[str, list[NodeRun]] = defaultdict(list)
    for r in runs:
        per_cluster[r.cluster].append(r)
    for c, nodes in sorted(topo.nodes.items()):
        cp = {n for n, is_cp in nodes if is_cp}
        rs = per_cluster.get(c, [])
        workers = [(r.seen, r.end) for r in rs if r.node not in cp]
        most, at = max_overlap(workers)
        if most > topo.max_unavailable:
            v.budget.append(f"{c}: {most} workers unavailable at {at:.3f} "
                            f"(maxUnavailable {topo.max_unavailable})")
        most, at = max_overlap([(r.seen, r.end) for r in rs if r.node in cp])
        if most > 1:
            v.quorum.append(f"{c}: {most} control planes unavailable at {at:.3f}")
        done = {r.node for r in rs if r.completed is not None}
        missing = sorted({n for n, _ in nodes} - done)
        if missing:
            v.not_completed.append(f"{c}: {len(missing)} node(s) not completed "
                                   f"({', '.join(missing[:3])})")
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    wave_first: dict[str, float] = {}
    wave_last: dict[str, float] = {}
    for c, rs in per_cluster.items():
        wave = topo.wave_of.get(c, "")
        start, end = min(r.seen for r in rs), max(r.end for r in rs)
        spans[wave].append((start, end))
        wave_first[wave] = min(wave_first.get(wave, math.inf), start)
        wave_last[wave] = max(wave_last.get(wave, -math.inf), end)
    for wave, sp in sorted(spans.items()):
        most, at = max_overlap(sp)
        v.max_clusters_at_once[wave] = most
        limit = topo.max_concurrent.get(wave)
        if limit is not None and most > limit:
            v.concurrency.append(f"wave {wave}: {most} clusters upgrading at {at:.3f} "
                                 f"(maxConcurrentClusters {limit})")
    ordered = [w for w in topo.waves if w in spans]
    for before, after in itertools.pairwise(ordered):
        if wave_first[after] < wave_last[before]:
            v.wave_order.append(
                f"wave {after} started at {wave_first[after]:.3f} before wave {before} "
                f"completed at {wave_last[before]:.3f}")
    return v


@dataclass(frozen=True, slots=True)
class Handoff:
    cluster: str
    waited_s: float  # the killed replica's death (or the last completion after it) -> next request
    next_request: float


def handoffs(runs: Sequence[NodeRun], clusters: Iterable[str], killed_at: float
             ) -> list[Handoff]:
    """For each of ``clusters`` (the killed replica's) that was mid-rollout when it died
    (a request before ``killed_at``, a node not yet asked): how long its next request
    waited, counted from the death or from the completion that came after it and before
    that request (no request may follow an unfinished node in a maxUnavailable-1 cluster)."""
    wanted = set(clusters)
    per: dict[str, list[NodeRun]] = defaultdict(list)
    for r in runs:
        if r.cluster in wanted:
            per[r.cluster].append(r)
    out: list[Handoff] = []
    for c, rs in sorted(per.items()):
        before = [r for r in rs if r.seen < killed_at]
        after = sorted((r for r in rs if r.seen >= killed_at), key=lambda r: r.seen)
        if not before or not after:
            continue
        nxt = after[0].seen
        ready = max([killed_at, *(r.completed for r in rs if r.completed is not None
                                  and r.completed <= nxt)])
        out.append(Handoff(c, round(nxt - ready, 3), nxt))
    return out
