"""The one snapshot builder: raw objects -> the :class:`~fleet.world.model.Snapshot` the planner
decides on.

The controller feeds it from its watch caches, ``k0s-fleet plan`` and ``status`` from
their one-shot lists (:class:`Listed`); both go through the same fleet membership, the
same parsing and the same rule for objects that cannot be read (skipped, logged once per
version), so ``plan`` and the controller never disagree about what the fleet holds.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from fleet.config.models import FleetConfig
from fleet.contract.skew import EMPTY_CATALOG, ReleaseCatalog
from fleet.contract.versions import same_version
from fleet.world.intent import apply_intents, fleet_upgrade_from, resolve, target_of
from fleet.world.model import (
    GROUP_BOOTSTRAP,
    KIND_HOSTED_CP,
    KIND_WORKER_TEMPLATE,
    ROLE_CONTROLLER,
    ClusterInfo,
    ClusterKey,
    FleetUpgradeInfo,
    InfraMachineInfo,
    MachineDeploymentInfo,
    MachineInfo,
    NodeInfo,
    ObjectRef,
    Snapshot,
    cluster_from,
    control_plane_from,
    deployment_from,
    hosted_control_plane_from,
    machine_from,
    machine_set_from,
    nodeplan_from,
    worker_template_from,
)
from fleet.world.records import NodeRecord

log = logging.getLogger(__name__)

T = TypeVar("T")
RawObject = dict[str, Any]


class ObjectSource(Protocol):
    """Raw objects of one kind, and a (possibly memoising) way to parse one by its key
    (a memoising source need not even decode an object whose parse it remembers)."""

    @property
    def kind(self) -> str: ...

    def __iter__(self) -> Iterator[RawObject]: ...

    def object_keys(self) -> Iterable[Any]:
        """What names each object for :meth:`parsed` and :meth:`describe`."""
        ...

    def parsed(self, key: Any, parse: Callable[[RawObject], T], tag: str = "") -> T: ...

    def describe(self, key: Any) -> tuple[str, str, str]:
        """(namespace, name, resourceVersion) of one object, for messages."""
        ...


@dataclass(frozen=True, slots=True)
class Listed:
    """A one-shot list of objects of one kind (no memo: each is parsed once anyway).
    Its keys are the objects' positions in the list."""

    kind: str
    items: Sequence[RawObject] = ()

    def __iter__(self) -> Iterator[RawObject]:
        return iter(self.items)

    def object_keys(self) -> Iterable[int]:
        return range(len(self.items))

    def parsed(self, key: int, parse: Callable[[RawObject], T], tag: str = "") -> T:
        return parse(self.items[key])

    def describe(self, key: int) -> tuple[str, str, str]:
        meta = self.items[key].get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        return (str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                str(meta.get("resourceVersion") or ""))


@dataclass(frozen=True, slots=True)
class ManagementObjects:
    """The management cluster's objects a snapshot is built from."""

    deployments: ObjectSource
    machine_sets: ObjectSource
    control_planes: ObjectSource
    machines: ObjectSource
    nodeplans: ObjectSource
    fleet_upgrades: ObjectSource
    # k0smotron's K0sWorkerConfigTemplates (none where their CRD is not served)
    worker_templates: ObjectSource = Listed(KIND_WORKER_TEMPLATE)
    # k0smotron's hosted control planes, K0smotronControlPlane (none where not served)
    hosted_control_planes: ObjectSource = Listed(KIND_HOSTED_CP)
    # how many MachineDeployments (fleet-wide) reference each (namespace, template name);
    # None: count those in ``deployments``
    template_users: Mapping[tuple[str, str], int] | None = None


_bad: set[tuple[str, str, str, str]] = set()
UNREADABLE = (TypeError, ValueError, AttributeError, KeyError)


def readable_objects(source: ObjectSource, parser: Callable[[RawObject], T]
                     ) -> Iterator[T]:
    """Every object of ``source`` parsed; an object that cannot be understood is skipped
    (and logged once per version), never allowed to stop the planning of the whole
    fleet."""
    for key in source.object_keys():
        parsed = read_or_skip(source, key, parser)
        if parsed is not None:
            yield parsed


def read_or_skip(source: ObjectSource, key: Any, parser: Callable[[RawObject], T]
                 ) -> T | None:
    """One object of ``source`` parsed, or None (logged once per version) when it cannot
    be understood."""
    try:
        return source.parsed(key, parser)
    except UNREADABLE as e:
        bad = (source.kind, *source.describe(key))
        if bad not in _bad:
            _bad.add(bad)
            log.warning("ignoring %s %s/%s: cannot read it: %r", *bad[:3], e)
        return None


def watched_namespaces(config: FleetConfig) -> list[str]:
    """The management namespaces to watch: ``clusters.namespaces`` plus those of explicit
    ``clusters.entries`` (an entry is a member wherever it lives); empty means all."""
    namespaces = list(config.clusters.namespaces)
    for e in config.clusters.entries:
        if namespaces and e.namespace not in namespaces:
            namespaces.append(e.namespace)
    return namespaces


def custom_kubeconfig_secrets(config: FleetConfig) -> list[tuple[str, str]]:
    """(namespace, name) of kubeconfig Secrets set explicitly in clusters.entries."""
    return sorted({(e.namespace, e.kubeconfig_secret) for e in config.clusters.entries
                   if e.kubeconfig_secret})


def fleet_clusters(config: FleetConfig, clusters: Iterable[RawObject]
                   ) -> dict[ClusterKey, ClusterInfo]:
    """The CAPI Clusters that make up the fleet, with their effective settings."""
    out: dict[ClusterKey, ClusterInfo] = {}
    for obj in clusters:
        info = fleet_cluster(config, obj)
        if info is not None:
            out[(info.namespace, info.name)] = info
    return out


def fleet_cluster(config: FleetConfig, obj: RawObject) -> ClusterInfo | None:
    """One CAPI Cluster with its effective settings, or None when it is not in the fleet."""
    meta = obj.get("metadata") or {}
    ns, name = meta.get("namespace") or "", meta.get("name") or ""
    labels = meta.get("labels") or {}
    explicit = config.clusters.entry_for(ns, name) is not None
    namespaces = config.clusters.namespaces
    if not explicit and ((namespaces and ns not in namespaces)
                         or not config.clusters.selector.matches(labels)):
        return None
    settings = config.for_cluster(ns, name, labels)
    info = dataclasses.replace(cluster_from(obj, executor=settings.executor.value),
                               labels=dict(settings.labels))
    if settings.paused and not info.paused:
        info = dataclasses.replace(info, paused=True)
    return info


def cluster_nodes(nodes: Iterable[NodeRecord], control_nodes: Iterable[NodeRecord]
                  ) -> dict[str, NodeInfo]:
    """A workload cluster's Nodes, plus the ControlNodes of its pure controllers (from
    their records: :mod:`fleet.world.records`, where unreadable objects are already left out)."""
    out = {n.name: n.info for n in nodes}
    for cn in control_nodes:
        out.setdefault(cn.name, cn.info)  # a controller that also runs a kubelet has a Node
    return out


def fleet_upgrades(objects: ManagementObjects) -> list[FleetUpgradeInfo]:
    """The readable FleetUpgrades (upgrade intents)."""
    return list(readable_objects(objects.fleet_upgrades, fleet_upgrade_from))


def control_planes_needing_infra(objects: ManagementObjects,
                                 clusters: Mapping[ClusterKey, ClusterInfo]
                                 ) -> list[MachineInfo]:
    """Control-plane Machines whose eligibility depends on their infrastructure object."""
    intents = resolve(fleet_upgrades(objects), clusters)
    targets = {}
    for kcp in readable_objects(objects.control_planes, control_plane_from):
        targets[(kcp.ref.namespace, kcp.ref.name)] = target_of(
            kcp, intents.get((kcp.ref.namespace, kcp.cluster)))
    out = []
    for m in readable_objects(objects.machines, machine_from):
        if m.role != ROLE_CONTROLLER or m.owner is None or m.deleting:
            continue
        if (m.ref.namespace, m.cluster) not in clusters:
            continue
        target = targets.get((m.owner.namespace, m.owner.name))
        if target and not same_version(m.version, target):
            out.append(m)
    return out


class _FleetObject(Protocol):
    @property
    def ref(self) -> ObjectRef: ...
    @property
    def cluster(self) -> str: ...


F = TypeVar("F", bound=_FleetObject)


def _fleet_objects(source: ObjectSource, parser: Callable[[RawObject], F],
                   clusters: Mapping[ClusterKey, ClusterInfo]) -> dict[tuple[str, str], F]:
    """The readable objects of one kind that belong to a cluster of the fleet."""
    out: dict[tuple[str, str], F] = {}
    for parsed in readable_objects(source, parser):
        if (parsed.ref.namespace, parsed.cluster) in clusters:
            out[(parsed.ref.namespace, parsed.ref.name)] = parsed
    return out


def template_key(md: MachineDeploymentInfo) -> tuple[str, str] | None:
    """(namespace, name) of the MD's K0sWorkerConfigTemplate, if that is its bootstrap."""
    ref = md.bootstrap
    if ref is None or ref.kind != KIND_WORKER_TEMPLATE or ref.group != GROUP_BOOTSTRAP:
        return None
    return (md.ref.namespace, ref.name)


def with_worker_templates(objects: ManagementObjects,
                          deployments: Mapping[tuple[str, str], MachineDeploymentInfo]
                          ) -> dict[tuple[str, str], MachineDeploymentInfo]:
    """``deployments`` with the K0sWorkerConfigTemplate each references (when found),
    counting every MachineDeployment that references the same template."""
    users: Mapping[tuple[str, str], int]
    if objects.template_users is not None:
        users = objects.template_users
    else:
        counted: dict[tuple[str, str], int] = {}
        for md in readable_objects(objects.deployments, deployment_from):
            if (key := template_key(md)) is not None:
                counted[key] = counted.get(key, 0) + 1
        users = counted
    wanted = {k for md in deployments.values() if (k := template_key(md)) is not None}
    if not wanted:
        return dict(deployments)
    templates = {}
    source = objects.worker_templates
    for k in source.object_keys():
        key = source.describe(k)[:2]
        if key in wanted:
            info = read_or_skip(source, k, worker_template_from)
            if info is not None:
                templates[key] = dataclasses.replace(info, users=users.get(key, 1))
    out = {}
    for k, md in deployments.items():
        key = template_key(md)
        found = templates.get(key) if key is not None else None
        out[k] = dataclasses.replace(md, worker_template=found) if found else md
    return out


def build_snapshot(*, now: datetime, objects: ManagementObjects,
                   clusters: Mapping[ClusterKey, ClusterInfo],
                   nodes: Mapping[ClusterKey, Mapping[str, NodeInfo] | None],
                   infra: Mapping[tuple[str, str], InfraMachineInfo],
                   autopilot_plans: Mapping[ClusterKey, str],
                   catalog: ReleaseCatalog = EMPTY_CATALOG) -> Snapshot:
    """The snapshot of ``clusters``, each object's target set by the FleetUpgrade that
    covers its cluster. ``nodes``: each cluster's nodes, None when they cannot be seen;
    ``infra``: the infrastructure objects of the Machines
    :func:`control_planes_needing_infra` named, by (namespace, name);
    ``autopilot_plans``: clusters where an autopilot Plan still runs (its description)."""
    machines = {key: dataclasses.replace(m, infra=infra[key]) if key in infra else m
                for key, m in _fleet_objects(objects.machines, machine_from, clusters).items()}
    return apply_intents(Snapshot(
        now=now, clusters=dict(clusters),
        deployments=with_worker_templates(
            objects, _fleet_objects(objects.deployments, deployment_from, clusters)),
        machine_sets=_fleet_objects(objects.machine_sets, machine_set_from, clusters),
        control_planes={
            **_fleet_objects(objects.hosted_control_planes, hosted_control_plane_from,
                             clusters),
            **_fleet_objects(objects.control_planes, control_plane_from, clusters)},
        machines=machines,
        nodeplans=_fleet_objects(objects.nodeplans, nodeplan_from, clusters),
        nodes={key: nodes.get(key) for key in clusters},
        autopilot_plans={key: v for key, v in autopilot_plans.items() if key in clusters}),
        fleet_upgrades(objects), catalog)


def restrict(snapshot: Snapshot, keep: Collection[ClusterKey]) -> Snapshot:
    """``snapshot`` cut down to the clusters in ``keep`` (what one shard plans on); the
    FleetUpgrades stay (they are fleet-wide)."""
    def mine(o: Any) -> bool:
        return (o.ref.namespace, o.cluster) in keep

    return dataclasses.replace(
        snapshot,
        clusters={k: v for k, v in snapshot.clusters.items() if k in keep},
        deployments={k: v for k, v in snapshot.deployments.items() if mine(v)},
        machine_sets={k: v for k, v in snapshot.machine_sets.items() if mine(v)},
        control_planes={k: v for k, v in snapshot.control_planes.items() if mine(v)},
        machines={k: v for k, v in snapshot.machines.items() if mine(v)},
        nodeplans={k: v for k, v in snapshot.nodeplans.items() if mine(v)},
        other_nodeplans=frozenset(k for k, v in snapshot.nodeplans.items() if not mine(v)),
        nodes={k: v for k, v in snapshot.nodes.items() if k in keep},
        intents={k: v for k, v in snapshot.intents.items() if k in keep},
        autopilot_plans={k: v for k, v in snapshot.autopilot_plans.items() if k in keep},
        foreign=frozenset())
