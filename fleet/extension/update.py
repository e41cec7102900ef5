"""The UpdateMachine hook: create (or find) the Machine's NodePlan and report on it.

Idempotent by construction: the NodePlan's name is a function of (Machine, version)
(:func:`fleet.contract.nodeplan.nodeplan_name`), so every call, from any replica, concurrent or
not, and the standalone controller too, names the same object. Creating it is the
unit of dispatch; AlreadyExists means someone already dispatched, and we adopt that
NodePlan whatever its source. This module never drives the NodePlan: the controller's
NodePlan reconciler signals the node and mirrors its state into the NodePlan status;
we only create it and read it (plus the workload Node, for the final check).

The request is a hint: before anything is written, what it asks is checked against the
stored objects (:mod:`fleet.extension.admission`), and the one write, the NodePlan, goes
through the client the service is given (the replica's fenced client) under
:func:`fleet.world.fence.writes_for` the Machine's cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry.trace import Tracer

from fleet.artifacts import ArtifactResolver
from fleet.config.downloads import DownloadResolutionError
from fleet.config.models import ClusterSettings, ExtensionMode
from fleet.contract.nodeplan import TRACEPARENT_ANNOTATION, nodeplan_name
from fleet.contract.signal import NodePolicy
from fleet.contract.versions import InvalidVersionError, K0sVersion
from fleet.dispatch import create_or_adopt_nodeplan, nodeplan_to_dispatch
from fleet.extension.activation import ExtensionEndpoint, extension_active
from fleet.extension.admission import UpdateSubject, check_update_machine, refusal_message
from fleet.extension.policyhold import PolicyHold
from fleet.extension.progress import (
    RETRY_AFTER_SECONDS,
    UNOBSERVABLE_RETRY_SECONDS,
    NodeObservation,
    observe_node,
    update_progress,
)
from fleet.extension.wire import ResponseStatus, UpdateMachineRequest, UpdateMachineResponse
from fleet.kube import (
    FencedError,
    KubeClient,
    KubeError,
    KubeObject,
    NotFoundError,
    UnreachableError,
)
from fleet.kube.resources import (
    CLUSTERS,
    EXTENSION_CONFIGS,
    K0S_CONTROL_PLANES,
    K0SMOTRON_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINES,
    NODE_PLANS,
    NODES,
)
from fleet.rollout.hookgate import HELD_RETRY_SECONDS
from fleet.telemetry import current_traceparent, link_from_traceparent
from fleet.world.fence import writes_for
from fleet.world.model import (
    ANN_MACHINE_RUNNING_VERSION,
    ANN_WRITTEN_VERSION,
    KIND_HOSTED_CP,
    KIND_KCP,
    KIND_MD,
    LABEL_CLUSTER_NAME,
    machine_from,
)

log = logging.getLogger(__name__)

SOURCE = "runtime-extension"
LABEL_CONTROL_PLANE = "cluster.x-k8s.io/control-plane"
LABEL_DEPLOYMENT_NAME = "cluster.x-k8s.io/deployment-name"

PAUSED_RETRY_SECONDS = 30
# This replica may not write for the cluster now (its Lease, or the cluster's shard, is
# another replica's): CAPI asks again, through the Service, maybe reaching the holder.
FENCED_RETRY_SECONDS = 5

# (namespace, cluster name) -> a client for that workload cluster. The controller's
# cluster registry provides it (one cached client per cluster, from <name>-kubeconfig).
WorkloadClientGetter = Callable[[str, str], Awaitable[KubeClient]]
# (namespace, cluster name, Cluster labels) -> that cluster's effective fleet settings;
# normally ``FleetConfig.for_cluster``.
ClusterSettingsGetter = Callable[[str, str, Mapping[str, str]], ClusterSettings]
# (namespace, cluster name) -> whether Cluster API drives that cluster's in-place updates
# through this extension (fleet.extension.activation.extension_active).
ExtensionDrives = Callable[[str, str], Awaitable[bool]]


class _Registry(Protocol):
    def client(self, key: tuple[str, str]) -> KubeClient | None: ...


def workload_client_from_registry(registry: _Registry) -> WorkloadClientGetter:
    """Adapt the controller's :class:`fleet.world.clusters.ClusterRegistry` (cached clients)."""

    async def get(namespace: str, cluster: str) -> KubeClient:
        client = registry.client((namespace, cluster))
        if client is None:
            raise UnreachableError(
                f"workload cluster {namespace}/{cluster} is not connected (not one of the "
                f"fleet's clusters, or its kubeconfig Secret is missing or unusable)")
        return client

    return get


def extension_drives(mgmt: KubeClient, mode: ExtensionMode | str,
                     endpoint: ExtensionEndpoint | None = None) -> ExtensionDrives:
    """The activation rule the controller's sequencer uses to stand aside
    (:class:`fleet.extension.exclusion.ExtensionExclusion`), on the ExtensionConfigs as
    they are now (one list per call in mode ``auto``). ``endpoint``: how our
    ExtensionConfigs refer to us (:func:`fleet.extension.activation.own_endpoint`)."""
    m = ExtensionMode(mode)

    async def drives(namespace: str, cluster: str) -> bool:
        if m is not ExtensionMode.AUTO:
            return extension_active({}, [], m)
        configs = (await mgmt.list(EXTENSION_CONFIGS)).items
        return extension_active({"metadata": {"namespace": namespace, "name": cluster}},
                                configs, m, endpoint=endpoint)

    return drives


def machine_role(machine: Mapping[str, Any]) -> str:
    labels = (machine.get("metadata") or {}).get("labels") or {}
    return "controller" if LABEL_CONTROL_PLANE in labels else "worker"


def machine_owner(machine: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, name) of what asked for this Machine's update, for NodePlan labels."""
    meta = machine.get("metadata") or {}
    labels = meta.get("labels") or {}
    refs = [r for r in meta.get("ownerReferences") or [] if isinstance(r, Mapping)]
    if LABEL_CONTROL_PLANE in labels:
        for r in refs:
            if r.get("kind") == "K0sControlPlane":
                return "K0sControlPlane", str(r.get("name") or "")
    if labels.get(LABEL_DEPLOYMENT_NAME):
        return "MachineDeployment", str(labels[LABEL_DEPLOYMENT_NAME])
    for r in refs:
        if r.get("controller"):
            return str(r.get("kind") or ""), str(r.get("name") or "")
    return "", ""


def node_name_of(machine: Mapping[str, Any]) -> str:
    """PROTOCOLS §1: status.nodeRef.name, else the Machine's name (k0smotron's default)."""
    ref = (machine.get("status") or {}).get("nodeRef") or {}
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return str(name or (machine.get("metadata") or {}).get("name") or "")


@dataclass
class UpdateMachineService:
    """Everything UpdateMachine needs, passed in (no globals)."""

    mgmt: KubeClient
    workload_client: WorkloadClientGetter | None = None
    # The fleet config's download policy (digest manifest included).
    artifacts: ArtifactResolver = field(default_factory=ArtifactResolver)
    retry_table: Mapping[str, int] = field(default_factory=lambda: dict(RETRY_AFTER_SECONDS))
    # Per-cluster executor and pause from the fleet config; None: executor "agent".
    cluster_settings: ClusterSettingsGetter | None = None
    # Traces the dispatch; the NodePlan then carries this span's traceparent (else the
    # Machine's own, if it has one).
    tracer: Tracer | None = None
    # The fleet config's ``agent:`` section, recorded in NodePlans for executor "agent"
    # (spec.nodePolicy); None: agents use their own settings.
    node_policy: NodePolicy | None = None
    # The fleet rollout policy (fleet.extension.policyhold): why no node may start now
    # (paused, emergency stop, window closed, wave not admitted); None: no such policy.
    policy_hold: PolicyHold | None = None
    # Whether Cluster API drives a cluster through this extension (:func:`extension_drives`);
    # None: not known, and UpdateMachine refuses every request.
    drives: ExtensionDrives | None = None

    async def handle(self, req: UpdateMachineRequest) -> UpdateMachineResponse:
        """The request is a hint: only its Machine's name and namespace and the version are
        taken from it, and they must agree with the live objects
        (:func:`fleet.extension.admission.check_update_machine`) before anything is
        written; otherwise the answer is a Failure naming every check that failed."""
        desired = req.desired.machine
        meta = desired.get("metadata") or {}
        name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
        what = f"Machine {namespace}/{name}"
        raw_version = (desired.get("spec") or {}).get("version")
        try:
            version = str(K0sVersion.parse(str(raw_version or "")))
        except InvalidVersionError:
            return UpdateMachineResponse.failure(
                f"{what}: desired spec.version {raw_version!r} is not a k0s version")
        if not namespace or not name:
            return UpdateMachineResponse.failure(f"{what}: desired machine has no name or "
                                                 f"namespace")

        try:
            machine = await self.mgmt.get(MACHINES, name, namespace)
        except NotFoundError:
            return UpdateMachineResponse.failure(f"{what} not found in the management cluster")
        # The live Machine's cluster, never the request's.
        cluster = str((machine.get("spec") or {}).get("clusterName") or "")
        if not cluster:
            return UpdateMachineResponse.failure(f"{what} has no spec.clusterName")
        node_name = node_name_of(machine)
        plan_name = nodeplan_name(name, version)

        node = await self._observe(namespace, cluster, node_name)
        refusals = check_update_machine(await self._subject(machine, version, cluster, node))
        if refusals:
            message = refusal_message(what, refusals)
            log.warning("UpdateMachine %s", message)
            return UpdateMachineResponse.failure(message)

        plan = await self.mgmt.get_or_none(NODE_PLANS, plan_name, namespace)
        if plan is None:
            if node is not None and node.runs(version):
                return UpdateMachineResponse(
                    status=ResponseStatus.SUCCESS,
                    message=f"{what}: node {node_name} already runs k0s {version} and is Ready")
            if node is not None and (node.error or not node.found):
                # Nothing could carry the request out (or we cannot see): no blind dispatch.
                return UpdateMachineResponse(
                    status=ResponseStatus.SUCCESS, retry_after_seconds=UNOBSERVABLE_RETRY_SECONDS,
                    message=f"{what}: waiting to dispatch: {node.describe()}")
            executor = "agent"
            if self.cluster_settings is not None:
                settings = await self._settings(namespace, cluster)
                if settings.paused:
                    return UpdateMachineResponse(
                        status=ResponseStatus.SUCCESS, retry_after_seconds=PAUSED_RETRY_SECONDS,
                        message=f"{what}: cluster {namespace}/{cluster} is paused in the fleet "
                                f"config; not dispatching")
                executor = str(settings.executor)
            if self.policy_hold is not None:
                held = await self.policy_hold(machine, namespace, cluster)
                if held is not None:
                    return UpdateMachineResponse(
                        status=ResponseStatus.SUCCESS, retry_after_seconds=HELD_RETRY_SECONDS,
                        message=f"{what}: not yet: {held}")
            try:
                # Fenced like the controller's writes for this cluster (fleet.world.fence).
                with writes_for((namespace, cluster)):
                    plan = await self._dispatch(machine, node_name, version, node, executor)
            except DownloadResolutionError as e:
                return UpdateMachineResponse.failure(f"{what}: {e}")
            except FencedError as e:
                return UpdateMachineResponse(
                    status=ResponseStatus.SUCCESS, retry_after_seconds=FENCED_RETRY_SECONDS,
                    message=f"{what}: not dispatched by this replica: {e}")
            log.info("UpdateMachine %s: dispatched as NodePlan %s", what, plan_name)
        return update_progress(plan, node, version, table=self.retry_table)

    async def _subject(self, machine: KubeObject, version: str, cluster: str,
                       node: NodeObservation | None) -> UpdateSubject:
        """What the checks need, read from the management cluster now."""
        namespace = machine["metadata"]["namespace"]
        info = machine_from(machine)
        drives = await self.drives(namespace, cluster) if self.drives is not None else False
        owner_found, owner_target = False, None
        owner = info.owner
        if owner is not None:
            res = MACHINE_DEPLOYMENTS if owner.kind == KIND_MD else K0S_CONTROL_PLANES
            obj = await self.mgmt.get_or_none(res, owner.name, namespace)
            if obj is not None:
                owner_found = True
                owner_target = ((obj.get("metadata") or {}).get("annotations") or {}).get(
                    ANN_WRITTEN_VERSION) or None
        control_planes, workers = await self.cluster_versions(
            namespace, cluster, exclude=machine["metadata"]["name"])
        node_version = node.running_version if node is not None else None
        return UpdateSubject(
            requested=version, machine=machine, role=machine_role(machine), drives=drives,
            owner_kind=owner.kind if owner is not None else "",
            owner_name=owner.name if owner is not None else "",
            owner_found=owner_found, owner_target=owner_target,
            node_version=node_version or info.annotations.get(ANN_MACHINE_RUNNING_VERSION),
            control_planes=tuple(control_planes), workers=tuple(workers))

    async def cluster_versions(self, namespace: str, cluster: str, *, exclude: str = ""
                               ) -> tuple[list[str], list[str]]:
        """What the cluster's control planes and workers run, as far as the management
        cluster tells: its Machines (their running-version record, else ``spec.version``;
        ``exclude`` left out) and its control plane object (:meth:`_control_plane_versions`);
        the skew rules count the oldest."""
        listed = await self.mgmt.list(MACHINES, namespace,
                                      label_selector=f"{LABEL_CLUSTER_NAME}={cluster}")
        control_planes: list[str] = []
        workers: list[str] = []
        for m in listed.items:
            if exclude and m["metadata"].get("name") == exclude:
                continue
            other = machine_from(m)
            if other.cluster != cluster or other.deleting:
                continue
            running = other.annotations.get(ANN_MACHINE_RUNNING_VERSION) or other.version
            if running:
                (control_planes if other.role == "controller" else workers).append(running)
        control_planes.extend(await self._control_plane_versions(
            namespace, cluster, machines_seen=bool(control_planes)))
        return control_planes, workers

    async def _control_plane_versions(self, namespace: str, cluster: str, *,
                                      machines_seen: bool = False) -> list[str]:
        """The versions the cluster's control plane object names: ``spec.version``, and
        ``status.version`` of a hosted one (what its pods run). A K0sControlPlane's
        ``status.version`` is only k0smotron's minimum over the Machines' ``spec.version``,
        and a stale one: k0smotron v2.1.0 does not recompute it while the KCP is paused
        (k0s-fleet's executor pauses it for the whole control-plane upgrade) and after the
        unpause it lags (docs/capi.md). So it counts only where no control-plane Machine
        was seen (``machines_seen``); otherwise the Machines say it first-hand."""
        obj = await self.mgmt.get_or_none(CLUSTERS, cluster, namespace)
        ref = ((obj or {}).get("spec") or {}).get("controlPlaneRef") or {}
        kind = ref.get("kind") if isinstance(ref, Mapping) else None
        if kind not in (KIND_KCP, KIND_HOSTED_CP) or not ref.get("name"):
            return []
        # a hosted control plane (K0smotronControlPlane): status.version is what its pods
        # run, as k0smotron reports it
        res = K0S_CONTROL_PLANES if kind == KIND_KCP else K0SMOTRON_CONTROL_PLANES
        kcp = await self.mgmt.get_or_none(res, str(ref["name"]), namespace)
        if kcp is None:
            return []
        found = [(kcp.get("spec") or {}).get("version")]
        if kind == KIND_HOSTED_CP or not machines_seen:
            found.append((kcp.get("status") or {}).get("version"))
        return [str(v) for v in found if v]

    async def _observe(self, namespace: str, cluster: str,
                       node_name: str) -> NodeObservation | None:
        if self.workload_client is None:
            return None
        try:
            client = await self.workload_client(namespace, cluster)
            return observe_node(node_name, await client.get_or_none(NODES, node_name))
        except KubeError as e:
            return NodeObservation.unobservable(node_name, str(e) or type(e).__name__)
        except Exception as e:  # the registry is someone else's code: report, never crash
            log.warning("workload client for %s/%s failed: %r", namespace, cluster, e)
            return NodeObservation.unobservable(node_name, f"{type(e).__name__}: {e}")

    async def _settings(self, namespace: str, cluster: str) -> ClusterSettings:
        assert self.cluster_settings is not None
        obj = await self.mgmt.get_or_none(CLUSTERS, cluster, namespace)
        labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
        return self.cluster_settings(namespace, cluster, labels)

    async def _dispatch(self, machine: KubeObject, node_name: str, version: str,
                        node: NodeObservation | None, executor: str) -> KubeObject:
        """Create (or adopt) the NodePlan, under a span the node's upgrade trace joins."""
        meta = machine["metadata"]
        machine_tp = (meta.get("annotations") or {}).get(TRACEPARENT_ANNOTATION)
        if self.tracer is None:
            return await self._ensure_plan(machine, node_name, version, node, executor,
                                           traceparent=machine_tp)
        link = link_from_traceparent(machine_tp)
        with self.tracer.start_as_current_span(
                "UpdateMachine dispatch", links=[link] if link else None,
                attributes={"k8s.namespace.name": meta["namespace"],
                            "capi.machine": meta["name"], "k0s.version": version,
                            "k8s.node.name": node_name}):
            return await self._ensure_plan(machine, node_name, version, node, executor,
                                           traceparent=current_traceparent())

    async def _ensure_plan(self, machine: KubeObject, node_name: str, version: str,
                           node: NodeObservation | None, executor: str, *,
                           traceparent: str | None) -> KubeObject:
        meta = machine["metadata"]
        artifact = await self.artifacts.resolve(
            version, node.architecture if node is not None else None)
        owner_kind, owner_name = machine_owner(machine)
        body = nodeplan_to_dispatch(
            machine=machine, node_name=node_name, role=machine_role(machine),
            version=version, artifact=artifact, executor=executor, source=SOURCE,
            owner_kind=owner_kind, owner_name=owner_name, traceparent=traceparent,
            node_policy=self.node_policy)
        outcome = await create_or_adopt_nodeplan(self.mgmt, body, attempts=3)
        if outcome.plan is None:
            raise KubeError(f"NodePlan {meta['namespace']}/{body['metadata']['name']} keeps "
                            f"appearing and vanishing")
        return outcome.plan
