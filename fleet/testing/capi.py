"""Cluster API objects as k0smotron creates them, for tests, the demo and the benchmarks.

``create_cluster`` writes, in the management cluster: the CAPI ``Cluster``, its
``<name>-kubeconfig`` Secret (pointing at a workload API server of the test world), a
``K0sControlPlane`` with its control-plane Machines (and their infrastructure Machines,
cloned from the KCP's template), a ``MachineDeployment`` with one ``MachineSet`` and its
worker Machines; and in the workload cluster one Ready Node per Machine, named after it.
No Cluster API manager is involved: the objects are written as CAPI would leave them,
against Cluster API's real CRDs (the test world installs them).

``create_capi_cluster`` writes only what a user applies (Cluster, kubeconfig Secret,
stand-in K0sControlPlane, templates, MachineDeployment) for a management API server on
which the real CAPI manager runs (:mod:`fleet.testing.capimanager`); the manager creates
the MachineSets and Machines and :mod:`fleet.testing.providers` provisions them.
Nothing here runs in production.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from fleet.kube import AlreadyExistsError, KubeClient, KubeError, KubeObject, patch_with_retry
from fleet.kube.resources import (
    CLUSTERS,
    CRDS,
    FLEET_UPGRADES,
    K0S_CONTROL_PLANES,
    K0S_WORKER_CONFIG_TEMPLATES,
    K0SMOTRON_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODES,
    SECRETS,
    Resource,
)
from fleet.testing.providers import (
    BOOTSTRAP_GROUP,
    INFRA_GROUP,
    SIM_MACHINE_TEMPLATES,
    SIM_MACHINES,
)
from fleet.testing.world import TEST_CRDS, crd_documents
from fleet.world.clusters import kubeconfig_secret
from fleet.world.model import (
    ANN_CLONED_FROM_GROUPKIND,
    ANN_CLONED_FROM_NAME,
    ANN_K0S_CONFIG,
    LABEL_CLUSTER_NAME,
    LABEL_CONTROL_PLANE,
    LABEL_CONTROL_PLANE_NAME,
    LABEL_DEPLOYMENT_NAME,
    LABEL_SET_NAME,
)
from fleet.world.reported import kubelet_version

# On every test Cluster: its name, so that a FleetUpgrade can select that one cluster.
TEST_CLUSTER_LABEL = "test.k0s-fleet.io/cluster"

INFRA_MACHINES = SIM_MACHINES
INFRA_TEMPLATE_KIND = SIM_MACHINE_TEMPLATES.kind
# The SimMachine CRD (config/test-crds, installed on every server of the test world).
INFRA_CRD: KubeObject = next(d for d in crd_documents(TEST_CRDS)
                             if d["metadata"]["name"] == f"simmachines.{INFRA_GROUP}")

# Every test Cluster's spec.controlPlaneEndpoint: k0smotron waits for one and writes its
# host into the K0sControlPlane's k0sConfigSpec.k0s.spec.api.externalAddress.
CONTROL_PLANE_ENDPOINT: dict[str, Any] = {"host": "10.0.0.1", "port": 6443}
# k0smotron v2.1.0 refuses a ``k0s`` member without this apiVersion and kind (docs/capi.md).
K0S_CLUSTER_CONFIG = {"apiVersion": "k0s.k0sproject.io/v1beta1", "kind": "ClusterConfig"}
# As k0smotron leaves it: with the endpoint's host as externalAddress (written by it).
K0S_CONFIG_SPEC: dict[str, Any] = {"args": ["--enable-metrics-scraper"],
                                   "k0s": {**K0S_CLUSTER_CONFIG, "spec": {"api": {
                                       "sans": ["10.0.0.1"],
                                       "externalAddress": CONTROL_PLANE_ENDPOINT["host"]}}}}
# The group k0smotron v2.1.0 writes into every control-plane Machine's infrastructureRef,
# whatever its template's group (docs/capi.md).
K0SMOTRON_MACHINE_INFRA_GROUP = "infrastructure.cluster.x-k8s.io"


def infrastructure_template_ref(name: str) -> dict[str, str]:
    """A K0sControlPlane's ``machineTemplate.infrastructureRef``: in k0smotron v2.1.0's
    v1beta2 an object reference (apiVersion, kind, name), not Cluster API's apiGroup form."""
    return {"apiVersion": SIM_MACHINE_TEMPLATES.api_version, "kind": INFRA_TEMPLATE_KIND,
            "name": name}


async def ensure_infra_crd(mgmt: KubeClient, timeout: float = 30.0) -> None:
    """Install the SimMachine CRD and wait until it is served.

    (Not fleet.testing.world.install_crds: it trips over a CRD whose status still says
    ``conditions: null`` right after creation.)
    """
    with contextlib.suppress(AlreadyExistsError):
        await mgmt.create(CRDS, INFRA_CRD)
    with anyio.fail_after(timeout):
        while True:
            crd = await mgmt.get(CRDS, INFRA_CRD["metadata"]["name"])
            conds = (crd.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True"
                   for c in conds):
                break
            await anyio.sleep(0.05)
        while True:
            try:
                await mgmt.list(INFRA_MACHINES, page_size=1)
                return
            except KubeError:
                await anyio.sleep(0.05)


async def _create(client: KubeClient, res: Resource, body: KubeObject,
                  namespace: str | None = None) -> KubeObject:
    try:
        return await client.create(res, body, namespace)
    except AlreadyExistsError:
        meta = body["metadata"]
        return await client.get(res, meta["name"], meta.get("namespace"))


async def set_node_ready(client: KubeClient, name: str, ready: bool) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    await client.patch(NODES, name, {"status": {"conditions": [{
        "type": "Ready", "status": "True" if ready else "False",
        "reason": "KubeletReady" if ready else "KubeletNotReady", "message": "test",
        "lastHeartbeatTime": now, "lastTransitionTime": now}]}}, subresource="status")


@dataclass
class FleetCluster:
    namespace: str
    name: str
    version: str
    control_planes: list[str] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)
    kcp: str | None = None
    md: str | None = None
    machine_set: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def machines(self) -> list[str]:
        return self.control_planes + self.workers


async def create_cluster(
    mgmt: KubeClient,
    workload: KubeClient,
    workload_kubeconfig: dict[str, Any],
    *,
    namespace: str,
    name: str,
    version: str = "v1.31.2+k0s.0",
    control_planes: int = 3,
    workers: int = 6,
    max_unavailable: int | str | None = 2,
    max_surge: int | str = 0,
    node_prefix: str | None = None,
    worker_template_version: str | None = None,
    create_nodes: bool = True,
) -> FleetCluster:
    """All objects of one CAPI cluster, every Machine on ``version`` with a Ready Node.

    Machine (and Node) names start with ``node_prefix`` (default: ``name``): Nodes are
    cluster-scoped, so tests sharing a workload API server need distinct prefixes.
    """
    prefix = node_prefix or name
    fc = FleetCluster(namespace, name, version)
    cluster = await _create(mgmt, CLUSTERS, cluster_object(namespace, name))
    await _create(mgmt, SECRETS, kubeconfig_secret(f"{name}-kubeconfig", namespace, name,
                                                    workload_kubeconfig))
    owner = {"apiVersion": CLUSTERS.api_version, "kind": "Cluster", "name": name,
             "uid": cluster["metadata"]["uid"]}
    width = max(1, len(str(max(control_planes, workers) - 1)))
    async with anyio.create_task_group() as tg:
        if control_planes:
            fc.kcp = f"{name}-cp"
            kcp = await _create(mgmt, K0S_CONTROL_PLANES, control_plane_object(
                namespace, name, version, control_planes, owner))
            kcp_owner = {"apiVersion": K0S_CONTROL_PLANES.api_version,
                         "kind": K0S_CONTROL_PLANES.kind, "name": fc.kcp,
                         "uid": kcp["metadata"]["uid"], "controller": True}
            for i in range(control_planes):
                mname = f"{prefix}-cp-{i:0{width}d}"
                fc.control_planes.append(mname)
                tg.start_soon(_control_plane_machine, mgmt, workload, namespace, name, mname,
                              version, kcp_owner, create_nodes,
                              kcp["spec"].get("k0sConfigSpec"))
        if workers:
            fc.md = f"{name}-md"
            fc.machine_set = f"{name}-md-ms"
            if worker_template_version is not None:
                # k0smotron's worker bootstrap template, its version kept in step
                await _create(mgmt, K0S_WORKER_CONFIG_TEMPLATES, {
                    "metadata": {"name": f"{name}-w", "namespace": namespace},
                    "spec": {"template": {"spec": {"version": worker_template_version}}}})
            await _create(mgmt, MACHINE_DEPLOYMENTS, deployment_object(
                namespace, name, version, workers, max_unavailable=max_unavailable,
                max_surge=max_surge))
            await _create(mgmt, MACHINE_SETS, machine_set_object(namespace, name, version,
                                                                 workers))
            for i in range(workers):
                mname = f"{prefix}-md-{i:0{width}d}"
                fc.workers.append(mname)
                tg.start_soon(_worker_machine, mgmt, workload, namespace, name, mname, version,
                              fc.md, fc.machine_set, create_nodes)
    return fc


def cluster_object(namespace: str, name: str) -> KubeObject:
    """The CAPI Cluster ``create_cluster`` writes."""
    return {
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {TEST_CLUSTER_LABEL: name}},
        "spec": {"controlPlaneRef": {"apiGroup": K0S_CONTROL_PLANES.group,
                                     "kind": K0S_CONTROL_PLANES.kind, "name": f"{name}-cp"},
                 "controlPlaneEndpoint": dict(CONTROL_PLANE_ENDPOINT)}}


def control_plane_object(namespace: str, cluster: str, version: str, replicas: int,
                         owner: dict[str, Any]) -> KubeObject:
    """The K0sControlPlane ``<cluster>-cp`` ``create_cluster`` writes (``owner``: its
    Cluster's owner reference)."""
    return {
        "metadata": {"name": f"{cluster}-cp", "namespace": namespace,
                     "labels": {LABEL_CLUSTER_NAME: cluster}, "ownerReferences": [owner]},
        "spec": {"version": version, "replicas": replicas, "updateStrategy": "InPlace",
                 "machineTemplate": {"infrastructureRef": infrastructure_template_ref(
                     f"{cluster}-cp")},
                 "k0sConfigSpec": K0S_CONFIG_SPEC}}


def _worker_template_spec(cluster: str, version: str) -> dict[str, Any]:
    return {"clusterName": cluster, "version": version,
            "bootstrap": {"configRef": {"apiGroup": BOOTSTRAP_GROUP,
                                        "kind": "K0sWorkerConfigTemplate",
                                        "name": f"{cluster}-w"}},
            "infrastructureRef": {"apiGroup": INFRA_GROUP, "kind": INFRA_TEMPLATE_KIND,
                                  "name": f"{cluster}-w"}}


def deployment_object(namespace: str, cluster: str, version: str, replicas: int, *,
                      max_unavailable: int | str | None = 2,
                      max_surge: int | str = 0) -> KubeObject:
    """The MachineDeployment ``<cluster>-md`` ``create_cluster`` writes."""
    md = f"{cluster}-md"
    return {
        "metadata": {"name": md, "namespace": namespace,
                     "labels": {LABEL_CLUSTER_NAME: cluster}},
        "spec": {"clusterName": cluster, "replicas": replicas,
                 "selector": {"matchLabels": {LABEL_DEPLOYMENT_NAME: md}},
                 "rollout": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {
                     "maxUnavailable": max_unavailable, "maxSurge": max_surge}}}
                 if max_unavailable is not None else {},
                 "template": {"metadata": {"labels": {LABEL_DEPLOYMENT_NAME: md}},
                              "spec": _worker_template_spec(cluster, version)}}}


def machine_set_object(namespace: str, cluster: str, version: str, replicas: int
                       ) -> KubeObject:
    """The MachineSet ``<cluster>-md-ms`` (of ``<cluster>-md``) ``create_cluster`` writes."""
    md = f"{cluster}-md"
    return {
        "metadata": {"name": f"{md}-ms", "namespace": namespace,
                     "labels": {LABEL_CLUSTER_NAME: cluster, LABEL_DEPLOYMENT_NAME: md}},
        "spec": {"clusterName": cluster, "replicas": replicas,
                 "selector": {"matchLabels": {LABEL_DEPLOYMENT_NAME: md}},
                 "template": {"metadata": {"labels": {LABEL_DEPLOYMENT_NAME: md}},
                              "spec": _worker_template_spec(cluster, version)}}}


def control_plane_machine_object(namespace: str, cluster: str, name: str, version: str,
                                 kcp_owner: dict[str, Any], *,
                                 k0s_config_spec: dict[str, Any] | None = None) -> KubeObject:
    """A control-plane Machine as k0smotron v2.1.0 creates it: its k0s-config annotation
    (``k0s_config_spec``, the K0sControlPlane's as the API server stored it, defaults
    filled; default :data:`K0S_CONFIG_SPEC`; the etcd member named after the Machine),
    owned by the K0sControlPlane of ``kcp_owner``, its infrastructureRef in Cluster API's
    infrastructure group whatever the template's."""
    config = json.loads(json.dumps(K0S_CONFIG_SPEC if k0s_config_spec is None
                                   else k0s_config_spec))
    k0s = config.setdefault("k0s", dict(K0S_CLUSTER_CONFIG))
    k0s.setdefault("spec", {})["storage"] = {"etcd": {"extraArgs": {"name": name}}}
    return _machine_object(
        namespace, cluster, name, version, bootstrap_kind="K0sControllerConfig",
        labels={LABEL_CONTROL_PLANE: "true", LABEL_CONTROL_PLANE_NAME: kcp_owner["name"]},
        infra_group=K0SMOTRON_MACHINE_INFRA_GROUP,
        annotations={ANN_K0S_CONFIG: json.dumps(config)}, ownerReferences=[kcp_owner])


def worker_machine_object(namespace: str, cluster: str, name: str, version: str, *,
                          md: str, ms: str) -> KubeObject:
    """A worker Machine of MachineDeployment ``md`` / MachineSet ``ms``."""
    return _machine_object(namespace, cluster, name, version, bootstrap_kind="K0sWorkerConfig",
                           labels={LABEL_DEPLOYMENT_NAME: md, LABEL_SET_NAME: ms})


async def _machine(mgmt: KubeClient, body: KubeObject, node: str) -> None:
    obj = await _create(mgmt, MACHINES, body)
    await mgmt.patch(MACHINES, obj["metadata"]["name"], {"status": {
        "nodeRef": {"apiVersion": "v1", "kind": "Node", "name": node},
        "phase": "Running"}}, obj["metadata"]["namespace"], subresource="status")


async def create_node(workload: KubeClient, name: str, version: str, *,
                      control_plane: bool = False, ready: bool = True) -> None:
    labels = {"kubernetes.io/arch": "amd64", "k0smotron.io/machine-name": name}
    if control_plane:
        labels["node-role.kubernetes.io/control-plane"] = "true"
    # As a real k0s node registers: no k0s-fleet annotation; the kubelet tells its version.
    await _create(workload, NODES, {"metadata": {"name": name, "labels": labels}})
    await workload.patch(NODES, name, {"status": {"nodeInfo": {
        "kubeletVersion": kubelet_version(version), "architecture": "amd64"}}},
        subresource="status")
    await set_node_ready(workload, name, ready)


def _machine_object(namespace: str, cluster: str, name: str, version: str, *,
                    bootstrap_kind: str, labels: dict[str, str],
                    infra_group: str = INFRA_GROUP, **metadata: Any) -> dict[str, Any]:
    """A Machine of ``cluster`` bootstrapped by a ``bootstrap_kind`` of its name, on a
    SimMachine of its name; ``labels`` and ``metadata`` beside the cluster's label."""
    return {
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {LABEL_CLUSTER_NAME: cluster, **labels}, **metadata},
        "spec": {"clusterName": cluster, "version": version,
                 "bootstrap": {"configRef": {"apiGroup": BOOTSTRAP_GROUP,
                                             "kind": bootstrap_kind, "name": name}},
                 "infrastructureRef": {"apiGroup": infra_group, "kind": "SimMachine",
                                       "name": name}}}


async def _control_plane_machine(  # noqa: PLR0917 - started with start_soon
        mgmt: KubeClient, workload: KubeClient, namespace: str,
                                 cluster: str, name: str, version: str,
                                 kcp_owner: dict[str, Any], create_nodes: bool,
                                 k0s_config_spec: dict[str, Any] | None = None) -> None:
    await _create(mgmt, INFRA_MACHINES, {
        "metadata": {"name": name, "namespace": namespace, "annotations": {
            ANN_CLONED_FROM_NAME: f"{cluster}-cp",
            ANN_CLONED_FROM_GROUPKIND: f"{INFRA_TEMPLATE_KIND}.{INFRA_GROUP}"}},
        "spec": {}})
    await _machine(mgmt, control_plane_machine_object(namespace, cluster, name, version,
                                                      kcp_owner,
                                                      k0s_config_spec=k0s_config_spec), name)
    if create_nodes:
        await create_node(workload, name, version, control_plane=True)


async def _worker_machine(  # noqa: PLR0917 - started with start_soon
        mgmt: KubeClient, workload: KubeClient, namespace: str,
                          cluster: str, name: str, version: str, md: str, ms: str,
                          create_nodes: bool) -> None:
    await _machine(mgmt, worker_machine_object(namespace, cluster, name, version, md=md, ms=ms),
                   name)
    if create_nodes:
        await create_node(workload, name, version)


async def bump(mgmt: KubeClient, fc: FleetCluster | CapiCluster, version: str, *,
               intent_namespace: str | None = None) -> None:
    """Ask for ``version`` as an operator does: a FleetUpgrade ``to-<cluster>`` selecting
    this one cluster (label :data:`TEST_CLUSTER_LABEL`), in the controller's namespace
    (default: the cluster's). k0s-fleet then writes the objects' versions itself."""
    name = f"to-{fc.name}"
    namespace = intent_namespace or fc.namespace
    selector = {"matchLabels": {TEST_CLUSTER_LABEL: fc.name}}
    try:
        await mgmt.create(FLEET_UPGRADES, {
            "apiVersion": FLEET_UPGRADES.api_version, "kind": FLEET_UPGRADES.kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"version": version, "clusterSelector": selector}}, namespace)
    except AlreadyExistsError:
        await mgmt.patch(FLEET_UPGRADES, name, {"spec": {"version": version}}, namespace)


async def hand_edit(mgmt: KubeClient, fc: FleetCluster | CapiCluster, version: str, *,
                    control_plane: bool = True, workers: bool = True) -> None:
    """Write ``version`` into the KCP and/or MD directly, as a user editing them by hand
    would (k0s-fleet reports it and starts no node: the one-writer rule)."""
    if control_plane and fc.kcp:
        await mgmt.patch(K0S_CONTROL_PLANES, fc.kcp, {"spec": {"version": version}},
                         fc.namespace)
    if workers and fc.md:
        await mgmt.patch(MACHINE_DEPLOYMENTS, fc.md,
                         {"spec": {"template": {"spec": {"version": version}}}}, fc.namespace)


async def annotate(client: KubeClient, res: Resource, name: str, namespace: str | None,
                   annotations: dict[str, str | None]) -> None:
    await patch_with_retry(client, res, name,
                           lambda _o: {"metadata": {"annotations": annotations}}, namespace)


# -- clusters driven by the real Cluster API manager ----------------------------------------

@dataclass
class CapiCluster:
    """The declarative objects of one cluster; the CAPI manager makes the rest."""

    namespace: str
    name: str
    version: str
    kcp: str
    md: str
    worker_template: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


async def _create_hosted_control_plane(mgmt: KubeClient, namespace: str, cluster: str,
                                       name: str, *, version: str, replicas: int) -> None:
    """A k0smotron hosted control plane (K0smotronControlPlane, stand-in CRD) as k0smotron
    leaves it once its pods run: initialised, ``status.version`` the spec's, every replica
    ready. Rolling it to a new version is :class:`fleet.testing.k0smotron.
    HostedControlPlaneStandIn`'s job."""
    await _create(mgmt, K0SMOTRON_CONTROL_PLANES, {
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {LABEL_CLUSTER_NAME: cluster}},
        "spec": {"version": version, "replicas": replicas}})
    await mgmt.patch(K0SMOTRON_CONTROL_PLANES, name, {"status": {
        "initialization": {"controlPlaneInitialized": True}, "version": version,
        "replicas": replicas, "readyReplicas": replicas}}, namespace, subresource="status")


def rollout_strategy(strategy: str = "RollingUpdate", *, max_unavailable: int | str = 1,
                     max_surge: int | str = 0) -> dict[str, Any]:
    if strategy == "OnDelete":
        return {"type": "OnDelete"}
    return {"type": strategy, "rollingUpdate": {"maxUnavailable": max_unavailable,
                                                "maxSurge": max_surge}}


async def create_capi_cluster(
    mgmt: KubeClient, workload_kubeconfig: dict[str, Any], *, namespace: str, name: str,
    version: str = "v1.31.2+k0s.0", workers: int = 3, strategy: str = "RollingUpdate",
    max_unavailable: int | str = 1, max_surge: int | str = 0, control_plane_replicas: int = 1,
    worker_template_version: str | None = None, hosted: bool = False,
) -> CapiCluster:
    """Cluster, kubeconfig Secret, stand-in K0sControlPlane (no Machines), worker templates
    and a MachineDeployment of ``workers`` replicas: what a user applies. The real CAPI
    manager creates the MachineSet and Machines; :class:`fleet.testing.providers.
    ProviderPlayer` provisions them. ``control_plane_replicas``: what the stand-in KCP
    says (it gets no Machines; 0 lets k0s-fleet count the cluster complete)."""
    kcp, md, template = f"{name}-cp", f"{name}-md", f"{name}-w"
    await _create(mgmt, SECRETS, kubeconfig_secret(f"{name}-kubeconfig", namespace, name,
                                                    workload_kubeconfig))
    control_plane = K0SMOTRON_CONTROL_PLANES if hosted else K0S_CONTROL_PLANES
    if hosted:
        await _create_hosted_control_plane(mgmt, namespace, name, kcp, version=version,
                                           replicas=control_plane_replicas)
    else:
        await _create(mgmt, K0S_CONTROL_PLANES, {
            "metadata": {"name": kcp, "namespace": namespace,
                         "labels": {LABEL_CLUSTER_NAME: name}},
            "spec": {"version": version, "replicas": control_plane_replicas,
                     "updateStrategy": "InPlace",
                     "machineTemplate": {"infrastructureRef": infrastructure_template_ref(kcp)},
                     "k0sConfigSpec": K0S_CONFIG_SPEC}})
    await _create(mgmt, CLUSTERS, {
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {TEST_CLUSTER_LABEL: name}},
        "spec": {"controlPlaneRef": {"apiGroup": control_plane.group,
                                     "kind": control_plane.kind, "name": kcp},
                 "controlPlaneEndpoint": dict(CONTROL_PLANE_ENDPOINT)}})
    await _create(mgmt, SIM_MACHINE_TEMPLATES, {
        "metadata": {"name": template, "namespace": namespace},
        "spec": {"template": {"spec": {}}}})
    await _create(mgmt, K0S_WORKER_CONFIG_TEMPLATES, {
        "metadata": {"name": template, "namespace": namespace},
        "spec": {"template": {"spec": {"args": ["--enable-metrics-scraper"], **(
            {"version": worker_template_version} if worker_template_version else {})}}}})
    labels = {LABEL_CLUSTER_NAME: name, LABEL_DEPLOYMENT_NAME: md}
    await _create(mgmt, MACHINE_DEPLOYMENTS, {
        "metadata": {"name": md, "namespace": namespace, "labels": {LABEL_CLUSTER_NAME: name}},
        "spec": {"clusterName": name, "replicas": workers,
                 "selector": {"matchLabels": labels},
                 "rollout": {"strategy": rollout_strategy(
                     strategy, max_unavailable=max_unavailable, max_surge=max_surge)},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "clusterName": name, "version": version,
                     "bootstrap": {"configRef": {"apiGroup": BOOTSTRAP_GROUP,
                                                 "kind": "K0sWorkerConfigTemplate",
                                                 "name": template}},
                     "infrastructureRef": {"apiGroup": INFRA_GROUP,
                                           "kind": INFRA_TEMPLATE_KIND,
                                           "name": template}}}}})
    return CapiCluster(namespace, name, version, kcp, md, template)
