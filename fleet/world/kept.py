"""What the controller keeps of each management object (projections for
:class:`fleet.kube.cache.ObjectCache`'s ``keep``).

At a thousand clusters the management objects as the API server sends them (Machines,
K0sControlPlanes, MachineDeployments, MachineSets, Clusters, kubeconfig Secrets) were the
largest item of the controller's memory. Of each, only what a reader uses is kept:

* the snapshot's parsers (:mod:`fleet.world.model`: ``cluster_from``, ``deployment_from``,
  ``machine_set_from``, ``control_plane_from``, ``machine_from``), whose result on the
  kept subset equals their result on the whole object (tests/unit/test_kept.py);
* the dispatcher's writes, whose mutations read versions and annotations and whose
  rollout-status write merges its conditions into ``status.conditions`` (kept whole, with
  ``status.k0sFleet``, for every kind that carries a rollout status);
* NodePlan bodies (a Machine's name, namespace, uid, cluster) and Events (kind,
  apiVersion, name, namespace, uid);
* the workload-cluster registry (a kubeconfig Secret's ``value``, nothing else of it).

A value of an unexpected type where a mapping is expected is kept as it is, so a parser
fails on the kept subset exactly as it would on the whole object. What is not listed
here (status of Machines beyond ``nodeRef``, bootstrap references, selectors, templates'
metadata, other Secret keys, ...) is dropped on ingest; a reader that needs more must
read the object from the API server.

A sharded replica (several active replicas, each acting on its own shards) keeps less
of the objects of a cluster it does not hold ("foreign": :data:`FOREIGN_SPECS`): of a
Machine what the fleet-wide rollout judges a foreign cluster by (owner, version record,
node, annotations), no uid, type or infrastructure reference; of a kubeconfig Secret its
name and labels only (the registry connects to held clusters only). The foreign subset
is a subset of the held one, so projecting a held copy again gives what projecting the
object would. Taking a shard re-reads its clusters' objects before acting on them
(:meth:`fleet.controllers.takeover.ShardTakeover.warm_taken`); giving one back
projects them down again (:meth:`fleet.kube.cache.ObjectCache.rekeep`).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from fleet.kube.resources import (
    CLUSTERS,
    K0S_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    SECRETS,
    Resource,
)

KubeObject = dict[str, Any]
ClusterKey = tuple[str, str]  # (namespace, name), as fleet.world.model's
Projection = Callable[[KubeObject], KubeObject]

# A projection spec: per key, True (keep the value whole), a nested spec (keep that
# subset of a mapping), or a function of the value.
Spec: TypeAlias = "Mapping[str, bool | Spec | Callable[[Any], Any]]"


def project(value: Any, spec: Spec) -> Any:
    """The subset of ``value`` that ``spec`` names (``value`` itself if not a mapping)."""
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, sub in spec.items():
        if key not in value:
            continue
        v = value[key]
        if sub is True:
            out[key] = v
        elif isinstance(sub, Mapping):
            out[key] = project(v, sub)
        elif callable(sub):
            out[key] = sub(v)
    return out


def _kubeconfig_text(secret: KubeObject) -> KubeObject:
    """A kubeconfig Secret as its ``value`` decoded (``stringData``, which the reader
    takes when ``data`` has no ``value``): a quarter smaller than base64. A value that is
    not base64 UTF-8 text is kept as it is, for the reader to report."""
    kept: KubeObject = project(secret, {"metadata": _meta("labels"),
                                        "data": {"value": True},
                                        "stringData": {"value": True}})
    data = kept.get("data")
    if isinstance(data, dict) and isinstance(data.get("value"), str):
        try:
            text = base64.b64decode(data["value"], validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            return kept
        kept["stringData"] = {"value": text}
        del kept["data"]
    return kept


def _without_k0s(value: Any) -> Any:
    """k0sConfigSpec less ``k0s`` (dynamic config: read by nothing here)."""
    if not isinstance(value, dict):
        return value
    return {k: v for k, v in value.items() if k != "k0s"}


def _meta(*keys: str) -> Spec:
    """metadata: identity and resourceVersion, and ``keys``."""
    return {k: True for k in ("name", "namespace", "resourceVersion", *keys)}


_TYPE: Spec = {"apiVersion": True, "kind": True}  # Events name their object by them
# status written by the controller (SetRolloutStatus merges into the conditions)
_ROLLOUT_STATUS: Spec = {"conditions": True, "k0sFleet": True}
_MACHINE_TEMPLATE_SPEC: Spec = {
    "clusterName": True, "version": True, "bootstrap": {"configRef": True},
    "infrastructureRef": True, "failureDomain": True,
}

SPECS: dict[Resource, Spec] = {
    CLUSTERS: {**_TYPE, "metadata": _meta("uid", "labels", "annotations"),
               "spec": {"paused": True}},
    MACHINE_DEPLOYMENTS: {
        **_TYPE, "metadata": _meta("uid", "annotations"), "status": _ROLLOUT_STATUS,
        "spec": {"clusterName": True, "replicas": True, "paused": True,
                 "rollout": {"strategy": True}, "strategy": True,
                 "template": {"spec": _MACHINE_TEMPLATE_SPEC}}},
    MACHINE_SETS: {
        **_TYPE, "metadata": _meta("uid", "labels", "annotations", "creationTimestamp"),
        "status": _ROLLOUT_STATUS,
        "spec": {"clusterName": True, "replicas": True, "template": {"spec": {
            k: v for k, v in _MACHINE_TEMPLATE_SPEC.items() if k != "clusterName"}}}},
    K0S_CONTROL_PLANES: {
        **_TYPE, "metadata": _meta("uid", "labels", "annotations"), "status": _ROLLOUT_STATUS,
        "spec": {"replicas": True, "version": True, "updateStrategy": True,
                 "machineTemplate": {"infrastructureRef": True},
                 "k0sConfigSpec": _without_k0s}},
    MACHINES: {
        **_TYPE, "metadata": _meta("uid", "labels", "annotations", "creationTimestamp",
                                   "deletionTimestamp", "ownerReferences"),
        "spec": {"clusterName": True, "version": True, "infrastructureRef": True},
        "status": {"nodeRef": {"name": True}}},
}


CAPI_CLUSTER_LABEL = "cluster.x-k8s.io/cluster-name"


def _owner_names(value: Any) -> Any:
    """ownerReferences as kind and name (what a foreign Machine's owner is read from)."""
    if not isinstance(value, list):
        return value
    return [project(ref, {"kind": True, "name": True}) for ref in value]


# What is kept of a foreign cluster's object (a subset of the held spec of its kind).
FOREIGN_SPECS: dict[Resource, Spec] = {
    MACHINES: {
        "metadata": {**_meta("labels", "annotations", "creationTimestamp",
                             "deletionTimestamp"), "ownerReferences": _owner_names},
        "spec": {"clusterName": True, "version": True},
        "status": {"nodeRef": {"name": True}}},
    SECRETS: {"metadata": _meta("labels")},
}


def cluster_of(res: Resource, obj: KubeObject) -> ClusterKey | None:
    """The cluster an object of ``res`` belongs to: Cluster API's cluster-name label (a
    Machine's ``spec.clusterName`` without it); None when it names none."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return None
    labels = meta.get("labels")
    name = labels.get(CAPI_CLUSTER_LABEL) if isinstance(labels, dict) else None
    if not name and res in (MACHINES, MACHINE_DEPLOYMENTS, MACHINE_SETS):
        spec = obj.get("spec")
        name = spec.get("clusterName") if isinstance(spec, dict) else None
    if not isinstance(name, str) or not name:
        return None
    return (str(meta.get("namespace") or ""), name)


def _held_projection(res: Resource) -> Projection | None:
    if res is SECRETS:
        # the kubeconfig (``value``) and the cluster-name label (which cluster it is for)
        return _kubeconfig_text
    spec = SPECS.get(res)
    if spec is None:
        return None

    def keep(obj: KubeObject) -> KubeObject:
        kept: KubeObject = project(obj, spec)
        return kept

    return keep


def projection(res: Resource, holds: Callable[[ClusterKey], bool] | None = None
               ) -> Projection | None:
    """What to keep of an object of ``res`` (None: keep it whole). ``holds`` (sharded
    replicas): whether this replica holds a cluster; an object of a cluster it does not
    hold is kept as :data:`FOREIGN_SPECS` says (an object naming no cluster in full)."""
    held = _held_projection(res)
    foreign = FOREIGN_SPECS.get(res)
    if holds is None or held is None or foreign is None:
        return held

    def keep(obj: KubeObject) -> KubeObject:
        cluster = cluster_of(res, obj)
        if cluster is None or holds(cluster):
            return held(obj)
        kept: KubeObject = project(obj, foreign)
        return kept

    return keep


def foreign(res: Resource, holds: Callable[[ClusterKey], bool] | None = None
            ) -> Callable[[KubeObject], bool] | None:
    """Whether an object of ``res`` belongs to a cluster this sharded replica does not hold
    (None: not sharded, or a kind not kept by cluster). Such an object is only looked at
    (the fleet-wide rollout reads its cluster's progress, kept per cluster:
    :func:`fleet.rollout.progress.foreign_digest`): the cache keeps it compressed
    (:data:`FOREIGN_ZDICT`) and remembers no parse of it. One naming no cluster is held."""
    if holds is None or (res not in SPECS and res not in FOREIGN_SPECS):
        return None

    def is_foreign(obj: KubeObject) -> bool:
        cluster = cluster_of(res, obj)
        if res is CLUSTERS:  # a Cluster is its own cluster
            meta = obj.get("metadata")
            if isinstance(meta, dict) and isinstance(meta.get("name"), str):
                cluster = (str(meta.get("namespace") or ""), meta["name"])
        return cluster is not None and not holds(cluster)

    return is_foreign


# The vocabulary of the kept subsets of Cluster API objects (field names, Cluster API's
# labels and annotations, kinds, API groups): the preset dictionary a foreign object's
# kept JSON is compressed against (deflate finds its long strings there, so even an
# object of a few hundred bytes compresses well). Later entries are found most cheaply.
FOREIGN_ZDICT = "".join((
    '"finalizers"', '"paused":false', '"paused":true', '"failureDomain":"',
    '"maxUnavailable":', '"maxSurge":', '"rollingUpdate":{', '"type":"RollingUpdate"',
    '"updateStrategy":"InPlace"', '"k0sConfigSpec":{"args":["', '"status":"True"',
    '"status":"False"', '"reason":"', '"message":"', '"lastTransitionTime":"',
    '"k0sFleet":{', '"conditions":[{"type":"', '"replicas":', '"template":{"spec":{',
    '"bootstrap":{"configRef":{"apiGroup":"bootstrap.cluster.x-k8s.io",'
    '"kind":"K0sWorkerConfigTemplate","name":"',
    '"infrastructureRef":{"apiGroup":"infrastructure.cluster.x-k8s.io","kind":"',
    '"machineTemplate":{"infrastructureRef":{"apiGroup":"',
    '{"apiVersion":"controlplane.cluster.x-k8s.io/v1beta2","kind":"K0sControlPlane",',
    '{"apiVersion":"cluster.x-k8s.io/v1beta2","kind":"MachineSet",',
    '{"apiVersion":"cluster.x-k8s.io/v1beta2","kind":"MachineDeployment",',
    '{"apiVersion":"cluster.x-k8s.io/v1beta2","kind":"Cluster",',
    '"uid":"', '"spec":{"clusterName":"', '"version":"v1.3', '+k0s.0"},',
    '"k0s.controlplane.cluster.x-k8s.io/k0s-config":"{\\"args\\": [\\"',
    '"k0s-fleet.io/', '"annotations":{', '"deletionTimestamp":"',
    '"ownerReferences":[{"kind":"K0sControlPlane","name":"',
    '"ownerReferences":[{"kind":"MachineSet","name":"',
    '"cluster.x-k8s.io/control-plane":"true","cluster.x-k8s.io/control-plane-name":"',
    '"cluster.x-k8s.io/deployment-name":"', '"cluster.x-k8s.io/set-name":"',
    '"status":{"nodeRef":{"name":"', '"creationTimestamp":"20',
    '{"metadata":{"name":"', '"namespace":"', '"labels":{"cluster.x-k8s.io/cluster-name":"',
)).encode()


__all__ = ["CAPI_CLUSTER_LABEL", "FOREIGN_SPECS", "FOREIGN_ZDICT", "SPECS", "Spec",
           "cluster_of", "foreign", "project", "projection"]
