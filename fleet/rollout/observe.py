"""One-shot, read-only observation of the fleet, for ``k0s-fleet plan`` and ``status``.

Lists the Cluster API objects and NodePlans of the management cluster, reads each
workload cluster's Nodes through its kubeconfig Secret, and returns the same
:class:`~fleet.world.model.Snapshot` the controller plans on (built by the same
:func:`fleet.world.snapshot.build_snapshot`), plus the fleet's rollout controls and state.
Nothing is written anywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from fleet.config.models import FleetConfig
from fleet.controllers.infra import InfraMachines
from fleet.kube import KubeClient, KubeError, KubeObject, NotFoundError
from fleet.kube.resources import (
    AUTOPILOT_PLANS,
    CLUSTERS,
    CONFIGMAPS,
    CONTROL_NODES,
    FLEET_UPGRADES,
    K0S_CONTROL_PLANES,
    K0S_WORKER_CONFIG_TEMPLATES,
    K0SMOTRON_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    NODES,
    SECRETS,
    Resource,
)
from fleet.rollout.annotations import ROLLOUT_CONFIGMAP, STATE_KEY
from fleet.rollout.gate import FleetControls
from fleet.rollout.state import RolloutState
from fleet.world.clusters import KubeconfigSecretError, kubeconfig_from_secret
from fleet.world.model import (
    KIND_CONTROL_NODE,
    KIND_NODE,
    ClusterKey,
    NodeInfo,
    Snapshot,
)
from fleet.world.records import live_autopilot_plan, node_records, plan_records
from fleet.world.snapshot import (
    Listed,
    ManagementObjects,
    build_snapshot,
    cluster_nodes,
    control_planes_needing_infra,
    fleet_clusters,
    watched_namespaces,
)

log = logging.getLogger(__name__)



@dataclass
class Observation:
    snapshot: Snapshot
    controls: FleetControls = field(default_factory=FleetControls)
    state: RolloutState = field(default_factory=RolloutState)
    problems: dict[ClusterKey, str] = field(default_factory=dict)  # unreachable clusters
    # clusters whose worker in-place updates Cluster API drives through our extension
    # (filled in by the caller that may read ExtensionConfigs: fleet/cli/plan.py)
    extension_clusters: frozenset[ClusterKey] = frozenset()


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
    files = config.clusters.kubeconfig_secrets.allows_files(namespace)
    return await KubeClient.for_many(kubeconfig_from_secret(secret, allow_files=files),
                                     name=name, allow_files=files)


async def _nodes(mgmt: KubeClient, config: FleetConfig, key: ClusterKey,
                 timeout: float) -> tuple[dict[str, NodeInfo], str | None]:
    """The cluster's Nodes (and ControlNodes), and a still running autopilot Plan."""
    with anyio.fail_after(timeout):
        async with await workload_client(mgmt, config, *key) as wl:
            nodes = (await wl.list(NODES)).items
            control_nodes: list[KubeObject] = []
            plan: str | None = None
            try:
                control_nodes = (await wl.list(CONTROL_NODES)).items
                plan = live_autopilot_plan(plan_records((await wl.list(AUTOPILOT_PLANS)).items))
            except KubeError:
                pass  # no autopilot CRD: no pure controllers, no Plans to see
            return cluster_nodes(node_records(nodes, KIND_NODE),
                                 node_records(control_nodes, KIND_CONTROL_NODE)), plan


async def observe(mgmt: KubeClient, config: FleetConfig, *, now: datetime | None = None,
                  node_timeout: float = 10.0, concurrency: int = 32,
                  amend_upgrades: Callable[[list[KubeObject]], list[KubeObject]] | None = None
                  ) -> Observation:
    """Read the whole fleet once.

    ``amend_upgrades`` turns the FleetUpgrades read into those to judge by (a previewed
    one written in: ``k0s-fleet plan --version``, ``upgrade --dry-run``) before anything
    depends on them, so the control-plane Machines whose infrastructure Machines are read
    are those the controller would read once that FleetUpgrade exists, and the snapshot's
    intents are the ones it would plan with."""
    namespaces = watched_namespaces(config)
    all_clusters = await _list(mgmt, CLUSTERS, namespaces)
    # The same fleet membership and per-cluster settings the controller plans with.
    clusters = fleet_clusters(config, all_clusters)

    async def listed(res: Resource) -> Listed:
        return Listed(res.kind, await _list(mgmt, res, namespaces))

    try:
        upgrades = (await mgmt.list(FLEET_UPGRADES, config.management.namespace)).items
    except NotFoundError:
        upgrades = []  # the FleetUpgrade CRD is not installed: no intents
    if amend_upgrades is not None:
        upgrades = amend_upgrades(upgrades)
    try:
        templates = await listed(K0S_WORKER_CONFIG_TEMPLATES)
    except NotFoundError:
        templates = Listed(K0S_WORKER_CONFIG_TEMPLATES.kind)  # k0smotron's bootstrap CRD absent
    try:
        hosted = await listed(K0SMOTRON_CONTROL_PLANES)
    except NotFoundError:
        hosted = Listed(K0SMOTRON_CONTROL_PLANES.kind)  # no hosted control planes served
    objects = ManagementObjects(
        deployments=await listed(MACHINE_DEPLOYMENTS), machine_sets=await listed(MACHINE_SETS),
        control_planes=await listed(K0S_CONTROL_PLANES), machines=await listed(MACHINES),
        nodeplans=await listed(NODE_PLANS),
        fleet_upgrades=Listed(FLEET_UPGRADES.kind, upgrades), worker_templates=templates,
        hosted_control_planes=hosted)
    infra = await InfraMachines(mgmt).for_machines(
        control_planes_needing_infra(objects, clusters))

    nodes: dict[ClusterKey, Mapping[str, NodeInfo] | None] = {}
    autopilot: dict[ClusterKey, str] = {}
    problems: dict[ClusterKey, str] = {}
    # Every workload cluster at once (bounded): unreachable ones cost one timeout in
    # total, not one each.
    limiter = anyio.CapacityLimiter(max(1, concurrency))

    async def read(key: ClusterKey) -> None:
        async with limiter:
            try:
                nodes[key], plan = await _nodes(mgmt, config, key, node_timeout)
                if plan is not None:
                    autopilot[key] = plan
            except (KubeError, KubeconfigSecretError, TimeoutError, ValueError, OSError) as e:
                nodes[key] = None
                problems[key] = f"workload cluster unreachable: {e!r}"[:300]

    async with anyio.create_task_group() as tg:
        for key in sorted(clusters):
            tg.start_soon(read, key)
    nodes = {key: nodes[key] for key in sorted(clusters)}

    controls, state = FleetControls(), RolloutState()
    cm = await mgmt.get_or_none(CONFIGMAPS, ROLLOUT_CONFIGMAP, config.management.namespace)
    if cm is not None:
        controls = FleetControls.from_annotations(
            (cm.get("metadata") or {}).get("annotations") or {})
        state = RolloutState.from_json((cm.get("data") or {}).get(STATE_KEY))

    snapshot = build_snapshot(now=now or datetime.now(UTC), objects=objects,
                              clusters=clusters, nodes=nodes, infra=infra,
                              autopilot_plans=autopilot,
                              catalog=config.download.catalog())
    return Observation(snapshot=snapshot, controls=controls, state=state,
                       problems=problems)
