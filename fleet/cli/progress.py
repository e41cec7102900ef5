"""What the CLI shows of the work in flight: each cluster's current step, the ``-o wide``
columns, and ``upgrade``'s live progress view with its ETA. Pure: state in, lines out (the
commands do the reading and the drawing).

A cluster's *current step* is what its live NodePlans say: the node, the node's own state
(``Draining``, ``Downloading``, ...; ``Pending`` until the node answers) and how long it
has been in it. The ETA is an estimate from the node upgrades seen so far (each completed
NodePlan's start to completion): a cluster's remaining nodes one after another at their
mean, minus the time its node in flight has already spent; the clusters of a wave side by
side, the waves one after another. Soaks, windows and concurrency limits are not counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fleet.contract.nodeplan import NodePlanPhase
from fleet.world.model import ClusterKey, NodePlanInfo

_LIVE = (NodePlanPhase.PENDING, NodePlanPhase.IN_PROGRESS)


@dataclass(frozen=True, slots=True)
class Step:
    """One node of a cluster in flight."""

    node: str
    step: str  # the node's state (Downloading, ...), else the NodePlan's phase (Pending)
    since: datetime | None  # when it entered that step (None: not known)


def current_steps(nodeplans: Iterable[NodePlanInfo]) -> dict[ClusterKey, list[Step]]:
    """Per cluster, its nodes in flight (live NodePlans), the longest-running step first."""
    out: dict[ClusterKey, list[Step]] = {}
    for p in nodeplans:
        if p.deleting or p.phase not in _LIVE:
            continue
        since = p.phase_since or p.node_state_at or p.started_at or p.created
        out.setdefault((p.ref.namespace, p.cluster), []).append(
            Step(p.node or p.machine, p.node_state or str(p.phase), since))
    for steps in out.values():
        steps.sort(key=lambda s: (s.since is None, s.since or datetime.min, s.node))
    return out


def node_durations(nodeplans: Iterable[NodePlanInfo]) -> list[float]:
    """Seconds from start to completion of every completed NodePlan (the per-node times
    seen so far)."""
    out = []
    for p in nodeplans:
        if p.phase != NodePlanPhase.COMPLETED or p.started_at is None:
            continue
        end = p.completed_at or p.phase_since
        if end is not None and end > p.started_at:
            out.append((end - p.started_at).total_seconds())
    return out


def age(seconds: float) -> str:
    """``45s``, ``3m05s``, ``1h02m``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def in_step(step: Step, now: datetime) -> float | None:
    return None if step.since is None else max(0.0, (now - step.since).total_seconds())


def wide_columns(steps: Sequence[Step], executors: Iterable[str], now: datetime
                 ) -> dict[str, str]:
    """The ``-o wide`` columns of one cluster: its objects' executors, the current step,
    its node and the time in it (the longest-running node in flight; ``+N`` more)."""
    ex = ",".join(sorted({e for e in executors if e})) or "-"
    if not steps:
        return {"executor": ex, "step": "-", "node": "-", "inStep": "-"}
    first = steps[0]
    t = in_step(first, now)
    more = f" (+{len(steps) - 1})" if len(steps) > 1 else ""
    return {"executor": ex, "step": first.step, "node": first.node + more,
            "inStep": "-" if t is None else age(t)}


def cluster_eta(remaining: int, steps: Sequence[Step], mean: float | None,
                now: datetime) -> float | None:
    """Seconds until a cluster's ``remaining`` nodes are done at ``mean`` seconds each (its
    nodes one after another), less what its node in flight has already spent."""
    if remaining <= 0:
        return 0.0
    if mean is None:
        return None
    spent = max((t for s in steps if (t := in_step(s, now)) is not None), default=0.0)
    return max(0.0, remaining * mean - min(spent, mean))


# -- upgrade's live view -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterLine:
    namespace: str
    name: str
    wave: str
    phase: str
    done: int
    total: int
    steps: tuple[Step, ...] = ()
    rung: str | None = None
    message: str = ""


@dataclass(frozen=True, slots=True)
class WaveLine:
    name: str
    phase: str
    complete: int
    clusters: int


@dataclass(frozen=True, slots=True)
class ProgressState:
    """What the live view shows at ``now``."""

    now: datetime
    phase: str
    summary: str
    nodes_done: int
    nodes_total: int
    message: str = ""
    waves: tuple[WaveLine, ...] = ()
    clusters: tuple[ClusterLine, ...] = ()
    durations: tuple[float, ...] = field(default_factory=tuple)

    @property
    def mean(self) -> float | None:
        return sum(self.durations) / len(self.durations) if self.durations else None


def _nodes(value: Any) -> tuple[int, int]:
    try:
        done, total = str(value).split("/", 1)
        return int(done), int(total)
    except ValueError:
        return 0, 0


def progress_state(fleet_upgrade: Mapping[str, Any], nodeplans: Sequence[NodePlanInfo],
                   now: datetime) -> ProgressState:
    """The live view's state from a FleetUpgrade (its status) and the NodePlans of its
    clusters."""
    st = fleet_upgrade.get("status") or {}
    steps = current_steps(nodeplans)
    clusters = []
    for c in st.get("clusters") or []:
        done, total = _nodes(c.get("nodes"))
        key = (str(c.get("namespace") or ""), str(c.get("name") or ""))
        clusters.append(ClusterLine(key[0], key[1], str(c.get("wave") or ""),
                                    str(c.get("phase") or ""), done, total,
                                    tuple(steps.get(key, ())), c.get("rung"),
                                    str(c.get("message") or "")))
    waves = tuple(WaveLine(str(w.get("name") or ""), str(w.get("phase") or ""),
                           int(w.get("complete") or 0), int(w.get("clusters") or 0))
                  for w in st.get("waves") or [])
    return ProgressState(now=now, phase=str(st.get("phase") or "Pending"),
                         summary=str(st.get("summary") or "-"),
                         nodes_done=int(st.get("nodesUpToDate") or 0),
                         nodes_total=int(st.get("nodesTotal") or 0),
                         message=str(st.get("message") or ""), waves=waves,
                         clusters=tuple(clusters),
                         durations=tuple(node_durations(nodeplans)))


def fleet_eta(state: ProgressState) -> float | None:
    """Seconds until every cluster listed is done (waves one after another, a wave's
    clusters side by side); None without a node time seen yet."""
    mean = state.mean
    per_wave: dict[str, float] = {}
    for c in state.clusters:
        eta = cluster_eta(c.total - c.done, c.steps, mean, state.now)
        if eta is None:
            return None
        per_wave[c.wave] = max(per_wave.get(c.wave, 0.0), eta)
    return sum(per_wave.values())


def _eta_text(eta: float | None, state: ProgressState) -> str:
    if not state.clusters or state.nodes_done >= state.nodes_total:
        return ""
    if eta is None:
        return "  ETA: after the first node (no node time seen yet)"
    mean = state.mean or 0.0
    return (f"  ETA ~{age(eta)} ({len(state.durations)} node(s) seen, "
            f"{age(mean)} each)")


def render_progress(state: ProgressState, *, width: int = 100) -> list[str]:
    """The live view as lines (each at most ``width`` characters): the FleetUpgrade, then
    per wave its clusters with their current step, the time in it and an ETA."""
    lines = [f"{state.phase}: {state.summary} clusters, {state.nodes_done}/"
             f"{state.nodes_total} nodes" + _eta_text(fleet_eta(state), state)]
    if state.message:
        lines.append(f"  {state.message}")
    by_wave: dict[str, list[ClusterLine]] = {}
    for c in state.clusters:
        by_wave.setdefault(c.wave, []).append(c)
    waves = list(state.waves) or [WaveLine(w, "", 0, len(cs)) for w, cs in by_wave.items()]
    name_w = max((len(f"{c.namespace}/{c.name}") for c in state.clusters), default=0)
    for w in waves:
        lines.append(f"wave {w.name} {w.phase} {w.complete}/{w.clusters}".rstrip())
        for c in by_wave.get(w.name, []):
            line = f"  {f'{c.namespace}/{c.name}':<{name_w}}  {c.phase:<11} {c.done}/{c.total}"
            if c.rung:
                line += f" rung {c.rung}"
            # A cluster whose nodes are all up to date has nothing in flight, whatever a
            # NodePlan whose status write trails the node (or a read between the two) says.
            if c.steps and c.done < c.total and c.phase != "Complete":
                s = c.steps[0]
                t = in_step(s, state.now)
                line += f"  {s.node} {s.step}" + ("" if t is None else f" {age(t)}")
                if len(c.steps) > 1:
                    line += f" (+{len(c.steps) - 1} more)"
            eta = cluster_eta(c.total - c.done, c.steps, state.mean, state.now)
            if eta and c.phase not in ("Complete", "Refused", "Failed"):
                line += f"  ETA ~{age(eta)}"
            elif c.phase in ("Refused", "Failed") and c.message:
                line += f"  {c.message}"
            lines.append(line)
    return [line if len(line) <= width else line[: max(1, width - 1)] + "…"
            for line in lines]


__all__ = [
    "ClusterLine",
    "ProgressState",
    "Step",
    "WaveLine",
    "age",
    "cluster_eta",
    "current_steps",
    "fleet_eta",
    "node_durations",
    "progress_state",
    "render_progress",
    "wide_columns",
]
