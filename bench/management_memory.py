"""Memory of the management caches, per kind: N clusters' CAPI objects held whole (as
before fleet/world/kept.py) and as kept projections, measured with tracemalloc in this process.

Each cluster is what fleet/testing/capi.py's ``create_cluster`` writes (a Cluster, its
kubeconfig Secret, a K0sControlPlane with 3 control-plane Machines, a MachineDeployment
with a MachineSet and 7 worker Machines), as the API server returns it (uid,
resourceVersion, managedFields); with ``--capi-status`` also with the status a Cluster API
manager writes (conditions, addresses, nodeInfo, v1beta1 conditions). The objects go
through ``ObjectCache.observe`` exactly as watch events do; the bytes counted are those
still allocated once the caches hold them (the parse memo and snapshot are not included).

    .venv/bin/python bench/management_memory.py --clusters 100 [--capi-status]
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import sys
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleet.kube.cache import ObjectCache
from fleet.kube.resources import (
    CLUSTERS,
    K0S_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    SECRETS,
    Resource,
)
from fleet.testing.capi import (
    cluster_object,
    control_plane_machine_object,
    control_plane_object,
    deployment_object,
    machine_set_object,
    worker_machine_object,
)
from fleet.world.clusters import kubeconfig_secret
from fleet.world.kept import projection

NS, V, NOW = "fleet", "v1.31.2+k0s.0", "2026-01-01T00:00:00Z"
KINDS = (MACHINES, K0S_CONTROL_PLANES, MACHINE_DEPLOYMENTS, MACHINE_SETS, CLUSTERS, SECRETS)


def _kubeconfig(name: str) -> dict[str, Any]:
    """A kubeconfig as CAPI writes it (client certificate and key, CA)."""
    return {"apiVersion": "v1", "kind": "Config", "current-context": name,
            "clusters": [{"name": name, "cluster": {
                "server": f"https://{name}.example:6443",
                "certificate-authority-data": "Q" * 1500}}],
            "users": [{"name": f"{name}-admin", "user": {
                "client-certificate-data": "C" * 1600, "client-key-data": "K" * 2300}}],
            "contexts": [{"name": name, "context": {"cluster": name,
                                                    "user": f"{name}-admin"}}]}


def _conditions(*types: str) -> list[dict[str, Any]]:
    return [{"type": t, "status": "True", "reason": t, "observedGeneration": 2,
             "lastTransitionTime": NOW} for t in types]


def _served(res: Resource, body: dict[str, Any], n: int, status: dict[str, Any] | None
            ) -> dict[str, Any]:
    obj = copy.deepcopy(body)
    obj.setdefault("apiVersion", res.api_version)
    obj.setdefault("kind", res.kind)
    meta = obj["metadata"]
    meta.update(uid=f"{n:08d}-0000-0000-0000-{n:012d}", resourceVersion=str(1000 + n),
                generation=2, creationTimestamp=NOW, managedFields=[
                    {"manager": m, "operation": "Update", "apiVersion": res.api_version,
                     "time": NOW, "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:metadata": {"f:labels": {"f:x": {}}},
                                  "f:spec": {f"f:{k}": {} for k in (body.get("spec") or {})}}}
                    for m in ("manager", "capi")])
    if status is not None:
        obj["status"] = status
    return obj


def cluster_objects(i: int, capi_status: bool) -> dict[Resource, list[dict[str, Any]]]:
    name = f"c{i:04d}"
    md, ms = f"{name}-md", f"{name}-md-ms"
    owner = {"apiVersion": CLUSTERS.api_version, "kind": "Cluster", "name": name, "uid": "u"}
    kcp_owner = {"apiVersion": K0S_CONTROL_PLANES.api_version, "kind": "K0sControlPlane",
                 "name": f"{name}-cp", "uid": "u", "controller": True}

    def machine_status(node: str) -> dict[str, Any] | None:
        base: dict[str, Any] = {"nodeRef": {"apiVersion": "v1", "kind": "Node", "name": node},
                                "phase": "Running"}
        if capi_status:
            base.update(
                bootstrapReady=True, infrastructureReady=True, observedGeneration=2,
                addresses=[{"type": "InternalIP", "address": "10.0.0.9"},
                           {"type": "Hostname", "address": node}],
                nodeInfo={"kubeletVersion": "v1.31.2+k0s", "architecture": "amd64",
                          "machineID": "0" * 32, "systemUUID": "1" * 36, "bootID": "2" * 36,
                          "kernelVersion": "6.1.0-18-amd64", "osImage": "Debian 12",
                          "containerRuntimeVersion": "containerd://1.7.20",
                          "kubeProxyVersion": "v1.31.2", "operatingSystem": "linux"},
                conditions=_conditions("Available", "Ready", "UpToDate", "BootstrapConfigReady",
                                       "InfrastructureReady", "NodeReady", "NodeHealthy",
                                       "Deleting", "Paused"),
                deprecated={"v1beta1": {"conditions": _conditions(
                    "Ready", "BootstrapReady", "InfrastructureReady", "NodeHealthy")}})
        return base

    rollout = ({"conditions": _conditions("Available", "MachinesReady", "MachinesUpToDate",
                                          "RollingOut", "ScalingUp", "ScalingDown",
                                          "Remediating", "Deleting", "Paused"),
                "replicas": 3, "readyReplicas": 3, "availableReplicas": 3,
                "upToDateReplicas": 3, "observedGeneration": 2,
                "selector": f"cluster.x-k8s.io/cluster-name={name}"}
               if capi_status else None)
    n = i * 100
    out: dict[Resource, list[dict[str, Any]]] = {
        CLUSTERS: [_served(CLUSTERS, cluster_object(NS, name), n, {
            "phase": "Provisioned", "conditions": _conditions(
                "Available", "InfrastructureReady", "ControlPlaneInitialized",
                "ControlPlaneAvailable", "WorkersAvailable", "RemoteConnectionProbe")}
            if capi_status else None)],
        SECRETS: [_served(SECRETS, kubeconfig_secret(f"{name}-kubeconfig", NS, name,
                                                     _kubeconfig(name)), n + 1, None)],
        K0S_CONTROL_PLANES: [_served(K0S_CONTROL_PLANES, control_plane_object(
            NS, name, V, 3, owner), n + 2, rollout)],
        MACHINE_DEPLOYMENTS: [_served(MACHINE_DEPLOYMENTS, deployment_object(
            NS, name, V, 7), n + 3, rollout)],
        MACHINE_SETS: [_served(MACHINE_SETS, machine_set_object(NS, name, V, 7), n + 4,
                               rollout)],
        MACHINES: [],
    }
    for j in range(3):
        m = f"{name}-cp-{j}"
        out[MACHINES].append(_served(MACHINES, control_plane_machine_object(
            NS, name, m, V, kcp_owner), n + 10 + j, machine_status(m)))
    for j in range(7):
        m = f"{name}-md-{j}"
        out[MACHINES].append(_served(MACHINES, worker_machine_object(
            NS, name, m, V, md=md, ms=ms), n + 20 + j, machine_status(m)))
    return out


def measure(clusters: int, capi_status: bool, keep: bool) -> dict[str, float]:
    """Bytes per cluster each kind's cache holds."""
    out: dict[str, float] = {}
    for res in KINDS:
        objs = [json.dumps(o) for i in range(clusters)
                for o in cluster_objects(i, capi_status)[res]]
        gc.collect()
        tracemalloc.start()
        cache = ObjectCache(res.kind, keep=projection(res) if keep else None)
        for raw in objs:
            cache.observe(json.loads(raw))  # each object decoded as a watch event is
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out[res.kind] = held / clusters
        del cache
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clusters", type=int, default=100)
    p.add_argument("--capi-status", action="store_true",
                   help="objects with the status a Cluster API manager writes")
    args = p.parse_args()
    whole = measure(args.clusters, args.capi_status, keep=False)
    kept = measure(args.clusters, args.capi_status, keep=True)
    print(f"{'bytes per cluster':20} {'whole':>9} {'kept':>9}")
    for kind in whole:
        print(f"{kind:20} {whole[kind]:9.0f} {kept[kind]:9.0f}")
    print(f"{'total':20} {sum(whole.values()):9.0f} {sum(kept.values()):9.0f}")
    print(json.dumps({"clusters": args.clusters, "capi_status": args.capi_status,
                      "whole": whole, "kept": kept}))


if __name__ == "__main__":
    main()
