"""Observe: watches on the management cluster, and the snapshot the planner decides on
(built by :func:`fleet.snapshot.build_snapshot` from the watch caches)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime

import anyio
import anyio.abc

from fleet.clusters import ClusterRegistry
from fleet.config import FleetConfig
from fleet.kube import KubeClient
from fleet.kube.cache import ObjectCache
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
    ClusterInfo,
    ClusterKey,
    InfraMachineInfo,
    NodeInfo,
    Snapshot,
    live_autopilot_plan,
)
from fleet.snapshot import ManagementObjects, build_snapshot, cluster_nodes

log = logging.getLogger(__name__)

WATCHED = (CLUSTERS, MACHINE_DEPLOYMENTS, MACHINE_SETS, MACHINES, K0S_CONTROL_PLANES,
           NODE_PLANS, SECRETS)
# Only CAPI's kubeconfig Secrets are cached (never every Secret of the namespace).
CAPI_SECRET_TYPE = "cluster.x-k8s.io/secret"
SECRET_FIELD_SELECTOR = f"type={CAPI_SECRET_TYPE}"


class ManagementView:
    """Caches of the management cluster's objects, kept current by Reflectors."""

    def __init__(self, client: KubeClient, *, namespaces: Iterable[str] = (),
                 on_change: Callable[[], None] | None = None, watch_timeout: int = 120,
                 intent_namespace: str | None = None,
                 extra_secrets: Iterable[tuple[str, str]] = ()) -> None:
        self.client = client
        self.namespaces: list[str | None] = list(namespaces) or [None]
        # FleetUpgrades live in the controller's own namespace (management.namespace).
        self.intent_namespace = intent_namespace
        self.caches = {res: ObjectCache(res.kind, on_change=on_change)
                       for res in (*WATCHED, FLEET_UPGRADES)}
        self.reflectors: list[Reflector] = []
        self.watch_timeout = watch_timeout
        # Kubeconfig Secrets named in the config (clusters.entries[].kubeconfigSecret):
        # they need not carry Cluster API's Secret type, so each gets its own watch.
        self.extra_secrets = sorted(set(extra_secrets))

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
            for ns, name in self.extra_secrets:
                r = Reflector(self.client, SECRETS, namespace=ns,
                              listener=self.caches[SECRETS].on_event,
                              field_selector=f"metadata.name={name}",
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


def kubeconfig_secrets(config: FleetConfig, clusters: Iterable[ClusterKey]
                       ) -> dict[ClusterKey, str]:
    return {key: config.for_cluster(key[0], key[1]).kubeconfig_secret for key in clusters}


def management_objects(view: ManagementView) -> ManagementObjects:
    return ManagementObjects(
        deployments=view[MACHINE_DEPLOYMENTS], machine_sets=view[MACHINE_SETS],
        control_planes=view[K0S_CONTROL_PLANES], machines=view[MACHINES],
        nodeplans=view[NODE_PLANS], fleet_upgrades=view[FLEET_UPGRADES])


def workload_nodes(registry: ClusterRegistry, key: ClusterKey) -> dict[str, NodeInfo] | None:
    """The cluster's Nodes (and ControlNodes); None when not known: never listed, or its
    API server has not answered for the registry's bound (a stale cache is not used)."""
    wc = registry.get(key)
    if wc is None or not wc.observed or registry.unreachable(key) is not None:
        return None
    return cluster_nodes(wc.nodes, wc.control_nodes)


def snapshot_of(*, now: datetime, view: ManagementView, registry: ClusterRegistry,
                clusters: Mapping[ClusterKey, ClusterInfo],
                infra: Mapping[tuple[str, str], InfraMachineInfo]) -> Snapshot:
    """The snapshot the controller plans on, from its watch caches."""
    autopilot: dict[ClusterKey, str] = {}
    for key in clusters:
        wc = registry.get(key)
        if wc is not None and (live := live_autopilot_plan(wc.plans)) is not None:
            autopilot[key] = live
    infos = dict(clusters)
    for key, info in clusters.items():
        wc = registry.get(key)
        down = registry.unreachable(key)
        if wc is not None:
            infos[key] = dataclasses.replace(
                info, acting_since=wc.watching_since,
                unreachable_since=down[0] if down else None,
                unreachable_error=down[1] if down else "")
    return build_snapshot(now=now, objects=management_objects(view), clusters=infos,
                          nodes={key: workload_nodes(registry, key) for key in clusters},
                          infra=infra, autopilot_plans=autopilot)
