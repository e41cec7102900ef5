"""What one planning pass knows: the snapshot, its indexes, the actions so far, and the
view of every NodePlan after upkeep (shared by :mod:`fleet.planner.upkeep` and
:mod:`fleet.planner.sequencing`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from fleet.contract.nodeplan import nodeplan_name as _nodeplan_name
from fleet.contract.signal import SignalState
from fleet.contract.versions import valid_version
from fleet.planner import conditions as C
from fleet.planner.actions import (
    Action,
    Decision,
)
from fleet.planner.policy import Hold
from fleet.planner.settings import PlannerSettings
from fleet.world.budget import InvalidMaxUnavailableError, UnavailabilityBudget
from fleet.world.eligibility import same_version
from fleet.world.executors import EXECUTORS
from fleet.world.model import (
    KIND_KCP,
    KIND_MD,
    ROLE_CONTROLLER,
    ClusterInfo,
    ClusterKey,
    ControlPlaneInfo,
    MachineDeploymentInfo,
    MachineInfo,
    MachineSetInfo,
    NodeInfo,
    NodePlanInfo,
    ObjectRef,
    Snapshot,
    format_time,
)

nodeplan_name = lru_cache(maxsize=65536)(_nodeplan_name)


@dataclass(frozen=True, slots=True)
class NodeRequest:
    """The state of a NodePlan's request as the node reports it right now."""

    state: SignalState | None
    reason: str
    at: datetime | None = None  # when the node entered ``state`` (the node's clock)
    drain: tuple[str, ...] = ()  # the drain's outcome per pod, where the node says


PHASE_DELETING = "Deleting"


@dataclass(slots=True)
class PlanView:
    """A NodePlan's effective state after this pass' upkeep actions."""

    plan: NodePlanInfo
    phase: str
    in_flight: bool
    failed: bool
    completed: bool
    # Its node is done, its Completed status is written by this very pass: it still takes
    # its place in the budget until that lands (the next node starts a pass later, so
    # the NodePlans never show more in flight than the budget allows).
    recording: bool = False


@dataclass(frozen=True, slots=True)
class Unsent:
    """A started NodePlan whose request is not on its node: sent (or held) once every
    NodePlan's view of this pass is known."""

    plan: NodePlanInfo
    ckey: ClusterKey
    node: NodeInfo | None
    view: PlanView


def deployment_budget(md: MachineDeploymentInfo
                      ) -> tuple[UnavailabilityBudget, tuple[str, str] | None]:
    """How many of the MD's nodes may be down at once, and (reason, message) when that
    makes in-place upgrades impossible."""
    if md.strategy == "OnDelete":
        # Cluster API's OnDelete has no maxUnavailable: it replaces a Machine only once
        # someone deletes it (its own budget is 0), so nothing is taken down in place.
        return UnavailabilityBudget(0, "OnDelete"), (
            C.R_MAX_UNAVAILABLE_ZERO,
            "rollout strategy OnDelete: Cluster API takes no Machine down by itself "
            "(maxUnavailable is 0 there), so k0s-fleet upgrades none in place; it writes "
            "the version (unpaused) when the rollout policy admits the cluster, and Cluster "
            "API replaces each Machine you delete; or use RollingUpdate with a "
            "maxUnavailable")
    try:
        budget = UnavailabilityBudget.resolve(md.max_unavailable, md.replicas, md.max_surge)
    except InvalidMaxUnavailableError as e:
        return UnavailabilityBudget(0, str(md.max_unavailable)), (
            C.R_INVALID_MAX_UNAVAILABLE, str(e))
    if budget.impossible:
        return budget, (C.R_MAX_UNAVAILABLE_ZERO,
                        f"maxUnavailable resolves to 0 (from {budget.source!r} of "
                        f"{md.replicas} replicas): in-place upgrade impossible")
    return budget, None


class PassState:
    def __init__(self, snapshot: Snapshot, settings: PlannerSettings,
                 hold: Hold | None = None) -> None:
        self.hold = hold or (lambda _cluster, _owner: None)
        self.s = snapshot
        self.settings = settings
        self.now = snapshot.now
        self.actions: list[Action] = []
        self.decisions: list[Decision] = []
        self.wake_at: datetime | None = None
        self.views: dict[tuple[str, str], PlanView] = {}
        self.unsent: list[Unsent] = []
        self.completed: dict[tuple[str, str], NodePlanInfo] = {}
        # (namespace, machine) -> views of all its NodePlans
        self.by_machine: dict[tuple[str, str], list[PlanView]] = defaultdict(list)
        self.machines_by_owner: dict[ObjectRef, list[MachineInfo]] = defaultdict(list)
        self.machines_by_cluster: dict[ClusterKey, list[MachineInfo]] = defaultdict(list)
        for m in snapshot.machines.values():
            if m.owner is not None:
                self.machines_by_owner[m.owner].append(m)
            self.machines_by_cluster[(m.ref.namespace, m.cluster)].append(m)
        # Indexes, so that a pass stays linear in the size of the fleet.
        self.plans_by_cluster: dict[ClusterKey, list[NodePlanInfo]] = defaultdict(list)
        for p in snapshot.nodeplans.values():
            self.plans_by_cluster[(p.ref.namespace, p.cluster)].append(p)
        self.kcps_by_cluster: dict[ClusterKey, list[ControlPlaneInfo]] = defaultdict(list)
        for k in snapshot.control_planes.values():
            self.kcps_by_cluster[(k.ref.namespace, k.cluster)].append(k)
        self.views_by_owner: dict[tuple[str, str, str], list[PlanView]] = defaultdict(list)
        self.sets_by_deployment: dict[tuple[str, str], list[MachineSetInfo]] = defaultdict(list)
        for mset in snapshot.machine_sets.values():
            if mset.deployment:
                self.sets_by_deployment[(mset.ref.namespace, mset.deployment)].append(mset)
        for ms in self.machines_by_owner.values():
            ms.sort(key=MachineInfo.sort_key)

    # -- helpers -----------------------------------------------------------------------
    def _machine_unavailable(self, m: MachineInfo, target: str | None,
                             nodes: dict[str, NodeInfo] | None, *,
                             unsent: Collection[tuple[str, str]] = ()) -> str | None:
        """Why this Machine counts against the budget right now (None: it does not).

        NodePlans keyed in ``unsent`` (their request not on the node yet) do not count:
        they are the ones whose request may or may not be sent now.
        """
        views = [v for v in self.by_machine.get((m.ref.namespace, m.ref.name), [])
                 if (v.plan.ref.namespace, v.plan.ref.name) not in unsent]
        if any(v.in_flight for v in views):
            return "upgrading"
        if any(v.recording for v in views):
            return "completing (its NodePlan's end is being recorded)"
        if target is not None and any(v.failed and same_version(v.plan.version, target)
                                      for v in views):
            return "failed"
        if m.deleting:
            return "deleting"
        if nodes is None:
            return "cluster unreachable"
        node = nodes.get(m.node_name)
        if node is None:
            return "no node"
        if self._carries_live_request(node):
            return "busy"  # e.g. a request whose NodePlan failed its deadline still runs
        if not node.ready:
            return "NotReady"
        if node.unschedulable:
            return "unschedulable"
        return None

    def emit(self, *actions: Action) -> None:
        self.actions.extend(actions)

    def wake(self, at: datetime) -> None:
        if self.wake_at is None or at < self.wake_at:
            self.wake_at = at

    def _unreachable(self, ckey: ClusterKey) -> str | None:
        """"workload cluster X unreachable since T: error" when its API server is down."""
        info = self.cluster(*ckey)
        if self.s.nodes.get(ckey) is not None or info is None or info.unreachable_since is None:
            return None
        return (f"workload cluster {ckey[1]} unreachable since "
                f"{format_time(info.unreachable_since)}"
                + (f": {info.unreachable_error}" if info.unreachable_error else ""))

    def cluster(self, namespace: str, name: str) -> ClusterInfo | None:
        return self.s.clusters.get((namespace, name))

    def nodes(self, key: ClusterKey) -> dict[str, NodeInfo] | None:
        nodes = self.s.nodes.get(key)
        return None if nodes is None else dict(nodes)

    def node(self, key: ClusterKey, name: str) -> NodeInfo | None:
        nodes = self.s.nodes.get(key)
        return None if nodes is None else nodes.get(name)

    def owner_target(self, p: NodePlanInfo) -> str | None:
        key = (p.ref.namespace, p.owner_name)
        if p.owner_kind == KIND_MD and key in self.s.deployments:
            return valid_version(self.s.deployments[key].version)
        if p.owner_kind == KIND_KCP and key in self.s.control_planes:
            return valid_version(self.s.control_planes[key].version)
        return None

    @staticmethod
    def _carries_live_request(node: NodeInfo) -> bool:
        return any(c is not None and not c.terminal
                   for c in (ex.carried(node) for ex in EXECUTORS.values()))

    def _control_plane_busy(self, namespace: str, cluster: str, *,
                            exclude: NodePlanInfo | None = None,
                            recording: bool = True) -> bool:
        """A control plane's NodePlan is in flight (or, with ``recording``, its
        completion is being recorded: its node is done)."""
        for p in self.plans_by_cluster.get((namespace, cluster), ()):
            if p is exclude:
                continue
            if p.role != ROLE_CONTROLLER:
                continue
            view = self.views.get((p.ref.namespace, p.ref.name))
            if view is not None and (view.in_flight or (recording and view.recording)):
                return True
            if view is None and not p.terminal and not p.deleting:
                return True
        return False
