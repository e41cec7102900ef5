"""What the planner asks for. Each action is idempotent when performed by the dispatcher."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from fleet.world.executors import Request
from fleet.world.model import ClusterKey, Condition, ObjectRef


@dataclass(frozen=True, slots=True)
class CreateNodePlan:
    """Dispatch one node: create its NodePlan (AlreadyExists = already dispatched)."""

    cluster: ClusterKey
    owner: ObjectRef
    machine: ObjectRef
    node: str
    node_kind: str
    role: str
    version: str
    executor: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class StartNodePlan:
    """Record the request identity (startedAt, attempts) before the node is signalled."""

    plan: ObjectRef
    attempts: int
    started_at: datetime
    previous_phase: str = ""


@dataclass(frozen=True, slots=True)
class SignalNode:
    """Write the NodePlan's request into the node signal (agent or autopilot keys)."""

    plan: ObjectRef
    cluster: ClusterKey
    node: str
    node_kind: str
    executor: str
    request: Request


@dataclass(frozen=True, slots=True)
class UpdateNodePlanStatus:
    """Mirror what the node says into NodePlan status (phase, node state, conditions)."""

    plan: ObjectRef
    phase: str
    node_state: str
    message: str
    phase_since: datetime | None
    completed_at: datetime | None
    running_version: str | None
    conditions: tuple[Condition, ...]
    node_state_at: datetime | None = None
    drain: tuple[str, ...] = ()  # the node's drain outcome per pod (status.drain)


@dataclass(frozen=True, slots=True)
class MarkNodePlanFailed:
    """A node failed or missed a progress deadline."""

    plan: ObjectRef
    reason: str
    message: str
    node_state: str
    deadline: bool = False
    drain: tuple[str, ...] = ()  # the node's drain outcome per pod (status.drain)


@dataclass(frozen=True, slots=True)
class RetryNodePlan:
    """Reset a Failed NodePlan for another attempt (operator asked with the retry annotation)."""

    plan: ObjectRef
    attempts: int
    started_at: datetime


@dataclass(frozen=True, slots=True)
class RemoveAnnotation:
    obj: ObjectRef
    key: str
    value: str  # only removed while it still has this value


@dataclass(frozen=True, slots=True)
class ClearSignal:
    """Take a request off a node (its NodePlan is gone or being deleted)."""

    cluster: ClusterKey
    node: str
    node_kind: str
    executor: str
    plan_id: str


@dataclass(frozen=True, slots=True)
class UncordonNode:
    """Uncordon a node k0s-fleet cordoned and no request is active on any more."""

    cluster: ClusterKey
    node: str


@dataclass(frozen=True, slots=True)
class ReleaseNodePlan:
    """Remove the NodePlan finalizer once its node carries no request of it."""

    plan: ObjectRef


@dataclass(frozen=True, slots=True)
class PatchMachineVersion:
    """Control plane done: Machine.spec.version = what now runs (as k0smotron does).
    ``record_running`` (a worker at the end of the paused sequence): the running-version
    annotation is written in the same request (fleet.world.eligibility.completion_deferred)."""

    machine: ObjectRef
    version: str
    record_running: bool = False


@dataclass(frozen=True, slots=True)
class AnnotateWorkerVersion:
    """Worker done: record the running k0s version on the Machine."""

    machine: ObjectRef
    version: str


@dataclass(frozen=True, slots=True)
class RecordWrittenVersion:
    """Enrol an MD/KCP under the one writer of versions: record the version its spec says
    (annotation fleet.k0s-fleet.io/version) as the one k0s-fleet answers for."""

    owner: ObjectRef
    version: str
    intent: ObjectRef | None = None


@dataclass(frozen=True, slots=True)
class WriteVersion:
    """Write the target into the MD/KCP (and the record), in one patch; with ``pause`` the
    same patch sets cluster.x-k8s.io/paused and k0s-fleet's record of that pause, so
    k0smotron / Cluster API never see the new version unpaused. Refused (no write) when
    the object no longer says ``expected``: someone else wrote it meanwhile."""

    owner: ObjectRef
    version: str
    expected: str | None
    pause: bool
    intent: ObjectRef | None = None


@dataclass(frozen=True, slots=True)
class PauseObject:
    """Set cluster.x-k8s.io/paused (and k0s-fleet's record of it) on an object that is not
    paused yet: a MachineSet before its and its Machines' versions move (its controller
    would otherwise re-apply the old Machine versions from a reconcile in flight).
    ``template_version`` (a MachineSet behind the target): the same patch moves its
    ``spec.template.spec.version`` (a paused MachineSet's controller reads no template;
    its Machines are written only once the pause is observed, a pass later)."""

    owner: ObjectRef
    version: str
    template_version: bool = False


@dataclass(frozen=True, slots=True)
class ReleasePause:
    """Every Machine is on the target: remove cluster.x-k8s.io/paused (only if k0s-fleet
    set it, i.e. its record fleet.k0s-fleet.io/paused-for is there) and the record."""

    owner: ObjectRef
    version: str


@dataclass(frozen=True, slots=True)
class PatchMachineSetVersion:
    """Paused MD, every node upgraded in place: the MachineSet's template version moves to
    the target so that Cluster API finds it up to date (no new MachineSet) on unpause."""

    machine_set: ObjectRef
    version: str


@dataclass(frozen=True, slots=True)
class ReportVersionConflict:
    """Someone else changed the version of an object k0s-fleet writes: Warning Event."""

    owner: ObjectRef
    message: str


@dataclass(frozen=True, slots=True)
class ReportOtherDriver:
    """Another controller moves this object: Warning Event (the condition says it too)."""

    owner: ObjectRef
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class RolloutCounts:
    target_version: str
    updated: int
    total: int
    in_flight: int
    failed: int
    unavailable: int
    max_unavailable: int
    not_in_place: int
    halted: bool

    def as_status(self) -> dict[str, object]:
        return {
            "targetVersion": self.target_version, "updated": self.updated, "total": self.total,
            "summary": f"{self.updated}/{self.total}", "inFlight": self.in_flight,
            "failed": self.failed, "unavailable": self.unavailable,
            "maxUnavailable": self.max_unavailable, "notInPlace": self.not_in_place,
            "halted": self.halted,
        }


@dataclass(frozen=True, slots=True)
class SetRolloutStatus:
    """Conditions and ``updated/total`` counts on a MachineDeployment or K0sControlPlane."""

    owner: ObjectRef
    conditions: tuple[Condition, ...]
    counts: RolloutCounts


@dataclass(frozen=True, slots=True)
class HaltObject:
    """The object's failure budget is spent: no new dispatches until failures are cleared."""

    owner: ObjectRef
    failed: int
    budget: int
    message: str


@dataclass(frozen=True, slots=True)
class ReportNotInPlace:
    """Some machines need more than a version change: Cluster API's job; say why."""

    owner: ObjectRef
    reason: str  # NotInPlace | MaxUnavailableZero | InvalidMaxUnavailable
    message: str


@dataclass(frozen=True, slots=True)
class RecordEvent:
    regarding: ObjectRef
    reason: str
    note: str
    type: str = "Normal"
    action: str = "Upgrade"


Action = (
    CreateNodePlan | StartNodePlan | SignalNode | UpdateNodePlanStatus | MarkNodePlanFailed
    | RetryNodePlan | RemoveAnnotation | ClearSignal | UncordonNode | ReleaseNodePlan
    | PatchMachineVersion | AnnotateWorkerVersion | SetRolloutStatus | HaltObject
    | ReportNotInPlace | RecordEvent | RecordWrittenVersion | WriteVersion | PauseObject
    | ReleasePause
    | PatchMachineSetVersion | ReportVersionConflict | ReportOtherDriver
)


@dataclass(frozen=True, slots=True)
class Decision:
    """Why the planner did what it did for one object (for spans, logs and `plan`)."""

    owner: ObjectRef
    target: str
    updated: int
    total: int
    unavailable: int
    max_unavailable: int
    dispatched: tuple[str, ...] = ()
    waiting: str = ""


@dataclass(frozen=True, slots=True)
class PlanResult:
    actions: list[Action] = field(default_factory=list)
    wake_at: datetime | None = None
    decisions: list[Decision] = field(default_factory=list)

# What a rolling node waits for: a node's request (the first group) and the writes the
# next request depends on (the second) before what only reports (the third).
STARTS = (CreateNodePlan, StartNodePlan, SignalNode, RetryNodePlan)
REPORTS = (SetRolloutStatus, RecordEvent, ReportNotInPlace, ReportVersionConflict,
           ReportOtherDriver)


def urgency(actions: Iterable[Action]) -> int:
    """0 for a group of actions that asks a node to move, 2 for one that only reports
    (status, conditions, Events), 1 otherwise: the order in which a pass starts its
    groups, so that a node's request is not queued behind another object's status."""
    kinds = [type(a) for a in actions]
    if any(issubclass(k, STARTS) for k in kinds):
        return 0
    return 2 if all(issubclass(k, REPORTS) for k in kinds) else 1

