"""Observe: watches on the management cluster, and the snapshot the planner decides on."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Protocol, TypeVar

import anyio
import anyio.abc

from fleet.clusters import ClusterRegistry
from fleet.config import FleetConfig
from fleet.controllers.cache import ObjectCache
from fleet.intent import apply_intents, fleet_upgrade_from, resolve
from fleet.kube import KubeClient, KubeObject
from fleet.kube.resources import (
    CLUSTERS,
    FLEET_UPGRADES,
    K0S_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    SECRETS,
    Resource,
)
from fleet.kube.watch import Reflector
from fleet.model import (
    KIND_CONTROL_NODE,
    KIND_NODE,
    ROLE_CONTROLLER,
    ClusterInfo,
    ClusterKey,
    FleetUpgradeInfo,
    InfraMachineInfo,
    MachineInfo,
    NodeInfo,
    ObjectRef,
    Snapshot,
    cluster_from,
    control_plane_from,
    deployment_from,
    live_autopilot_plan,
    machine_from,
    machine_set_from,
    node_from,
    nodeplan_from,
)
from fleet.versions import same_version

log = logging.getLogger(__name__)

WATCHED = (CLUSTERS, MACHINE_DEPLOYMENTS, MACHINE_SETS, MACHINES, K0S_CONTROL_PLANES,
           NODE_PLANS, SECRETS)
# Only CAPI's kubeconfig Secrets are cached (never every Secret of the namespace).
SECRET_FIELD_SELECTOR = "type=cluster.x-k8s.io/secret"


class ManagementView:
    """Caches of the management cluster's objects, kept current by Reflectors."""

    def __init__(self, client: KubeClient, *, namespaces: Iterable[str] = (),
                 on_change: Callable[[], None] | None = None, watch_timeout: int = 120,
                 intent_namespace: str | None = None) -> None:
        self.client = client
        self.namespaces: list[str | None] = list(namespaces) or [None]
        # FleetUpgrades live in the controller's own namespace (management.namespace).
        self.intent_namespace = intent_namespace
        self.caches = {res: ObjectCache(res.kind, on_change=on_change)
                       for res in (*WATCHED, FLEET_UPGRADES)}
        self.reflectors: list[Reflector] = []
        self.watch_timeout = watch_timeout

    def __getitem__(self, res: Resource) -> ObjectCache:
        return self.caches[res]

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        async with anyio.create_task_group() as tg:
            for res in WATCHED:
                for ns in self.namespaces:
                    r = Reflector(
                        self.client, res, namespace=ns, listener=self.caches[res].on_event,
                        field_selector=SECRET_FIELD_SELECTOR if res is SECRETS else None,
                        watch_timeout=self.watch_timeout)
                    self.reflectors.append(r)
                    tg.start_soon(r.run)
            if self.intent_namespace is not None:
                r = Reflector(self.client, FLEET_UPGRADES, namespace=self.intent_namespace,
                              listener=self.caches[FLEET_UPGRADES].on_event,
                              watch_timeout=self.watch_timeout)
                self.reflectors.append(r)
                tg.start_soon(r.run)
            for r in self.reflectors:
                await r.synced.wait()
            for cache in self.caches.values():
                cache.mark_synced()
            task_status.started()

    @property
    def requests(self) -> int:
        """List requests made by the watches (relists), for the benchmarks."""
        return sum(r.relists for r in self.reflectors)


def fleet_clusters(config: FleetConfig, clusters: Iterable[KubeObject]
                   ) -> dict[ClusterKey, ClusterInfo]:
    """The CAPI Clusters that make up the fleet, with their effective settings."""
    selector = config.clusters.selector
    namespaces = set(config.clusters.namespaces)
    out: dict[ClusterKey, ClusterInfo] = {}
    for obj in clusters:
        meta = obj.get("metadata") or {}
        ns, name = meta.get("namespace") or "", meta.get("name") or ""
        labels = meta.get("labels") or {}
        explicit = config.clusters.entry_for(ns, name) is not None
        if not explicit and ((namespaces and ns not in namespaces)
                             or not selector.matches(labels)):
            continue
        settings = config.for_cluster(ns, name, labels)
        info = dataclasses.replace(cluster_from(obj, executor=settings.executor.value),
                                   labels=dict(settings.labels))
        if settings.paused and not info.paused:
            info = dataclasses.replace(info, paused=True)
        out[(ns, name)] = info
    return out


def kubeconfig_secrets(config: FleetConfig, clusters: Iterable[ClusterKey]
                       ) -> dict[ClusterKey, str]:
    return {key: config.for_cluster(key[0], key[1]).kubeconfig_secret for key in clusters}


def _as_node(obj: KubeObject) -> NodeInfo:
    return node_from({**obj, "kind": KIND_NODE})


def _as_control_node(obj: KubeObject) -> NodeInfo:
    return node_from({**obj, "kind": KIND_CONTROL_NODE})


def workload_nodes(registry: ClusterRegistry, key: ClusterKey) -> dict[str, NodeInfo] | None:
    wc = registry.get(key)
    if wc is None or not wc.observed:
        return None
    nodes = {n.name: n for n in (_parse(wc.nodes, o, _as_node) for o in wc.nodes)
             if n is not None}
    for obj in wc.control_nodes:
        cn = _parse(wc.control_nodes, obj, _as_control_node)
        if cn is not None:
            nodes.setdefault(cn.name, cn)  # a controller that also runs a kubelet has a Node
    return nodes


def fleet_upgrades(view: ManagementView) -> list[FleetUpgradeInfo]:
    cache = view[FLEET_UPGRADES]
    return [u for u in (_parse(cache, o, fleet_upgrade_from) for o in cache) if u is not None]


def control_planes_needing_infra(view: ManagementView, clusters: Mapping[ClusterKey, ClusterInfo]
                                 ) -> list[MachineInfo]:
    """Control-plane Machines whose eligibility depends on their infrastructure object."""
    intents = resolve(fleet_upgrades(view), clusters)
    targets = {}
    for obj in view[K0S_CONTROL_PLANES]:
        kcp = _parse(view[K0S_CONTROL_PLANES], obj, control_plane_from)
        if kcp is None:
            continue
        intent = intents.get((kcp.ref.namespace, kcp.cluster))
        targets[(kcp.ref.namespace, kcp.ref.name)] = intent.version if intent else kcp.version
    out = []
    for obj in view[MACHINES]:
        m = _parse(view[MACHINES], obj, machine_from)
        if m is None:
            continue
        if m.role != ROLE_CONTROLLER or m.owner is None or m.deleting:
            continue
        if (m.ref.namespace, m.cluster) not in clusters:
            continue
        target = targets.get((m.owner.namespace, m.owner.name))
        if target and not same_version(m.version, target):
            out.append(m)
    return out


T = TypeVar("T")
_bad: set[tuple[str, str, str, str]] = set()


def _parse(cache: ObjectCache, obj: KubeObject, parser: Callable[[KubeObject], T]) -> T | None:
    """Parse one object; an object that cannot be understood is skipped (and logged once
    per version), never allowed to stop the planning of the whole fleet."""
    try:
        return cache.parsed(obj, parser)
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        meta = obj.get("metadata") or {}
        key = (cache.kind, str(meta.get("namespace")), str(meta.get("name")),
               str(meta.get("resourceVersion")))
        if key not in _bad:
            _bad.add(key)
            log.warning("ignoring %s %s/%s: cannot read it: %r", *key[:3], e)
        return None


class _FleetObject(Protocol):
    @property
    def ref(self) -> ObjectRef: ...
    @property
    def cluster(self) -> str: ...


F = TypeVar("F", bound=_FleetObject)


def _fleet_objects(cache: ObjectCache, parser: Callable[[KubeObject], F],
                   clusters: Mapping[ClusterKey, ClusterInfo]) -> dict[tuple[str, str], F]:
    """The readable objects of one kind that belong to a cluster of the fleet."""
    out: dict[tuple[str, str], F] = {}
    for obj in cache:
        parsed = _parse(cache, obj, parser)
        if parsed is not None and (parsed.ref.namespace, parsed.cluster) in clusters:
            out[(parsed.ref.namespace, parsed.ref.name)] = parsed
    return out


def build_snapshot(*, now: datetime, view: ManagementView, registry: ClusterRegistry,
                   clusters: Mapping[ClusterKey, ClusterInfo],
                   infra: Mapping[tuple[str, str], InfraMachineInfo]) -> Snapshot:
    deployments = _fleet_objects(view[MACHINE_DEPLOYMENTS], deployment_from, clusters)
    machine_sets = _fleet_objects(view[MACHINE_SETS], machine_set_from, clusters)
    control_planes = _fleet_objects(view[K0S_CONTROL_PLANES], control_plane_from, clusters)
    machines = {key: dataclasses.replace(m, infra=infra[key]) if key in infra else m
                for key, m in _fleet_objects(view[MACHINES], machine_from, clusters).items()}
    nodeplans = _fleet_objects(view[NODE_PLANS], nodeplan_from, clusters)
    nodes = {key: workload_nodes(registry, key) for key in clusters}
    autopilot: dict[ClusterKey, str] = {}
    for key in clusters:
        wc = registry.get(key)
        if wc is not None and (live := live_autopilot_plan(wc.plans)) is not None:
            autopilot[key] = live
    return apply_intents(
        Snapshot(now=now, clusters=dict(clusters), deployments=deployments,
                 machine_sets=machine_sets, control_planes=control_planes,
                 machines=machines, nodeplans=nodeplans, nodes=nodes,
                 autopilot_plans=autopilot),
        fleet_upgrades(view))
