"""The controller's snapshot, kept per cluster and rebuilt where something moved.

Every change the watches (or the controller's own writes) bring is traced to the cluster
it belongs to: a management object by the cluster it names (parsed with the snapshot's
own parsers, memoised per resourceVersion, so the rebuild reuses the parse), a workload
object by the cluster it came from (:meth:`fleet.world.clusters.ClusterRegistry.changed`).
That cluster is *dirty*; a pass rebuilds the snapshot part of the dirty clusters only
(:func:`fleet.world.snapshot.build_snapshot` over just their objects) and keeps every other
part as the same object, which is what :class:`fleet.planner.incremental.IncrementalPlanner`
and the rollout's progress memo key on. A change that cannot be traced to one cluster
(a FleetUpgrade, a cache that re-synced) makes every cluster dirty.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from fleet.config.models import FleetConfig
from fleet.kube import KubeObject
from fleet.kube.cache import ObjectCache
from fleet.kube.resources import (
    CLUSTERS,
    FLEET_UPGRADES,
    K0S_CONTROL_PLANES,
    K0S_WORKER_CONFIG_TEMPLATES,
    K0SMOTRON_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    SECRETS,
    Resource,
)
from fleet.kube.watch import ObjectKey, object_key
from fleet.planner.incremental import OtherNodePlans
from fleet.world.clusters import ClusterRegistry
from fleet.world.intent import fleet_upgrade_from, resolve
from fleet.world.model import (
    ClusterInfo,
    ClusterKey,
    FleetUpgradeInfo,
    InfraMachineInfo,
    MachineInfo,
    Snapshot,
    control_plane_from,
    deployment_from,
    hosted_control_plane_from,
    machine_from,
    machine_set_from,
    nodeplan_from,
)
from fleet.world.records import live_autopilot_plan
from fleet.world.snapshot import (
    Listed,
    ManagementObjects,
    build_snapshot,
    cluster_nodes,
    control_planes_needing_infra,
    fleet_cluster,
    readable_objects,
    template_key,
)

T = TypeVar("T")

CAPI_CLUSTER_LABEL = "cluster.x-k8s.io/cluster-name"
_PARSERS: dict[Resource, Callable[[KubeObject], Any]] = {
    MACHINE_DEPLOYMENTS: deployment_from, MACHINE_SETS: machine_set_from,
    K0S_CONTROL_PLANES: control_plane_from, MACHINES: machine_from, NODE_PLANS: nodeplan_from,
    K0SMOTRON_CONTROL_PLANES: hosted_control_plane_from,
}


@dataclass(frozen=True, slots=True)
class _Subset:
    """The objects of one cache that belong to one cluster (an ObjectSource)."""

    cache: ObjectCache
    members: frozenset[ObjectKey]

    @property
    def kind(self) -> str:
        return self.cache.kind

    def __iter__(self) -> Iterator[KubeObject]:
        for ns, name in self.object_keys():
            obj = self.cache.get(name, ns)
            if obj is not None:
                yield obj

    def object_keys(self) -> list[ObjectKey]:
        return sorted(k for k in self.members if k in self.cache)

    def parsed(self, key: ObjectKey, parse: Callable[[KubeObject], T], tag: str = "") -> T:
        return self.cache.parsed(key, parse, tag)

    def describe(self, key: ObjectKey) -> tuple[str, str, str]:
        return self.cache.describe(key)


class FleetParts:
    """Per-cluster snapshot parts, the dirty set, and the index that feeds it."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.catalog = config.download.catalog()
        self.caches: Mapping[Resource, ObjectCache] = {}
        self.registry: ClusterRegistry | None = None
        self.parts: dict[ClusterKey, Snapshot] = {}
        self.members: dict[ClusterKey, ClusterInfo] = {}
        self.dirty: set[ClusterKey] = set()
        # parts set or dropped since the last take_moved (the merge's log)
        self.moved: set[ClusterKey] = set()
        # Members another replica acts on (or not heard from yet): their parts are marked
        # foreign (judged from the management objects by the fleet rollout).
        self.foreign: frozenset[ClusterKey] = frozenset()
        # What a foreign part is kept as (the rollout policy's
        # fleet.rollout.progress.foreign_digest: its progress instead of its objects),
        # given the part and the strings to name its Machines by; None: kept whole.
        self.digest: Callable[[Snapshot, Mapping[str, str]], Snapshot] | None = None
        self.everything = True  # the next pass rebuilds every part
        self.membership_changed = True  # Clusters or kubeconfig Secrets moved
        self._where: dict[Resource, dict[ObjectKey, ClusterKey]] = {r: {} for r in _PARSERS}
        self._cluster_keys: dict[ClusterKey, ClusterKey] = {}  # the one tuple of each
        # per cluster its objects' keys, as a tuple (a set of one or ten keys costs three
        # to five times as much, for each of thousands of clusters; rebuilt on change)
        self._index: dict[Resource, dict[ClusterKey, tuple[ObjectKey, ...]]] = {
            r: {} for r in _PARSERS}
        # Sharded (set by the controller): the clusters Secrets name by label are
        # remembered, for the clusters of a taken shard (known_clusters).
        self.sharded = False
        self._secret_clusters: set[ClusterKey] = set()
        self.rebuilt = 0  # parts built, over the controller's life (metrics)
        # MD -> (its K0sWorkerConfigTemplate, its cluster); per template, the clusters whose
        # MDs reference it and how many MDs (a template's change dirties those clusters)
        self._md_template: dict[ObjectKey, tuple[ObjectKey, ClusterKey]] = {}
        self._template_users: dict[ObjectKey, dict[ClusterKey, int]] = {}
        # The FleetUpgrades as last read, and what of them the planner reads (all but
        # their status, which the rollout policy writes: a status write must not rebuild
        # and re-plan the whole fleet).
        self.upgrades: dict[tuple[str, str], FleetUpgradeInfo] = {}
        self.upgrades_moved = True
        self._planned_upgrades: list[FleetUpgradeInfo] | None = None

    def attach(self, caches: Mapping[Resource, ObjectCache], registry: ClusterRegistry) -> None:
        self.caches, self.registry = caches, registry

    # -- what moved ---------------------------------------------------------------------
    def touch(self, key: ClusterKey) -> None:
        self.dirty.add(key)

    def touch_all(self) -> None:
        self.everything = True

    def listener(self, res: Resource) -> Callable[[KubeObject | None], None]:
        """The ObjectCache ``on_object`` hook for one management resource."""
        return lambda obj: self.object_changed(res, obj)

    def object_changed(self, res: Resource, obj: KubeObject | None) -> None:
        if obj is None:
            self.everything = self.membership_changed = True
            if res is FLEET_UPGRADES:
                self.upgrades_moved = True
            return
        if res is FLEET_UPGRADES:
            self.upgrades_moved = True  # every part, if more than its status moved
            return
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "")
        if res is CLUSTERS:
            self.membership_changed = True
            self.dirty.add((namespace, str(meta.get("name") or "")))
            return
        if res is SECRETS:
            self.membership_changed = True
            cluster = (meta.get("labels") or {}).get(CAPI_CLUSTER_LABEL)
            if cluster:
                ckey = (namespace, str(cluster))
                ckey = self._cluster_keys.setdefault(ckey, ckey)
                self.dirty.add(ckey)
                if self.sharded:
                    self._secret_clusters.add(ckey)
            return
        if res is K0S_WORKER_CONFIG_TEMPLATES:
            self.dirty.update(self._template_users.get(object_key(obj), {}))
            return
        parse = _PARSERS.get(res)
        if parse is None:
            self.everything = True
            return
        key = object_key(obj)
        cache = self.caches.get(res)
        if cache is not None and cache.changed_key == key:
            key = cache.changed_key  # the cache's tuple, not one more per object
        present = cache is not None and key in cache
        cluster_key: ClusterKey | None = None
        if present and cache is not None:
            try:
                cluster_key = (namespace, str(cache.parsed_object(obj, parse).cluster))
                # one tuple per cluster, not one per object naming it
                cluster_key = self._cluster_keys.setdefault(cluster_key, cluster_key)
            except (TypeError, ValueError, AttributeError, KeyError):
                cluster_key = None  # unreadable: the snapshot skips it too
        where, index = self._where[res], self._index[res]
        old = where.get(key)
        if old is not None and old != cluster_key:
            keys = index.get(old)
            if keys is not None:
                left = tuple(k for k in keys if k != key)
                if left:
                    index[old] = left
                else:
                    del index[old]
            del where[key]
            self.dirty.add(old)
        if cluster_key is not None:
            where[key] = cluster_key
            keys = index.get(cluster_key, ())
            if key not in keys:
                index[cluster_key] = (*keys, key)
            self.dirty.add(cluster_key)
        if res is MACHINE_DEPLOYMENTS and cache is not None:
            self._index_template(key, cache.parsed_object(obj, parse) if cluster_key else None,
                                 cluster_key)

    def _index_template(self, key: ObjectKey, md: Any, cluster: ClusterKey | None) -> None:
        old = self._md_template.pop(key, None)
        if old is not None:
            users = self._template_users.get(old[0], {})
            users[old[1]] = users.get(old[1], 1) - 1
            if users[old[1]] <= 0:
                del users[old[1]]
            if not users:
                self._template_users.pop(old[0], None)
            else:
                self.dirty.update(users)  # their count of the template's users changed
        tkey = template_key(md) if md is not None and cluster is not None else None
        if tkey is not None and cluster is not None:
            self._md_template[key] = (tkey, cluster)
            users = self._template_users.setdefault(tkey, {})
            users[cluster] = users.get(cluster, 0) + 1
            self.dirty.update(users)

    def known_clusters(self) -> set[ClusterKey]:
        """The fleet's clusters and those any Machine or Cluster API Secret names (a cluster
        may have them before its Cluster object is seen or selected)."""
        return set(self.members) | set(self._index[MACHINES]) | self._secret_clusters

    def machine_keys(self, key: ClusterKey) -> set[ObjectKey]:
        """The cached Machines of one cluster."""
        return set(self._index[MACHINES].get(key, ()))

    def object_keys(self, res: Resource, key: ClusterKey) -> set[ObjectKey]:
        """The cached objects of ``res`` (a kind parsed per cluster) of one cluster."""
        return set(self._index[res].get(key, ()))

    # -- the parts ----------------------------------------------------------------------
    def refresh_members(self) -> dict[ClusterKey, ClusterInfo]:
        """The fleet's clusters (re-read only when Clusters or Secrets moved)."""
        if self.membership_changed:
            members: dict[ClusterKey, ClusterInfo] = {}
            for obj in self.caches[CLUSTERS]:
                info = fleet_cluster(self.config, obj)
                if info is not None:
                    # label and annotation keys repeat across the fleet: one string each;
                    # its key is the one tuple of the cluster (and names it)
                    key = (info.namespace, info.name)
                    key = self._cluster_keys.setdefault(key, key)
                    info = dataclasses.replace(
                        info, namespace=key[0], name=key[1],
                        labels={sys.intern(k): v for k, v in info.labels.items()},
                        annotations={sys.intern(k): v for k, v in info.annotations.items()})
                    members[key] = info
            self.members = members
            self.membership_changed = False
        self.refresh_upgrades()
        return self.members

    def refresh_upgrades(self) -> None:
        """Re-read the FleetUpgrades after one moved. A status write rebuilds no part;
        when more changed (version, selector, creation, deletion, ...), the parts of the
        clusters whose intent (the FleetUpgrade that decides their version, and the
        version) is not what their part was built with are rebuilt, not the fleet's: a
        FleetUpgrade for a few clusters re-planned all 1000 in one pass of ~1 s."""
        if not self.upgrades_moved:
            return
        self.upgrades_moved = False
        infos = list(readable_objects(self.caches[FLEET_UPGRADES], fleet_upgrade_from))
        self.upgrades = {(u.ref.namespace, u.ref.name): u for u in infos}
        planned = sorted((dataclasses.replace(u, status={}, resource_version="") for u in infos),
                         key=lambda u: (u.ref.namespace, u.ref.name))
        if planned == self._planned_upgrades:
            return
        self._planned_upgrades = planned
        if self.everything:
            return
        intents = resolve(planned, self.members)
        for key in self.members:
            part = self.parts.get(key)
            if part is None or part.intents.get(key) != intents.get(key):
                self.dirty.add(key)

    def take_dirty(self) -> set[ClusterKey]:
        """The member clusters to rebuild now (and forget the rest of the dirty set)."""
        dirty = set(self.members) if self.everything else self.dirty & set(self.members)
        self.dirty = set()
        self.everything = False
        for gone in set(self.parts) - set(self.members):
            del self.parts[gone]
            self.moved.add(gone)
            self._cluster_keys.pop(gone, None)
        return dirty

    def take_moved(self) -> set[ClusterKey]:
        """The clusters whose part was set or dropped since the last call (what a merge
        of :attr:`parts` needs to look at: fleet.planner.incremental.Merger)."""
        moved, self.moved = self.moved, set()
        return moved

    def objects(self, key: ClusterKey) -> ManagementObjects:
        """The management objects of one cluster."""
        def subset(res: Resource) -> _Subset:
            return _Subset(self.caches[res], frozenset(self._index[res].get(key, ())))
        hosted = self.caches.get(K0SMOTRON_CONTROL_PLANES)
        templates = self.caches.get(K0S_WORKER_CONFIG_TEMPLATES)
        wanted = {found[0] for md in self._index[MACHINE_DEPLOYMENTS].get(key, ())
                  if (found := self._md_template.get(md)) is not None}
        return ManagementObjects(
            deployments=subset(MACHINE_DEPLOYMENTS), machine_sets=subset(MACHINE_SETS),
            control_planes=subset(K0S_CONTROL_PLANES), machines=subset(MACHINES),
            nodeplans=subset(NODE_PLANS), fleet_upgrades=self.caches[FLEET_UPGRADES],
            worker_templates=_Subset(templates, frozenset(wanted)) if templates is not None
            else Listed(K0S_WORKER_CONFIG_TEMPLATES.kind),
            template_users={t: sum(self._template_users[t].values()) for t in wanted},
            hosted_control_planes=subset(K0SMOTRON_CONTROL_PLANES) if hosted is not None
            else Listed(K0SMOTRON_CONTROL_PLANES.kind))

    def info(self, key: ClusterKey) -> ClusterInfo:
        """The member's ClusterInfo, with its workload API server's outage if any."""
        info = self.members[key]
        assert self.registry is not None
        wc = self.registry.get(key)
        if wc is not None:
            down = self.registry.unreachable(key)
            info = dataclasses.replace(
                info, acting_since=wc.watching_since,
                unreachable_since=down[0] if down else None,
                unreachable_error=down[1] if down else "")
        return info

    def needing_infra(self, keys: Iterable[ClusterKey]) -> list[MachineInfo]:
        out: list[MachineInfo] = []
        for key in keys:
            out += control_planes_needing_infra(self.objects(key), {key: self.members[key]})
        return out

    def rebuild(self, keys: Iterable[ClusterKey], now: datetime,
                infra: Mapping[tuple[str, str], InfraMachineInfo]) -> None:
        """Build the parts of ``keys`` afresh from the caches."""
        registry = self.registry
        assert registry is not None
        for key in keys:
            wc = registry.get(key)
            nodes = None
            autopilot: dict[ClusterKey, str] = {}
            if wc is not None:
                if wc.observed and registry.unreachable(key) is None:
                    nodes = cluster_nodes(wc.nodes, wc.control_nodes)
                if (live := live_autopilot_plan(wc.plans)) is not None:
                    autopilot[key] = live
            part = build_snapshot(
                now=now, objects=self.objects(key), clusters={key: self.info(key)},
                nodes={key: nodes}, infra=infra, autopilot_plans=autopilot,
                catalog=self.catalog)
            part = dataclasses.replace(
                part, other_nodeplans=OtherNodePlans(self._where[NODE_PLANS], key),
                foreign=frozenset({key}) if key in self.foreign else frozenset())
            # Another replica's cluster: its rollout progress, not its objects, is kept
            # (naming its Machines by the strings the caches' keys hold anyway).
            if key in self.foreign and self.digest is not None:
                part = self.digest(part, {k[1]: k[1] for k in self._index[MACHINES].get(key, ())})
            self.parts[key] = part
            self.moved.add(key)
            self.rebuilt += 1


__all__ = ["FleetParts"]
