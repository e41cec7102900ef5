"""Node objects of realistic size, as a k0s kubelet registers them (about 14 KB of JSON).

A real Node carries what the planner never reads: tens of container images with their
digests, managedFields of every writer, addresses, capacity, daemon endpoints. Scale
measurements need that weight, so a simulated Node has it too (deterministic per name).
"""

from __future__ import annotations

import hashlib
from typing import Any

from fleet.world.reported import kubelet_version

IMAGE_COUNT = 52
TIME = "2026-11-01T08:00:00Z"


def _hex(seed: str, n: int = 64) -> str:
    out = ""
    i = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}/{i}".encode()).hexdigest()
        i += 1
    return out[:n]


def _images(name: str) -> list[dict[str, Any]]:
    images = []
    for i in range(IMAGE_COUNT):
        repo = f"quay.io/k0sproject/workload-{i:02d}" if i % 3 else \
            f"registry.k8s.io/app/component-{i:02d}"
        digest = _hex(f"{repo}")
        images.append({"names": [f"{repo}@sha256:{digest}", f"{repo}:v1.{i}.{i % 7}"],
                       "sizeBytes": 10_000_000 + int(_hex(f"{name}{i}", 6), 16)})
    return images


def _managed_fields() -> list[dict[str, Any]]:
    return [
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": TIME,
         "fieldsType": "FieldsV1", "fieldsV1": {
             "f:metadata": {"f:annotations": {".": {}, "f:node.alpha.kubernetes.io/ttl": {},
                                              "f:volumes.kubernetes.io/controller-managed-"
                                              "attach-detach": {}},
                            "f:labels": {".": {}, "f:beta.kubernetes.io/arch": {},
                                         "f:beta.kubernetes.io/os": {},
                                         "f:kubernetes.io/arch": {},
                                         "f:kubernetes.io/hostname": {},
                                         "f:kubernetes.io/os": {}}},
             "f:spec": {"f:podCIDR": {}, "f:podCIDRs": {".": {}, 'v:"10.244.0.0/24"': {}}}}},
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": TIME,
         "subresource": "status", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {
             "f:allocatable": {"f:cpu": {}, "f:ephemeral-storage": {}, "f:memory": {},
                               "f:pods": {}},
             "f:capacity": {"f:cpu": {}, "f:ephemeral-storage": {}, "f:memory": {},
                            "f:pods": {}},
             "f:conditions": {f'k:{{"type":"{t}"}}': {
                 ".": {}, "f:lastHeartbeatTime": {}, "f:lastTransitionTime": {},
                 "f:message": {}, "f:reason": {}, "f:status": {}, "f:type": {}}
                 for t in ("DiskPressure", "MemoryPressure", "PIDPressure", "Ready",
                           "NetworkUnavailable")},
             "f:daemonEndpoints": {"f:kubeletEndpoint": {"f:Port": {}}},
             "f:images": {}, "f:nodeInfo": {"f:architecture": {}, "f:bootID": {},
                                            "f:containerRuntimeVersion": {},
                                            "f:kernelVersion": {}, "f:kubeProxyVersion": {},
                                            "f:kubeletVersion": {}, "f:machineID": {},
                                            "f:operatingSystem": {}, "f:osImage": {},
                                            "f:systemUUID": {}}}}},
        {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
         "time": TIME, "fieldsType": "FieldsV1",
         "fieldsV1": {"f:metadata": {"f:annotations": {"f:node.alpha.kubernetes.io/ttl": {}}},
                      "f:spec": {"f:podCIDR": {}, "f:podCIDRs": {}}}},
        {"manager": "kube-router", "operation": "Update", "apiVersion": "v1", "time": TIME,
         "fieldsType": "FieldsV1",
         "fieldsV1": {"f:metadata": {"f:annotations": {"f:kube-router.io/node.bgp.peers": {}}}}},
    ]


def _conditions(ready: bool) -> list[dict[str, Any]]:
    def cond(t: str, status: str, reason: str, message: str) -> dict[str, Any]:
        return {"type": t, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": TIME, "lastTransitionTime": TIME}

    return [
        cond("NetworkUnavailable", "False", "RouteCreated", "kube-router created a route"),
        cond("MemoryPressure", "False", "KubeletHasSufficientMemory",
             "kubelet has sufficient memory available"),
        cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        cond("PIDPressure", "False", "KubeletHasSufficientPID",
             "kubelet has sufficient PID available"),
        cond("Ready", "True" if ready else "False",
             "KubeletReady" if ready else "KubeletNotReady",
             "kubelet is posting ready status" if ready else "container runtime is down"),
    ]


def realistic_node(name: str, version: str, *, control_plane: bool = False,
                   ready: bool = True, index: int = 0) -> dict[str, Any]:
    """A Ready Node ``name`` whose kubelet reports k0s ``version`` (``v1.31.2+k0s.0``)."""
    kubelet = kubelet_version(version)
    labels = {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
              "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name,
              "kubernetes.io/os": "linux", "k0smotron.io/machine-name": name,
              "topology.kubernetes.io/zone": f"zone-{index % 3}",
              "node.k0sproject.io/role": "control-plane" if control_plane else "worker"}
    if control_plane:
        labels["node-role.kubernetes.io/control-plane"] = "true"
    ip = f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "labels": labels,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                            "kube-router.io/node.bgp.peers": "[]"},
            "managedFields": _managed_fields(),
        },
        "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]},
        "status": {
            "capacity": {"cpu": "4", "ephemeral-storage": "81106868Ki",
                         "hugepages-2Mi": "0", "memory": "16372712Ki", "pods": "110"},
            "allocatable": {"cpu": "4", "ephemeral-storage": "74747764866",
                            "hugepages-2Mi": "0", "memory": "16270312Ki", "pods": "110"},
            "conditions": _conditions(ready),
            "addresses": [{"type": "InternalIP", "address": ip},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": _hex(name + "m", 32), "systemUUID": _hex(name + "u", 32),
                         "bootID": _hex(name + "b", 32), "kernelVersion": "6.8.0-45-generic",
                         "osImage": "Ubuntu 24.04.1 LTS",
                         "containerRuntimeVersion": "containerd://1.7.22",
                         "kubeletVersion": kubelet, "kubeProxyVersion": kubelet,
                         "operatingSystem": "linux", "architecture": "amd64"},
            "images": _images(name),
        },
    }
