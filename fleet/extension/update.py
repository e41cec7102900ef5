"""The UpdateMachine hook: create (or find) the Machine's NodePlan and report on it.

Idempotent by construction: the NodePlan's name is a function of (Machine, version)
(:func:`fleet.nodeplan.nodeplan_name`), so every call, from any replica, concurrent or
not, and the standalone controller too, names the same object. Creating it is the
unit of dispatch; AlreadyExists means someone already dispatched, and we adopt that
NodePlan whatever its source. This module never drives the NodePlan: the controller's
NodePlan reconciler signals the node and mirrors its state into the NodePlan status;
we only create it and read it (plus the workload Node, for the final check).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry.trace import Tracer

from fleet.config import (
    ClusterSettings,
    DownloadResolutionError,
    DownloadSettings,
    digest_manifest_url,
    resolve_download,
)
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
    AlreadyExistsError,
    KubeClient,
    KubeError,
    KubeObject,
    NotFoundError,
    UnreachableError,
)
from fleet.kube.resources import CLUSTERS, MACHINES, NODE_PLANS, NODES
from fleet.model import EXECUTOR_AGENT, NODEPLAN_FINALIZER
from fleet.nodeplan import TRACEPARENT_ANNOTATION, build_nodeplan, nodeplan_name
from fleet.rollout.hookgate import HELD_RETRY_SECONDS
from fleet.signal import NodePolicy
from fleet.telemetry import current_traceparent, link_from_traceparent
from fleet.versions import InvalidVersionError, K0sVersion

log = logging.getLogger(__name__)

SOURCE = "runtime-extension"
LABEL_CONTROL_PLANE = "cluster.x-k8s.io/control-plane"
LABEL_DEPLOYMENT_NAME = "cluster.x-k8s.io/deployment-name"
DEFAULT_ARCH = "amd64"

PAUSED_RETRY_SECONDS = 30

# (namespace, cluster name) -> a client for that workload cluster. The controller's
# cluster registry provides it (one cached client per cluster, from <name>-kubeconfig).
WorkloadClientGetter = Callable[[str, str], Awaitable[KubeClient]]
# (namespace, cluster name, Cluster labels) -> that cluster's effective fleet settings;
# normally ``FleetConfig.for_cluster``.
ClusterSettingsGetter = Callable[[str, str, Mapping[str, str]], ClusterSettings]


@dataclass(frozen=True, slots=True)
class ArtifactRequest:
    machine: Mapping[str, Any]
    version: str
    role: str
    architecture: str | None


@dataclass(frozen=True, slots=True)
class Artifact:
    url: str
    sha256: str | None = None
    allow_unverified: bool = False


class ArtifactError(Exception):
    """No usable download for this version/architecture; the message says what to set."""


ArtifactResolver = Callable[[ArtifactRequest], Awaitable[Artifact]]


# Fetches and parses a digest manifest (sha256sums) from its URL; the controller's
# HTTP layer provides it. Without one, a configured manifest is not consulted.
ManifestFetcher = Callable[[str], Awaitable[Mapping[str, str]]]


@dataclass(frozen=True)
class ConfigArtifacts:
    """The fleet config's download policy (:func:`fleet.config.resolve_download`).

    An unknown architecture defaults to amd64 (real Nodes always report theirs).
    """

    download: DownloadSettings = field(default_factory=DownloadSettings)
    fetch_manifest: ManifestFetcher | None = None

    async def __call__(self, req: ArtifactRequest) -> Artifact:
        arch = req.architecture or DEFAULT_ARCH
        manifest = None
        manifest_url = digest_manifest_url(self.download, req.version)
        if manifest_url is not None and self.fetch_manifest is not None:
            try:
                manifest = await self.fetch_manifest(manifest_url)
            except Exception as e:  # someone else's HTTP: report as a resolution problem
                raise ArtifactError(f"digest manifest {manifest_url}: {e}") from e
        try:
            url, digest = resolve_download(self.download, req.version, arch, manifest=manifest)
        except DownloadResolutionError as e:
            raise ArtifactError(str(e)) from e
        return Artifact(url=url, sha256=digest,
                        allow_unverified=digest is None and self.download.allow_unverified)


class _Registry(Protocol):
    def client(self, key: tuple[str, str]) -> KubeClient | None: ...


def workload_client_from_registry(registry: _Registry) -> WorkloadClientGetter:
    """Adapt the controller's :class:`fleet.clusters.ClusterRegistry` (cached clients)."""

    async def get(namespace: str, cluster: str) -> KubeClient:
        client = registry.client((namespace, cluster))
        if client is None:
            raise UnreachableError(
                f"workload cluster {namespace}/{cluster} is not connected (not one of the "
                f"fleet's clusters, or its kubeconfig Secret is missing or unusable)")
        return client

    return get


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
    resolve_artifact: ArtifactResolver = field(default_factory=ConfigArtifacts)
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

    async def handle(self, req: UpdateMachineRequest) -> UpdateMachineResponse:
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
        if not namespace:
            return UpdateMachineResponse.failure(f"{what}: desired machine has no namespace")

        try:
            machine = await self.mgmt.get(MACHINES, name, namespace)
        except NotFoundError:
            return UpdateMachineResponse.failure(f"{what} not found in the management cluster")
        cluster = str((machine.get("spec") or {}).get("clusterName")
                      or (desired.get("spec") or {}).get("clusterName") or "")
        if not cluster:
            return UpdateMachineResponse.failure(f"{what} has no spec.clusterName")
        machine.setdefault("spec", {})["clusterName"] = cluster
        node_name = node_name_of(machine)
        plan_name = nodeplan_name(name, version)

        plan = await self.mgmt.get_or_none(NODE_PLANS, plan_name, namespace)
        node = await self._observe(namespace, cluster, node_name)
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
                plan = await self._dispatch(machine, node_name, version, node, executor)
            except ArtifactError as e:
                return UpdateMachineResponse.failure(f"{what}: {e}")
            log.info("UpdateMachine %s: dispatched as NodePlan %s", what, plan_name)
        return update_progress(plan, node, version, table=self.retry_table)

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
        role = machine_role(machine)
        artifact = await self.resolve_artifact(ArtifactRequest(
            machine=machine, version=version, role=role,
            architecture=node.architecture if node is not None else None))
        owner_kind, owner_name = machine_owner(machine)
        body = build_nodeplan(
            machine=machine, node_name=node_name, role=role, version=version,
            url=artifact.url, sha256=artifact.sha256,
            allow_unverified=artifact.allow_unverified, executor=executor,
            source=SOURCE, owner_kind=owner_kind, owner_name=owner_name,
            traceparent=traceparent,
            node_policy=self.node_policy if executor == EXECUTOR_AGENT else None,
        )
        # Like the controller's own: its NodePlan reconciler takes the request off the
        # node (and uncordons) before a deleted NodePlan goes away.
        body["metadata"]["finalizers"] = [NODEPLAN_FINALIZER]
        name = body["metadata"]["name"]
        for _ in range(3):
            try:
                return await self.mgmt.create(NODE_PLANS, body)
            except AlreadyExistsError:
                existing = await self.mgmt.get_or_none(NODE_PLANS, name, meta["namespace"])
                if existing is not None:
                    return existing
                # deleted between our create and get: try again
        raise KubeError(f"NodePlan {meta['namespace']}/{name} keeps appearing and vanishing")

