"""One-shot, read-only observation of the fleet, for ``k0s-fleet plan`` and ``status``.

Lists the Cluster API objects and NodePlans of the management cluster, reads each
workload cluster's Nodes through its kubeconfig Secret, and returns the same
:class:`~fleet.model.Snapshot` the controller plans on, plus each Cluster's labels and
annotations for the wave gate. Nothing is written anywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from fleet.clusters import KubeconfigSecretError, kubeconfig_from_secret
from fleet.config import FleetConfig
from fleet.controllers.infra import InfraMachines
from fleet.controllers.observe import fleet_clusters
from fleet.intent import apply_intents, fleet_upgrade_from
from fleet.kube import KubeClient, KubeError, NotFoundError
from fleet.kube.resources import (
    AUTOPILOT_PLANS,
    CLUSTERS,
    CONFIGMAPS,
    CONTROL_NODES,
    FLEET_UPGRADES,
    K0S_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    NODES,
    SECRETS,
    Resource,
)
from fleet.model import (
    ROLE_CONTROLLER,
    ClusterInfo,
    ClusterKey,
    MachineInfo,
    NodeInfo,
    Snapshot,
    control_plane_from,
    deployment_from,
    live_autopilot_plan,
    machine_from,
    machine_set_from,
    node_from,
    nodeplan_from,
)
from fleet.rollout.annotations import ROLLOUT_CONFIGMAP, STATE_KEY
from fleet.rollout.gate import FleetControls
from fleet.rollout.state import RolloutState

log = logging.getLogger(__name__)

ClusterMeta = tuple[Mapping[str, str], Mapping[str, str]]


@dataclass
class Observation:
    snapshot: Snapshot
    meta: Mapping[ClusterKey, ClusterMeta] = field(default_factory=dict)
    controls: FleetControls = field(default_factory=FleetControls)
    state: RolloutState = field(default_factory=RolloutState)
    problems: dict[ClusterKey, str] = field(default_factory=dict)  # unreachable clusters


async def management_client(config: FleetConfig) -> KubeClient:
    m = config.management
    if m.kubeconfig:
        return await KubeClient.from_kubeconfig_file(m.kubeconfig, name="management",
                                                     context=m.context)
    try:
        return KubeClient.in_cluster(name="management")
    except Exception as e:  # kubernetes_asyncio's ConfigException, not one of ours
        raise ValueError("no management kubeconfig: pass --kubeconfig or set "
                         f"management.kubeconfig (not running in a cluster: {e})") from None


async def _list(client: KubeClient, res: Resource, namespaces: list[str]) -> list[dict[str, Any]]:
    if not namespaces:
        return (await client.list(res)).items
    out: list[dict[str, Any]] = []
    for ns in namespaces:
        out.extend((await client.list(res, ns)).items)
    return out


async def workload_client(mgmt: KubeClient, config: FleetConfig, namespace: str,
                          name: str) -> KubeClient:
    secret_name = config.for_cluster(namespace, name).kubeconfig_secret
    secret = await mgmt.get(SECRETS, secret_name, namespace)
    return await KubeClient.from_kubeconfig(kubeconfig_from_secret(secret), name=name)


async def _nodes(mgmt: KubeClient, config: FleetConfig, key: ClusterKey,
                 timeout: float) -> tuple[dict[str, NodeInfo], str | None]:
    """The cluster's Nodes (and ControlNodes), and a still running autopilot Plan."""
    with anyio.fail_after(timeout):
        async with await workload_client(mgmt, config, *key) as wl:
            nodes = {n.name: n for n in map(node_from, (await wl.list(NODES)).items)}
            plan: str | None = None
            try:
                for obj in (await wl.list(CONTROL_NODES)).items:
                    cn = node_from(obj)
                    nodes.setdefault(cn.name, cn)
                plan = live_autopilot_plan((await wl.list(AUTOPILOT_PLANS)).items)
            except KubeError:
                pass  # no autopilot CRD: no pure controllers, no Plans to see
            return nodes, plan


async def observe(mgmt: KubeClient, config: FleetConfig, *, now: datetime | None = None,
                  node_timeout: float = 10.0) -> Observation:
    """Read the whole fleet once."""
    namespaces = list(config.clusters.namespaces)
    for e in config.clusters.entries:
        if namespaces and e.namespace not in namespaces:
            namespaces.append(e.namespace)
    all_clusters = await _list(mgmt, CLUSTERS, namespaces)
    # The same fleet membership and per-cluster settings the controller plans with.
    clusters: dict[ClusterKey, ClusterInfo] = fleet_clusters(config, all_clusters)
    keys = set(clusters)
    meta: dict[ClusterKey, ClusterMeta] = {}
    for c in all_clusters:
        m = c["metadata"]
        key = (m.get("namespace") or "", m["name"])
        if key in keys:
            meta[key] = (dict(m.get("labels") or {}), dict(m.get("annotations") or {}))

    def mine(objs: list[dict[str, Any]], cluster_of: Any) -> list[dict[str, Any]]:
        return [o for o in objs if ((o["metadata"].get("namespace") or ""), cluster_of(o))
                in keys]

    deployments = [deployment_from(o) for o in await _list(mgmt, MACHINE_DEPLOYMENTS, namespaces)]
    machine_sets = [machine_set_from(o) for o in await _list(mgmt, MACHINE_SETS, namespaces)]
    kcps = [control_plane_from(o) for o in await _list(mgmt, K0S_CONTROL_PLANES, namespaces)]
    raw_machines = mine(await _list(mgmt, MACHINES, namespaces),
                        lambda o: (o.get("spec") or {}).get("clusterName"))
    infra = InfraMachines(mgmt)
    machines: list[MachineInfo] = []
    for o in raw_machines:
        m = machine_from(o)
        if m.role == ROLE_CONTROLLER:
            m = machine_from(o, await infra.lookup(m.infrastructure, m.ref.namespace))
        machines.append(m)
    plans = [nodeplan_from(o) for o in await _list(mgmt, NODE_PLANS, namespaces)]

    nodes: dict[ClusterKey, Mapping[str, NodeInfo] | None] = {}
    autopilot: dict[ClusterKey, str] = {}
    problems: dict[ClusterKey, str] = {}
    for key in sorted(keys):
        try:
            nodes[key], plan = await _nodes(mgmt, config, key, node_timeout)
            if plan is not None:
                autopilot[key] = plan
        except (KubeError, KubeconfigSecretError, TimeoutError) as e:
            nodes[key] = None
            problems[key] = f"workload cluster unreachable: {e!r}"[:300]

    controls, state = FleetControls(), RolloutState()
    cm = await mgmt.get_or_none(CONFIGMAPS, ROLLOUT_CONFIGMAP, config.management.namespace)
    if cm is not None:
        controls = FleetControls.from_annotations(
            (cm.get("metadata") or {}).get("annotations") or {})
        state = RolloutState.from_json((cm.get("data") or {}).get(STATE_KEY))

    snapshot = Snapshot(
        now=now or datetime.now(UTC), clusters=clusters,
        deployments={(d.ref.namespace, d.ref.name): d for d in deployments
                     if (d.ref.namespace, d.cluster) in keys},
        machine_sets={(s.ref.namespace, s.ref.name): s for s in machine_sets
                      if (s.ref.namespace, s.cluster) in keys},
        control_planes={(k.ref.namespace, k.ref.name): k for k in kcps
                        if (k.ref.namespace, k.cluster) in keys},
        machines={(m.ref.namespace, m.ref.name): m for m in machines},
        nodeplans={(p.ref.namespace, p.ref.name): p for p in plans
                   if (p.ref.namespace, p.cluster) in keys},
        nodes=nodes, autopilot_plans=autopilot)
    try:
        upgrades = [fleet_upgrade_from(o) for o in (
            await mgmt.list(FLEET_UPGRADES, config.management.namespace)).items]
    except NotFoundError:
        upgrades = []  # the FleetUpgrade CRD is not installed: no intents
    snapshot = apply_intents(snapshot, upgrades)
    return Observation(snapshot=snapshot, meta=meta, controls=controls, state=state,
                       problems=problems)
