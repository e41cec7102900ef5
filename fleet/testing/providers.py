"""A provider player: the infrastructure, bootstrap and (initialisation only) control-plane
providers of the test world, played through Cluster API's v1beta2 provider contracts.

The real Cluster API manager (:mod:`fleet.testing.capimanager`) creates Machines with a
bootstrap config and an infrastructure Machine cloned from templates; a real cluster
would now have providers that provision them. :class:`ProviderPlayer` does what those
providers promise in the contract, and nothing else:

- bootstrap (k0smotron's ``K0sWorkerConfig`` / ``K0sControllerConfig``, stand-in CRDs):
  a data Secret, ``status.dataSecretName`` and ``status.initialization.dataSecretCreated``;
- infrastructure (the test world's ``SimMachine``): ``spec.providerID`` and
  ``status.initialization.provisioned``;
- the node: once both are done, a Node in the workload cluster with that provider ID,
  Ready and with the pressure conditions False, its kubelet version as a k0s kubelet
  reports it (``v1.31.3+k0s`` for ``v1.31.3+k0s.0``), or whatever ``node_factory`` does
  (e.g. start a :class:`fleet.testing.simnode.SimNode` with a real agent);
- control plane (optional, ``control_planes=True``): a ``K0sControlPlane`` without
  ``status.initialization`` is marked ``controlPlaneInitialized`` with ``status.version``
  from its spec, so that CAPI connects to the workload cluster. Version changes are NOT
  played here (that is the k0smotron stand-in's job).

Each sweep is idempotent; the player can be stopped and started at any time.
Nothing here runs in production.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio

from fleet.contract.signal import RUNNING_VERSION_KEY
from fleet.kube import AlreadyExistsError, KubeClient, KubeError, KubeObject, NotFoundError
from fleet.kube.resources import K0S_CONTROL_PLANES, MACHINES, NODES, SECRETS, Resource
from fleet.kube.watch import Reflector
from fleet.world.eligibility import kubelet_form

log = logging.getLogger(__name__)

# Cluster API's infrastructure group: k0smotron v2.1.0 writes it into every control-plane
# Machine's infrastructureRef whatever its template says (docs/capi.md), so the test
# world's SimMachine kinds live there, as every provider k0smotron works with does.
INFRA_GROUP = "infrastructure.cluster.x-k8s.io"
BOOTSTRAP_GROUP = "bootstrap.cluster.x-k8s.io"
SIM_MACHINES = Resource(INFRA_GROUP, "v1beta1", "simmachines", "SimMachine", namespaced=True)
SIM_MACHINE_TEMPLATES = Resource(INFRA_GROUP, "v1beta1", "simmachinetemplates",
                                 "SimMachineTemplate", namespaced=True)
K0S_WORKER_CONFIGS = Resource(BOOTSTRAP_GROUP, "v1beta2", "k0sworkerconfigs",
                              "K0sWorkerConfig", namespaced=True)
K0S_CONTROLLER_CONFIGS = Resource(BOOTSTRAP_GROUP, "v1beta2", "k0scontrollerconfigs",
                                  "K0sControllerConfig", namespaced=True)
PLAYED: dict[tuple[str, str], Resource] = {
    (r.group, r.kind): r for r in (SIM_MACHINES, K0S_WORKER_CONFIGS, K0S_CONTROLLER_CONFIGS)}
PROVIDER_ID_PREFIX = "k0s-fleet-sim://"
PRESSURE_CONDITIONS = ("MemoryPressure", "DiskPressure", "PIDPressure")

WorkloadClients = Callable[[str, str], Awaitable[KubeClient]]
NodeFactory = Callable[[KubeObject, str, KubeClient], Awaitable[None]]


def provider_id(namespace: str, machine: str) -> str:
    return f"{PROVIDER_ID_PREFIX}{namespace}/{machine}"


# What a k0s kubelet reports for k0s ``version``: ``v1.31.3+k0s.0`` -> ``v1.31.3+k0s``.
kubelet_version = kubelet_form


def node_body(name: str, provider: str, version: str, *, control_plane: bool = False,
              labels: dict[str, str] | None = None) -> KubeObject:
    node_labels = {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
                   "kubernetes.io/hostname": name, "k0smotron.io/machine-name": name,
                   **(labels or {})}
    if control_plane:
        node_labels["node-role.kubernetes.io/control-plane"] = "true"
    return {"metadata": {"name": name, "labels": node_labels,
                         "annotations": {RUNNING_VERSION_KEY: version}},
            "spec": {"providerID": provider}}


def node_status(version: str, *, ready: bool = True, message: str = "test") -> KubeObject:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [{"type": "Ready", "status": "True" if ready else "False",
                   "reason": "KubeletReady" if ready else "KubeletNotReady",
                   "message": message, "lastHeartbeatTime": now, "lastTransitionTime": now}]
    conditions += [{"type": t, "status": "False", "reason": f"KubeletHasNo{t}",
                    "message": "test", "lastHeartbeatTime": now, "lastTransitionTime": now}
                   for t in PRESSURE_CONDITIONS]
    return {"status": {"conditions": conditions, "nodeInfo": {
        "kubeletVersion": kubelet_version(version), "architecture": "amd64",
        "operatingSystem": "linux"}}}


async def create_node(workload: KubeClient, name: str, provider: str, version: str, *,
                      control_plane: bool = False) -> None:
    """A plain Ready Node with the given provider ID (the default node factory)."""
    with contextlib.suppress(AlreadyExistsError):
        await workload.create(NODES, node_body(name, provider, version,
                                               control_plane=control_plane))
    await workload.patch(NODES, name, node_status(version), subresource="status")


async def _default_node(machine: KubeObject, provider: str, workload: KubeClient) -> None:
    meta = machine["metadata"]
    await create_node(workload, meta["name"], provider, machine["spec"].get("version") or "",
                      control_plane="cluster.x-k8s.io/control-plane" in (meta.get("labels")
                                                                          or {}))


@dataclass
class ProviderPlayer:
    """Plays the providers for every Machine of ``mgmt`` (one management API server), or
    of one ``namespace`` of it (tests sharing a server must not play each other's
    Machines, which may linger after their namespace is deleted)."""

    mgmt: KubeClient
    workloads: WorkloadClients
    node_factory: NodeFactory = _default_node
    namespace: str | None = None
    control_planes: bool = True
    interval: float = 0.2
    nodes_created: set[tuple[str, str]] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    async def run(self) -> None:
        """Sweep forever (until cancelled)."""
        machines = Reflector(self.mgmt, MACHINES, namespace=self.namespace)
        async with anyio.create_task_group() as tg:
            tg.start_soon(machines.run)
            await machines.synced.wait()
            while True:
                await self.sweep(machines.items())
                await anyio.sleep(self.interval)

    async def sweep(self, machines: list[KubeObject]) -> None:
        if self.control_planes:
            await self._initialise_control_planes()
        for machine in machines:
            try:
                await self._play(machine)
            except KubeError as exc:  # transient (conflict, object not there yet): next sweep
                msg = f"{machine['metadata']['name']}: {exc}"
                if not self.errors or self.errors[-1] != msg:
                    self.errors.append(msg)

    async def _initialise_control_planes(self) -> None:
        with contextlib.suppress(KubeError):
            for kcp in (await self.mgmt.list(K0S_CONTROL_PLANES, self.namespace)).items:
                status = kcp.get("status") or {}
                if (status.get("initialization") or {}).get("controlPlaneInitialized"):
                    continue
                meta = kcp["metadata"]
                await self.mgmt.patch(K0S_CONTROL_PLANES, meta["name"], {"status": {
                    "initialization": {"controlPlaneInitialized": True},
                    "version": kcp["spec"].get("version")}}, meta["namespace"],
                    subresource="status")

    async def _play(self, machine: KubeObject) -> None:
        meta, spec = machine["metadata"], machine.get("spec") or {}
        ns, name = meta["namespace"], meta["name"]
        if meta.get("deletionTimestamp") or (ns, name) in self.nodes_created:
            return
        bootstrapped = await self._bootstrap(ns, spec.get("bootstrap") or {})
        provider = await self._infrastructure(ns, name, spec.get("infrastructureRef") or {})
        if not bootstrapped or provider is None:
            return
        cluster = spec.get("clusterName") or ""
        workload = await self.workloads(ns, cluster)
        await self.node_factory(machine, provider, workload)
        self.nodes_created.add((ns, name))

    async def _bootstrap(self, namespace: str, bootstrap: dict[str, Any]) -> bool:
        if bootstrap.get("dataSecretName"):
            return True
        ref = bootstrap.get("configRef") or {}
        res = PLAYED.get((ref.get("apiGroup", ""), ref.get("kind", "")))
        if res is None:
            return False
        try:
            config = await self.mgmt.get(res, ref["name"], namespace)
        except NotFoundError:
            return False
        status = config.get("status") or {}
        if (status.get("initialization") or {}).get("dataSecretCreated"):
            return True
        secret = f"{ref['name']}-bootstrap"
        owner = {"apiVersion": res.api_version, "kind": res.kind, "name": ref["name"],
                 "uid": config["metadata"]["uid"], "controller": True}
        with contextlib.suppress(AlreadyExistsError):
            await self.mgmt.create(SECRETS, {
                "metadata": {"name": secret, "namespace": namespace,
                             "ownerReferences": [owner]},
                "type": "cluster.x-k8s.io/secret",
                "stringData": {"value": "#cloud-config\n# played by the test world\n",
                               "format": "cloud-config"}})
        await self.mgmt.patch(res, ref["name"], {"status": {
            "dataSecretName": secret, "initialization": {"dataSecretCreated": True}}},
            namespace, subresource="status")
        return True

    async def _infrastructure(self, namespace: str, machine: str,
                              ref: dict[str, Any]) -> str | None:
        res = PLAYED.get((ref.get("apiGroup", ""), ref.get("kind", "")))
        if res is None:
            return None
        try:
            infra = await self.mgmt.get(res, ref["name"], namespace)
        except NotFoundError:
            return None
        provider = (infra.get("spec") or {}).get("providerID") or provider_id(namespace,
                                                                              machine)
        if not (infra.get("spec") or {}).get("providerID"):
            await self.mgmt.patch(res, ref["name"], {"spec": {"providerID": provider}},
                                  namespace)
        if not ((infra.get("status") or {}).get("initialization") or {}).get("provisioned"):
            await self.mgmt.patch(res, ref["name"], {"status": {
                "initialization": {"provisioned": True},
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}},
                namespace, subresource="status")
        return str(provider)
