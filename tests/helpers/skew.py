"""An independent judge of k0s's version skew policy for the tests: it watches Machines
(and k0smotron's hosted control planes) and records every moment a rule is broken.

The rules, as k0s states them: control planes of a cluster within one minor of each other;
no worker newer than the oldest control plane, nor more than one minor older; no object
moved down, nor by more than one minor at a time. The judge reads versions with its own
parse (not fleet.contract.versions), so a bug there cannot hide a violation.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.abc

from fleet.kube import KubeClient, KubeError
from fleet.kube.resources import (
    K0S_CONTROL_PLANES,
    K0SMOTRON_CONTROL_PLANES,
    MACHINES,
    Resource,
)
from fleet.kube.watch import watch_once

CONTROL_PLANE_LABEL = "cluster.x-k8s.io/control-plane"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"


def minor(version: str) -> int:
    return int(version.removeprefix("v").split(".")[1])


class SkewWatcher:
    """The skew rules over every Machine of one cluster."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self.versions: dict[str, tuple[str, str]] = {}  # name -> (role, version)
        self.violations: list[str] = []
        self.events = 0

    def observe(self, m: dict[str, Any]) -> None:
        spec = m.get("spec") or {}
        if spec.get("clusterName") != self.cluster or not spec.get("version"):
            return
        self.events += 1
        labels = (m.get("metadata") or {}).get("labels") or {}
        role = "cp" if CONTROL_PLANE_LABEL in labels else "worker"
        name, version = m["metadata"]["name"], spec["version"]
        before = self.versions.get(name)
        if before is not None and (minor(version) < minor(before[1])
                                   or minor(version) - minor(before[1]) > 1):
            self.violations.append(f"{name}: {before[1]} -> {version}")
        self.versions[name] = (role, version)
        cps = [minor(v) for r, v in self.versions.values() if r == "cp"]
        ws = [minor(v) for r, v in self.versions.values() if r == "worker"]
        if cps and max(cps) - min(cps) > 1:
            self.violations.append(f"control planes apart: {sorted(self.versions.items())}")
        if cps and ws and (max(ws) > min(cps) or min(cps) - min(ws) > 1):
            self.violations.append(f"worker skew: {sorted(self.versions.items())}")

    async def poll(self, mgmt: KubeClient, namespace: str) -> None:
        for m in (await mgmt.list(MACHINES, namespace)).items:
            self.observe(m)

    async def run(self, mgmt: KubeClient, namespace: str, *,
                  task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Poll every 50 ms (for tests whose objects change slower than that)."""
        await self.poll(mgmt, namespace)
        task_status.started()
        while True:
            await anyio.sleep(0.05)
            await self.poll(mgmt, namespace)


class FleetSkewWatcher(SkewWatcher):
    """:class:`SkewWatcher` over several clusters, the hosted control planes included
    (their version is what k0smotron reports in status.version)."""

    def __init__(self, clusters: list[str]) -> None:
        super().__init__("")
        self.per_cluster = {c: SkewWatcher(c) for c in clusters}

    def observe(self, m: dict[str, Any]) -> None:
        w = self.per_cluster.get((m.get("spec") or {}).get("clusterName") or "")
        if w is not None:
            w.observe(m)
            self._collect()

    def observe_hosted(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        cluster = (meta.get("labels") or {}).get(CLUSTER_NAME_LABEL) or ""
        version = (obj.get("status") or {}).get("version")
        w = self.per_cluster.get(cluster)
        if w is None or not version:
            return
        w.observe({"metadata": {"name": meta["name"], "labels": {CONTROL_PLANE_LABEL: ""}},
                   "spec": {"clusterName": cluster, "version": version}})
        self._collect()

    def observe_declared(self, kcp: dict[str, Any]) -> None:
        """A K0sControlPlane's ``spec.version``, counted as one more control plane of its
        cluster: what the control planes are told to run (for a cluster whose control-plane
        Machines are not in the test, the only control-plane version there is)."""
        meta = kcp.get("metadata") or {}
        cluster = (meta.get("labels") or {}).get(CLUSTER_NAME_LABEL) or ""
        version = (kcp.get("spec") or {}).get("version")
        w = self.per_cluster.get(cluster)
        if w is None or not version:
            return
        w.observe({"metadata": {"name": f"{meta['name']}(spec)",
                                "labels": {CONTROL_PLANE_LABEL: ""}},
                   "spec": {"clusterName": cluster, "version": version}})
        self._collect()

    def _collect(self) -> None:
        self.violations = [v for w in self.per_cluster.values() for v in w.violations]

    @property
    def versions_now(self) -> dict[str, str]:
        return {name: v for w in self.per_cluster.values() for name, (_, v) in w.versions.items()}

    async def poll(self, mgmt: KubeClient, namespace: str) -> None:
        for obj in (await mgmt.list(K0SMOTRON_CONTROL_PLANES, namespace)).items:
            self.observe_hosted(obj)
        await super().poll(mgmt, namespace)

    async def watch(self, mgmt: KubeClient, namespace: str, *,
                    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                    ) -> None:
        """Every event of Machines, K0sControlPlanes (their declared version) and hosted
        control planes, on watches (list, then watch from the list's resourceVersion,
        re-listed when a watch ends or expires)."""
        kinds = ((MACHINES, self.observe), (K0S_CONTROL_PLANES, self.observe_declared),
                 (K0SMOTRON_CONTROL_PLANES, self.observe_hosted))
        ready = [anyio.Event() for _ in kinds]
        async with anyio.create_task_group() as tg:
            for (res, observe), r in zip(kinds, ready, strict=True):
                tg.start_soon(self._follow, mgmt, namespace, res, observe, r)
            for r in ready:
                await r.wait()
            task_status.started()

    @staticmethod
    async def _follow(mgmt: KubeClient, namespace: str, res: Resource, observe: Any,
                      ready: anyio.Event) -> None:
        while True:
            listed = await mgmt.list(res, namespace)
            for obj in listed.items:
                observe(obj)
            ready.set()
            rv = listed.resource_version
            try:
                async for ev in watch_once(mgmt, res, rv, namespace=namespace,
                                           timeout_seconds=60):
                    if not isinstance(ev, str) and ev.type != "DELETED":
                        observe(ev.object)
            except KubeError:
                continue  # expired or interrupted: list again


__all__ = ["FleetSkewWatcher", "SkewWatcher", "minor"]
