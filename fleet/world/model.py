"""The controller's view of the world: immutable snapshot types, parsed from API objects.

Everything the planner decides on is in a :class:`Snapshot`: the Cluster API objects of
the management cluster, the NodePlans, and per workload cluster the Nodes (or autopilot
ControlNodes) with their signal annotations. Parsing from plain dicts lives here too, so
the planner never touches raw JSON and tests can build snapshots directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from fleet.contract.nodeplan import NodePlanPhase
from fleet.contract.selectors import LabelSelector
from fleet.contract.signal import (
    AUTOPILOT_SIGNAL_DATA_KEY,
    CORDONED_BY_KEY,
    DOMAIN,
    RUNNING_VERSION_KEY,
    AutopilotSignal,
    InvalidSignalError,
    NodePolicy,
    SignalData,
    parse_autopilot_signal,
    parse_signal,
)
from fleet.contract.versions import same_version

ROLE_CONTROLLER = "controller"
ROLE_WORKER = "worker"

EXECUTOR_AGENT = "agent"
EXECUTOR_AUTOPILOT = "autopilot"

KIND_MD = "MachineDeployment"
KIND_KCP = "K0sControlPlane"
KIND_HOSTED_CP = "K0smotronControlPlane"  # k0smotron's hosted control plane (pods)
KIND_WORKER_TEMPLATE = "K0sWorkerConfigTemplate"
GROUP_BOOTSTRAP = "bootstrap.cluster.x-k8s.io"
KIND_MACHINE = "Machine"
KIND_NODEPLAN = "NodePlan"
KIND_NODE = "Node"
KIND_CONTROL_NODE = "ControlNode"

LABEL_CLUSTER_NAME = "cluster.x-k8s.io/cluster-name"
LABEL_CONTROL_PLANE = "cluster.x-k8s.io/control-plane"
LABEL_CONTROL_PLANE_NAME = "cluster.x-k8s.io/control-plane-name"
LABEL_DEPLOYMENT_NAME = "cluster.x-k8s.io/deployment-name"
LABEL_SET_NAME = "cluster.x-k8s.io/set-name"
ANN_CLONED_FROM_NAME = "cluster.x-k8s.io/cloned-from-name"
ANN_CLONED_FROM_GROUPKIND = "cluster.x-k8s.io/cloned-from-groupkind"
ANN_K0S_CONFIG = "k0s.controlplane.cluster.x-k8s.io/k0s-config"

# Operator annotations (documented in docs/controller.md).
ANN_RETRY = f"{DOMAIN}/retry"
# The worker Machine annotation carrying the k0s version its node runs (set on completion).
ANN_MACHINE_RUNNING_VERSION = RUNNING_VERSION_KEY
NODEPLAN_FINALIZER = f"{DOMAIN}/node-signal"
# On every FleetUpgrade: a deleted one stays, showing Withdrawing, until the clusters whose
# version it had written have finished (fleet/world/intent.py withdrawing_status)
FLEET_UPGRADE_FINALIZER = f"{DOMAIN}/withdraw"
# A NodePlan the controller dispatches is created started: this annotation carries the
# first request's identity (``created`` in the signal; attempt 1) and why it was
# dispatched, so no status write is needed before the node is signalled. A NodePlan
# without it (the runtime extension's) is started by a status write (status.startedAt);
# status.startedAt, once written (a retry), wins.
ANN_REQUESTED_AT = f"{DOMAIN}/requested-at"
ANN_DISPATCH_REASON = f"{DOMAIN}/dispatch-reason"
# The one writer of versions (docs/operations.md "Roll a version"): the version k0s-fleet
# last wrote (or adopted) into an MD/KCP; a spec version that differs was written by
# someone else.
ANN_WRITTEN_VERSION = f"{DOMAIN}/version"
# Cluster API's pause annotation (honoured by k0smotron's KCP controller and CAPI's own),
# and k0s-fleet's record that it set it (value: the version being rolled), so that a
# restarted controller resumes the rollout or releases the pause.
ANN_CAPI_PAUSED = "cluster.x-k8s.io/paused"
ANN_PAUSED_FOR = f"{DOMAIN}/paused-for"

ClusterKey = tuple[str, str]  # (namespace, name) of the CAPI Cluster


@dataclass(frozen=True, slots=True, order=True)
class ObjectRef:
    kind: str
    namespace: str
    name: str
    uid: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}" if self.namespace else \
            f"{self.kind} {self.name}"


# Condition and status messages are cut to this many characters, so that an object's
# status stays small however many nodes or clusters a message names.
MAX_MESSAGE = 900


def truncate(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` cut to at most ``limit`` characters, "..." marking a cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str = ""

    def same_as(self, other: Condition | None) -> bool:
        return other is not None and (self.type, self.status, self.reason, self.message) == (
            other.type, other.status, other.reason, other.message)


@dataclass(frozen=True, slots=True)
class TemplateRef:
    """A reference as CAPI v1beta2 writes it: apiGroup + kind + name."""

    group: str
    kind: str
    name: str

    @property
    def group_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind

    def __str__(self) -> str:
        return f"{self.group_kind}/{self.name}"


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    namespace: str
    name: str
    paused: bool = False
    executor: str = EXECUTOR_AGENT
    # the CAPI Cluster's labels with the fleet YAML's entry labels laid over them
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    # the CAPI Cluster's annotations (the rollout reads its pause/hold annotations there)
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False)
    # Its workload API server has not answered since then (the Node watch keeps failing).
    unreachable_since: datetime | None = None
    unreachable_error: str = ""
    # This controller has acted on the cluster since then (its watches started: process
    # start, leadership or a shard taken over). A request not yet answered is given its
    # whole pending deadline from then: time with no controller acting is not the node's.
    acting_since: datetime | None = None

    @property
    def key(self) -> ClusterKey:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class FleetUpgradeInfo:
    """A FleetUpgrade: "these clusters go to k0s version X" (fleet/world/intent.py)."""

    ref: ObjectRef
    version: str | None  # normalised; None when spec.version is not a k0s version
    raw_version: str
    selector: LabelSelector | None  # None: the whole fleet
    created: datetime
    generation: int = 0
    problem: str | None = None  # why it cannot be used (bad version, bad selector)
    deleting: bool = False
    status: Mapping[str, Any] = field(default_factory=dict)
    resource_version: str = ""  # of the object ``status`` was read from (a patch's base)
    finalizers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class IntentTarget:
    """The version a FleetUpgrade asks of one cluster."""

    intent: ObjectRef  # the FleetUpgrade
    version: str  # normalised
    # The rung this cluster works towards now (a version at most one minor ahead of the
    # oldest it runs: fleet/contract/skew.py ladder); None when it is ``version`` itself.
    rung: str | None = None
    # The rungs still ahead after ``rung`` (the ladder to ``version``), for the status.
    ladder: tuple[str, ...] = ()
    # Why the cluster is not moved towards ``version`` at all (k0s's skew rules): the
    # rule's name and a sentence naming the versions. None: it is moved.
    refusal: tuple[str, str] | None = None

    @property
    def step(self) -> str:
        """The version the cluster's objects are moved to now."""
        return self.rung or self.version


@dataclass(frozen=True, slots=True)
class RolloutStatus:
    """What k0s-fleet last wrote into an MD/KCP status (``status.k0sFleet`` + conditions)."""

    conditions: tuple[Condition, ...] = ()
    counts: Mapping[str, Any] = field(default_factory=dict)

    def condition(self, ctype: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == ctype), None)


class _VersionOwner:
    """What the version owners (MachineDeployment, MachineSet, K0sControlPlane) share about
    who writes versions."""

    __slots__ = ()
    annotations: Mapping[str, str]
    version: str | None
    spec_version: str | None

    @property
    def object_version(self) -> str | None:
        """The version written in the object itself (``version`` may be an intent's)."""
        return self.spec_version if self.spec_version is not None else self.version

    @property
    def written_version(self) -> str | None:
        """The version k0s-fleet last wrote or adopted (None: not enrolled)."""
        return self.annotations.get(ANN_WRITTEN_VERSION) or None

    @property
    def capi_paused(self) -> bool:
        return ANN_CAPI_PAUSED in self.annotations

    @property
    def paused_for(self) -> str | None:
        """The version k0s-fleet paused this object for (its own pause), or None."""
        return self.annotations.get(ANN_PAUSED_FOR) or None


@dataclass(frozen=True, slots=True)
class WorkerTemplateInfo(_VersionOwner):
    """An MD's worker bootstrap template (k0smotron's K0sWorkerConfigTemplate): its
    ``spec.template.spec.version``, when set, is the version new worker Machines install."""

    ref: ObjectRef
    version: str | None
    annotations: Mapping[str, str] = field(default_factory=dict)
    # how many MachineDeployments reference it (k0s-fleet writes only one MD's own)
    users: int = 1
    spec_version: str | None = None  # templates have no intent: ``version`` is theirs


@dataclass(frozen=True, slots=True)
class MachineDeploymentInfo(_VersionOwner):
    ref: ObjectRef
    cluster: str
    replicas: int
    # the target the planner works towards: the FleetUpgrade's version for clusters an
    # intent covers, else what the object says (spec_version)
    version: str | None
    max_unavailable: int | str | None
    strategy: str = "RollingUpdate"
    max_surge: int | str | None = None  # None: Cluster API's default, 1
    bootstrap: TemplateRef | None = None
    infrastructure: TemplateRef | None = None
    failure_domain: str | None = None
    paused: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)
    status: RolloutStatus = field(default_factory=RolloutStatus)
    spec_version: str | None = None  # spec.template.spec.version as written in the object
    intent: ObjectRef | None = None  # the FleetUpgrade that sets ``version``
    # its bootstrap template when that is a K0sWorkerConfigTemplate found in the cluster
    worker_template: WorkerTemplateInfo | None = None


@dataclass(frozen=True, slots=True)
class MachineSetInfo(_VersionOwner):
    ref: ObjectRef
    cluster: str
    deployment: str | None
    bootstrap: TemplateRef | None = None
    infrastructure: TemplateRef | None = None
    failure_domain: str | None = None
    replicas: int = 0
    created: datetime | None = None
    version: str | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)
    spec_version: str | None = None  # MachineSets have no intent: ``version`` is theirs
    # Cluster API's ``Paused`` condition (v1beta2 ``status.conditions``; read as v1beta1,
    # ``status.v1beta2.conditions``): True once a reconcile that began after the pause
    # annotation ran, False while it has not; None when CAPI writes no such condition
    # (nothing reconciles the object, or a CAPI that does not report it).
    paused_reported: bool | None = None


@dataclass(frozen=True, slots=True)
class ControlPlaneInfo(_VersionOwner):
    """A K0sControlPlane."""

    ref: ObjectRef
    cluster: str
    replicas: int
    version: str | None
    update_strategy: str = "InPlace"
    infrastructure: TemplateRef | None = None
    # k0sConfigSpec without its `k0s` member (reconciled by dynamic config, not compared).
    k0s_config: Mapping[str, Any] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    status: RolloutStatus = field(default_factory=RolloutStatus)
    spec_version: str | None = None  # spec.version as written in the object
    intent: ObjectRef | None = None  # the FleetUpgrade that sets ``version``
    # A K0smotronControlPlane (hosted: the control plane runs as pods k0smotron rolls
    # itself, no Machines): what k0smotron reports of it.
    hosted: bool = False
    status_version: str | None = None
    ready_replicas: int = 0
    status_replicas: int = 0

    def hosted_on(self, target: str | None) -> bool:
        """A hosted control plane k0smotron reports on ``target`` with every replica ready
        (and no more replicas than wanted: the old pods are gone)."""
        return (self.hosted and target is not None
                and same_version(self.status_version, target)
                and self.ready_replicas >= self.replicas
                and self.status_replicas <= self.replicas)


@dataclass(frozen=True, slots=True)
class InfraMachineInfo:
    """What the controller could learn about a Machine's infrastructure object."""

    cloned_from_name: str | None = None
    cloned_from_group_kind: str | None = None
    error: str | None = None  # why it could not be read
    # the reader was refused (Forbidden, Unauthorized): someone with other rights may
    # read it (``k0s-fleet plan`` run by a user without the controller's RBAC)
    denied: bool = False


@dataclass(frozen=True, slots=True)
class MachineInfo:
    ref: ObjectRef
    cluster: str
    version: str | None
    role: str
    created: datetime
    owner: ObjectRef | None = None  # the MD or KCP this machine belongs to
    machine_set: str | None = None
    node_name: str = ""
    deleting: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)
    infra: InfraMachineInfo | None = None
    infrastructure: TemplateRef | None = None  # spec.infrastructureRef

    @property
    def running_version_annotation(self) -> str | None:
        return self.annotations.get(ANN_MACHINE_RUNNING_VERSION)

    def sort_key(self) -> tuple[datetime, str]:
        return (self.created, self.ref.name)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A workload-cluster Node, or the autopilot ControlNode of a pure controller."""

    name: str
    kind: str = KIND_NODE
    ready: bool = True
    unschedulable: bool = False
    running_version: str | None = None
    signal: SignalData | None = None
    signal_error: str | None = None
    autopilot_signal: AutopilotSignal | None = None  # autopilot's signal (executor autopilot)
    cordoned_by: str | None = None
    arch: str = "amd64"
    kubelet_version: str | None = None  # status.nodeInfo.kubeletVersion, e.g. v1.31.3+k0s
    k0s_version: str | None = None  # a ControlNode's status.k0sVersion (autopilot's report)

    @property
    def available(self) -> bool:
        return self.ready and not self.unschedulable


@dataclass(frozen=True, slots=True)
class NodePlanInfo:
    ref: ObjectRef
    cluster: str
    machine: str
    node: str
    role: str
    owner_kind: str
    owner_name: str
    version: str
    url: str = ""
    sha256: str = ""
    allow_unverified: bool = False
    force: bool = False
    executor: str = EXECUTOR_AGENT
    source: str = "controller"
    # spec.nodePolicy: the drain/verify policy each request to an agent carries
    node_policy: NodePolicy | None = None
    created: datetime | None = None
    deleting: bool = False
    finalizers: tuple[str, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    # status
    phase: str = NodePlanPhase.PENDING
    node_state: str = ""
    message: str = ""
    reason: str = ""
    attempts: int = 0
    started_at: datetime | None = None
    phase_since: datetime | None = None
    # the node's own timestamp of node_state (its clock; phase_since is ours)
    node_state_at: datetime | None = None
    completed_at: datetime | None = None
    traceparent: str = ""
    conditions: tuple[Condition, ...] = ()

    @property
    def plan_id(self) -> str:
        """The signal's planId: which NodePlan a node signal belongs to."""
        return f"{self.ref.namespace}/{self.ref.name}"

    @property
    def started(self) -> bool:
        return self.started_at is not None

    @property
    def terminal(self) -> bool:
        return self.phase in (NodePlanPhase.COMPLETED, NodePlanPhase.FAILED)

    @property
    def owner_ref(self) -> ObjectRef:
        return ObjectRef(self.owner_kind, self.ref.namespace, self.owner_name)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one planning pass looks at. ``nodes[cluster]`` is None when unknown."""

    now: datetime
    clusters: Mapping[ClusterKey, ClusterInfo] = field(default_factory=dict)
    deployments: Mapping[tuple[str, str], MachineDeploymentInfo] = field(default_factory=dict)
    machine_sets: Mapping[tuple[str, str], MachineSetInfo] = field(default_factory=dict)
    control_planes: Mapping[tuple[str, str], ControlPlaneInfo] = field(default_factory=dict)
    machines: Mapping[tuple[str, str], MachineInfo] = field(default_factory=dict)
    nodeplans: Mapping[tuple[str, str], NodePlanInfo] = field(default_factory=dict)
    nodes: Mapping[ClusterKey, Mapping[str, NodeInfo] | None] = field(default_factory=dict)
    # clusters a FleetUpgrade covers, and the version it asks of them
    intents: Mapping[ClusterKey, IntentTarget] = field(default_factory=dict)
    upgrades: Mapping[tuple[str, str], FleetUpgradeInfo] = field(default_factory=dict)
    # per workload cluster, an autopilot Plan still running there (name and state)
    autopilot_plans: Mapping[ClusterKey, str] = field(default_factory=dict)
    # clusters another controller replica acts on (sharding): their Nodes are not watched
    # here, their progress is judged from the management objects only (fleet rollout)
    foreign: AbstractSet[ClusterKey] = frozenset()
    # (namespace, name) of the NodePlans of clusters left out of this snapshot (those other
    # replicas act on): a node request naming one of them is not an orphan
    other_nodeplans: AbstractSet[tuple[str, str]] = frozenset()
    # The same snapshot cut by cluster, when it was built that way (the controller's):
    # a part that is the same object as before has not changed, so values derived from
    # it may be remembered (fleet.planner.incremental, fleet.rollout.progress).
    parts: Mapping[ClusterKey, Snapshot] | None = field(default=None, compare=False,
                                                        repr=False)
    # A sharded replica's part of a cluster another replica acts on (a *foreign digest*):
    # the rollout progress (fleet.rollout.progress.ClusterProgress) computed once from its
    # management objects when the part was built, which the part then no longer carries
    # (no Machines, MachineDeployments, MachineSets, K0sControlPlanes: nothing but the
    # rollout reads them of such a cluster). None: computed from the part itself.
    progress: tuple[object, ...] | None = field(default=None, compare=False, repr=False)


# -- parsing ---------------------------------------------------------------------------


def parse_time(value: Any) -> datetime | None:
    if not value or not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def format_time(t: datetime) -> str:
    """RFC 3339 in UTC with microseconds, so a time written and read back compares equal."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _ref(kind: str, obj: Mapping[str, Any]) -> ObjectRef:
    m = _meta(obj)
    return ObjectRef(kind, m.get("namespace") or "", m.get("name") or "", m.get("uid") or "")


def _template_ref(raw: Any) -> TemplateRef | None:
    if not isinstance(raw, dict) or not raw.get("name"):
        return None
    group = raw.get("apiGroup")
    if group is None and raw.get("apiVersion"):
        av = str(raw["apiVersion"])
        group = av.split("/", 1)[0] if "/" in av else ""
    return TemplateRef(group=str(group or ""), kind=str(raw.get("kind") or ""),
                       name=str(raw["name"]))


def parse_conditions(raw: Any) -> tuple[Condition, ...]:
    out: list[Condition] = []
    for c in raw or []:
        if isinstance(c, dict) and c.get("type"):
            out.append(Condition(str(c["type"]), str(c.get("status") or "Unknown"),
                                 str(c.get("reason") or ""), str(c.get("message") or "")))
    return tuple(out)


def _rollout_status(obj: Mapping[str, Any]) -> RolloutStatus:
    status = obj.get("status") or {}
    return RolloutStatus(conditions=parse_conditions(status.get("conditions")),
                         counts=dict(status.get("k0sFleet") or {}))


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(_meta(obj).get("annotations") or {})


def cluster_from(obj: Mapping[str, Any], *, executor: str = EXECUTOR_AGENT) -> ClusterInfo:
    m = _meta(obj)
    return ClusterInfo(namespace=m.get("namespace") or "", name=m.get("name") or "",
                       paused=bool((obj.get("spec") or {}).get("paused")), executor=executor,
                       labels=dict(m.get("labels") or {}), annotations=_annotations(obj))


def deployment_from(obj: Mapping[str, Any]) -> MachineDeploymentInfo:
    spec = obj.get("spec") or {}
    tspec = (spec.get("template") or {}).get("spec") or {}
    rollout = spec.get("rollout") or {}
    # v1beta2 keeps the strategy under spec.rollout; v1beta1 had spec.strategy.
    strategy = rollout.get("strategy") or spec.get("strategy") or {}
    rolling = strategy.get("rollingUpdate") or {}
    return MachineDeploymentInfo(
        ref=_ref(KIND_MD, obj),
        cluster=str(spec.get("clusterName") or tspec.get("clusterName") or ""),
        replicas=_int(spec.get("replicas"), 1),
        version=tspec.get("version"),
        max_unavailable=rolling.get("maxUnavailable"),
        max_surge=rolling.get("maxSurge"),
        strategy=str(strategy.get("type") or "RollingUpdate"),
        bootstrap=_template_ref((tspec.get("bootstrap") or {}).get("configRef")),
        infrastructure=_template_ref(tspec.get("infrastructureRef")),
        failure_domain=tspec.get("failureDomain"),
        paused=bool(spec.get("paused")),
        annotations=_annotations(obj),
        status=_rollout_status(obj),
        spec_version=tspec.get("version"),
    )


def worker_template_from(obj: Mapping[str, Any], users: int = 1) -> WorkerTemplateInfo:
    tspec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    version = tspec.get("version")
    return WorkerTemplateInfo(ref=_ref(KIND_WORKER_TEMPLATE, obj),
                              version=str(version) if version else None,
                              annotations=_annotations(obj), users=users)


def machine_set_from(obj: Mapping[str, Any]) -> MachineSetInfo:
    spec = obj.get("spec") or {}
    tspec = (spec.get("template") or {}).get("spec") or {}
    labels = _meta(obj).get("labels") or {}
    return MachineSetInfo(
        ref=_ref("MachineSet", obj),
        cluster=str(spec.get("clusterName") or ""),
        deployment=labels.get(LABEL_DEPLOYMENT_NAME),
        bootstrap=_template_ref((tspec.get("bootstrap") or {}).get("configRef")),
        infrastructure=_template_ref(tspec.get("infrastructureRef")),
        failure_domain=tspec.get("failureDomain"),
        replicas=_int(spec.get("replicas"), 0),
        created=parse_time(_meta(obj).get("creationTimestamp")),
        version=tspec.get("version"),
        annotations=_annotations(obj),
        paused_reported=capi_paused_condition(obj),
    )


def capi_paused_condition(obj: Mapping[str, Any]) -> bool | None:
    """Whether Cluster API reports the object paused: its ``Paused`` condition, in the
    v1beta2 form (``status.conditions`` of a v1beta2 object; ``status.v1beta2.conditions``
    of one read as v1beta1). CAPI v1.12.1 and v1.14.2 both write it (True with reason
    ``Paused`` once a reconcile saw the annotation, False ``NotPaused`` otherwise); neither
    has a Paused condition in the v1beta1 form (``status.deprecated.v1beta1.conditions``).
    None when there is no such condition."""
    status = obj.get("status") or {}
    for raw in (status.get("conditions"), (status.get("v1beta2") or {}).get("conditions")):
        for c in raw or []:
            if isinstance(c, dict) and c.get("type") == "Paused":
                return c.get("status") == "True"
    return None


def comparable_k0s_config(spec: Any) -> dict[str, Any]:
    """k0sConfigSpec as k0smotron compares it: without ``k0s`` (dynamic config)."""
    if not isinstance(spec, dict):
        return {}
    return {k: v for k, v in spec.items() if k != "k0s"}


def control_plane_from(obj: Mapping[str, Any]) -> ControlPlaneInfo:
    spec = obj.get("spec") or {}
    labels = _meta(obj).get("labels") or {}
    return ControlPlaneInfo(
        ref=_ref(KIND_KCP, obj),
        cluster=str(labels.get(LABEL_CLUSTER_NAME) or ""),
        replicas=_int(spec.get("replicas"), 1),
        version=spec.get("version"),
        update_strategy=str(spec.get("updateStrategy") or "InPlace"),
        infrastructure=_template_ref((spec.get("machineTemplate") or {}).get("infrastructureRef")),
        k0s_config=comparable_k0s_config(spec.get("k0sConfigSpec") or {}),
        annotations=_annotations(obj),
        status=_rollout_status(obj),
        spec_version=spec.get("version"),
    )


def hosted_control_plane_from(obj: Mapping[str, Any]) -> ControlPlaneInfo:
    """A K0smotronControlPlane: its cluster from Cluster API's cluster-name label (or the
    owning Cluster), what k0smotron reports of its pods in ``status``."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    meta = _meta(obj)
    labels = meta.get("labels") or {}
    cluster = labels.get(LABEL_CLUSTER_NAME) or next(
        (o.get("name") for o in meta.get("ownerReferences") or []
         if isinstance(o, Mapping) and o.get("kind") == "Cluster"), "")
    replicas = _int(spec.get("replicas"), 1)
    return ControlPlaneInfo(
        ref=_ref(KIND_HOSTED_CP, obj), cluster=str(cluster or ""), replicas=replicas,
        version=spec.get("version"), annotations=_annotations(obj),
        status=_rollout_status(obj), spec_version=spec.get("version"), hosted=True,
        status_version=status.get("version") if isinstance(status.get("version"), str)
        else None,
        ready_replicas=_int(status.get("readyReplicas"), 0),
        status_replicas=_int(status.get("replicas"), 0))


def machine_from(obj: Mapping[str, Any], infra: InfraMachineInfo | None = None) -> MachineInfo:
    m = _meta(obj)
    spec = obj.get("spec") or {}
    labels = m.get("labels") or {}
    ns = m.get("namespace") or ""
    role = ROLE_CONTROLLER if LABEL_CONTROL_PLANE in labels else ROLE_WORKER
    owner: ObjectRef | None = None
    if role == ROLE_CONTROLLER:
        kcp = next((o for o in m.get("ownerReferences") or [] if o.get("kind") == KIND_KCP), None)
        name = (kcp or {}).get("name") or labels.get(LABEL_CONTROL_PLANE_NAME)
        if name:
            owner = ObjectRef(KIND_KCP, ns, name)
    elif labels.get(LABEL_DEPLOYMENT_NAME):
        owner = ObjectRef(KIND_MD, ns, labels[LABEL_DEPLOYMENT_NAME])
    machine_set = labels.get(LABEL_SET_NAME) or next(
        (o.get("name") for o in m.get("ownerReferences") or [] if o.get("kind") == "MachineSet"),
        None)
    node_ref = ((obj.get("status") or {}).get("nodeRef") or {}).get("name")
    return MachineInfo(
        ref=_ref(KIND_MACHINE, obj),
        cluster=str(spec.get("clusterName") or labels.get(LABEL_CLUSTER_NAME) or ""),
        version=spec.get("version"),
        role=role,
        created=parse_time(m.get("creationTimestamp")) or _EPOCH,
        owner=owner,
        machine_set=machine_set,
        # k0smotron names Nodes after the Machine unless told otherwise (PROTOCOLS §1).
        node_name=str(node_ref or m.get("name") or ""),
        deleting=bool(m.get("deletionTimestamp")),
        annotations=_annotations(obj),
        infra=infra,
        infrastructure=_template_ref(spec.get("infrastructureRef")),
    )


def infra_machine_from(obj: Mapping[str, Any]) -> InfraMachineInfo:
    ann = _annotations(obj)
    return InfraMachineInfo(cloned_from_name=ann.get(ANN_CLONED_FROM_NAME),
                            cloned_from_group_kind=ann.get(ANN_CLONED_FROM_GROUPKIND))


def _ready(conditions: Any, default: bool) -> bool:
    for c in conditions or []:
        if isinstance(c, dict) and c.get("type") == "Ready":
            return c.get("status") == "True"
    return default


def node_from(obj: Mapping[str, Any]) -> NodeInfo:
    """A Node, or an autopilot ControlNode (which has no Ready condition: Ready unless told)."""
    kind = obj.get("kind") or KIND_NODE
    ann = _annotations(obj)
    status = obj.get("status") or {}
    signal: SignalData | None = None
    signal_error: str | None = None
    try:
        signal = parse_signal(ann)
    except InvalidSignalError as e:
        signal_error = str(e)
    return NodeInfo(
        name=_meta(obj).get("name") or "",
        kind=kind,
        ready=_ready(status.get("conditions"), default=(kind == KIND_CONTROL_NODE)),
        unschedulable=bool((obj.get("spec") or {}).get("unschedulable")),
        running_version=ann.get(RUNNING_VERSION_KEY),
        signal=signal,
        signal_error=signal_error,
        autopilot_signal=parse_autopilot_signal(ann.get(AUTOPILOT_SIGNAL_DATA_KEY)),
        cordoned_by=ann.get(CORDONED_BY_KEY),
        arch=str(((status.get("nodeInfo") or {}).get("architecture"))
                 or (_meta(obj).get("labels") or {}).get("kubernetes.io/arch") or "amd64"),
        kubelet_version=(status.get("nodeInfo") or {}).get("kubeletVersion") or None,
        k0s_version=(str(status.get("k0sVersion") or "") or None)
        if kind == KIND_CONTROL_NODE else None,
    )


def _node_policy(raw: Any) -> NodePolicy | None:
    """spec.nodePolicy; one the schema let through but the signal would refuse is left
    out (the agent then uses its own settings) rather than making the plan unsignallable."""
    if not isinstance(raw, Mapping) or not raw:
        return None
    try:
        return NodePolicy.model_validate(raw)
    except ValidationError:
        return None


def nodeplan_from(obj: Mapping[str, Any]) -> NodePlanInfo:
    m = _meta(obj)
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    annotations = _annotations(obj)
    started_at = parse_time(status.get("startedAt"))
    attempts = int(status.get("attempts") or 0)
    if started_at is None and (requested := parse_time(annotations.get(ANN_REQUESTED_AT))):
        started_at, attempts = requested, max(1, attempts)  # created started (attempt 1)
    return NodePlanInfo(
        ref=_ref(KIND_NODEPLAN, obj),
        cluster=str(spec.get("clusterName") or ""),
        machine=str(spec.get("machineName") or ""),
        node=str(spec.get("nodeName") or ""),
        role=str(spec.get("role") or ROLE_WORKER),
        owner_kind=str(spec.get("ownerKind") or ""),
        owner_name=str(spec.get("ownerName") or ""),
        version=str(spec.get("version") or ""),
        url=str(spec.get("url") or ""),
        sha256=str(spec.get("sha256") or ""),
        allow_unverified=bool(spec.get("allowUnverified")),
        force=bool(spec.get("forceUpdate")),
        executor=str(spec.get("executor") or EXECUTOR_AGENT),
        source=str(spec.get("source") or "controller"),
        node_policy=_node_policy(spec.get("nodePolicy")),
        created=parse_time(m.get("creationTimestamp")),
        deleting=bool(m.get("deletionTimestamp")),
        finalizers=tuple(m.get("finalizers") or ()),
        annotations=annotations,
        phase=str(status.get("phase") or NodePlanPhase.PENDING),
        node_state=str(status.get("nodeState") or ""),
        message=str(status.get("message") or ""),
        reason=next((c.get("reason") or "" for c in status.get("conditions") or []
                     if c.get("type") == "Failed" and c.get("status") == "True"), ""),
        attempts=attempts,
        started_at=started_at,
        phase_since=parse_time(status.get("phaseSince")),
        node_state_at=parse_time(status.get("nodeStateAt")),
        completed_at=parse_time(status.get("completedAt")),
        traceparent=str(status.get("traceparent") or ""),
        conditions=parse_conditions(status.get("conditions")),
    )


# autopilot Plan states after which the Plan drives nothing any more (Completed, or one of
# its error states, which abort it); anything else (none yet, Schedulable, SchedulableWait)
# is a rollout in progress.
AUTOPILOT_PLAN_LIVE_STATES = frozenset({"", "Schedulable", "SchedulableWait"})
