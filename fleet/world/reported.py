"""What a node itself reports running, independent of k0s-fleet's own bookkeeping.

A node k0s-fleet never touched (a cluster created at the target version, an MD scale-up,
a Machine Cluster API replaced) carries none of k0s-fleet's annotations; it still tells
its version through what every k0s node publishes:

* the agent's report (``fleet.k0s-fleet.io/k0s-version`` on the Node, written when it
  executes a request): the exact k0s release;
* an autopilot ControlNode's ``status.k0sVersion`` (pure controllers have no Node);
* the kubelet's ``status.nodeInfo.kubeletVersion`` (``v1.31.3+k0s``): the Kubernetes
  release only, so it confirms the Machine's recorded version (the one Cluster API
  bootstrapped it with, or k0s-fleet's record of its last in-place upgrade) when both
  name the same Kubernetes release, and contradicts it otherwise.
"""

from __future__ import annotations

from fleet.contract.versions import kubernetes_release, valid_version
from fleet.world.model import ROLE_CONTROLLER, MachineInfo, NodeInfo


def kubelet_version(version: str) -> str:
    """What a k0s node's kubelet reports (status.nodeInfo.kubeletVersion) for ``version``."""
    release = kubernetes_release(version)
    if release is None:
        raise ValueError(f"not a k0s version: {version!r}")
    return "v{}.{}.{}+k0s".format(*release)



def running_version(machine: MachineInfo, node: NodeInfo | None) -> str | None:
    """The k0s version ``node`` (the Node or ControlNode of ``machine``) runs, as best told.

    Exact reports win; the kubelet's Kubernetes release then decides between the
    Machine's recorded versions; a kubelet that agrees with none is reported as it is
    (it names no k0s release, so it never equals a target). With nothing reported by the
    node, a control plane falls back to its Machine's version (k0s-fleet records
    completed controller upgrades there) and a worker to k0s-fleet's Machine record.
    """
    if node is not None:
        if exact := valid_version(node.running_version):
            return exact
        if exact := valid_version(node.k0s_version):
            return exact
        kubelet = kubernetes_release(node.kubelet_version)
        if kubelet is not None:
            for recorded in (machine.running_version_annotation, machine.version):
                if (v := valid_version(recorded)) is not None and kubernetes_release(v) == kubelet:
                    return v
            return node.kubelet_version
        if node.running_version:
            return node.running_version  # unparseable: shown as reported
    if recorded := machine.running_version_annotation:
        return recorded
    return machine.version if machine.role == ROLE_CONTROLLER else None


__all__ = ["kubelet_version", "running_version"]
