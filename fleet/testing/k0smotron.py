"""The k0smotron stand-in: k0smotron's documented K0sControlPlane reactions, for tests.

k0smotron cannot be built here. This stand-in reproduces only these documented rules of
k0smotron's (no code of k0smotron's is used or copied):

* it skips a K0sControlPlane carrying ``cluster.x-k8s.io/paused`` (or whose Cluster has
  ``spec.paused``), and one whose ``updateStrategy`` is not ``InPlace`` (the default);
* it counts a Machine whose ``spec.version`` equals the KCP's as up to date;
* ``status.version`` is the minimum over the Machines' versions;
* standalone (no extension path), on a ``spec.version`` change it creates the cluster's
  single autopilot ``Plan`` named ``autopilot`` for every out-of-date control plane.

Every reconcile reads the KCP and then its Machines fresh from the API server (so what it
sees is a real state of the management cluster, never a mix of lagging watch caches), and
records each time it finds an unpaused KCP with an out-of-date Machine: that is the moment
real k0smotron would start its own rollout next to k0s-fleet's.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from fleet.kube import AlreadyExistsError, KubeClient, KubeError
from fleet.kube.resources import (
    AUTOPILOT_PLANS,
    CLUSTERS,
    K0S_CONTROL_PLANES,
    K0SMOTRON_CONTROL_PLANES,
    MACHINES,
)
from fleet.kube.watch import Reflector, WatchEvent
from fleet.model import ANN_CAPI_PAUSED, LABEL_CLUSTER_NAME
from fleet.versions import InvalidVersionError, K0sVersion

log = logging.getLogger(__name__)


@dataclass
class Sighting:
    """An unpaused KCP with out-of-date Machines: k0smotron would act here."""

    kcp: str
    kcp_version: str
    out_of_date: dict[str, str | None]


@dataclass
class K0smotronStandIn:
    """Watches the KCPs and Machines of one namespace and reacts as k0smotron documents."""

    mgmt: KubeClient
    namespace: str
    # Where to create the autopilot Plan (the workload cluster); None: only record it.
    workload: KubeClient | None = None
    sightings: list[Sighting] = field(default_factory=list)
    paused_seen: int = 0  # reconciles that found a KCP paused (and so did nothing)
    reconciles: int = 0
    plans_created: list[dict[str, Any]] = field(default_factory=list)
    _wake: anyio.Event = field(default_factory=anyio.Event)

    async def _poke(self, _event: WatchEvent) -> None:
        self._wake.set()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        kcps = Reflector(self.mgmt, K0S_CONTROL_PLANES, namespace=self.namespace,
                         listener=self._poke, watch_timeout=60)
        machines = Reflector(self.mgmt, MACHINES, namespace=self.namespace,
                             listener=self._poke, watch_timeout=60)
        async with anyio.create_task_group() as tg:
            tg.start_soon(kcps.run)
            tg.start_soon(machines.run)
            await kcps.synced.wait()
            await machines.synced.wait()
            await self.reconcile_all()
            task_status.started()
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                try:
                    await self.reconcile_all()
                except KubeError as e:
                    log.warning("k0smotron stand-in: %s", e)

    async def reconcile_all(self) -> None:
        for kcp in (await self.mgmt.list(K0S_CONTROL_PLANES, self.namespace)).items:
            await self.reconcile(kcp["metadata"]["name"])

    async def _cluster_paused(self, kcp: dict[str, Any]) -> bool:
        name = ((kcp.get("metadata") or {}).get("labels") or {}).get(LABEL_CLUSTER_NAME)
        if not name:
            return False
        cluster = await self.mgmt.get_or_none(CLUSTERS, name, self.namespace)
        return bool(cluster and (cluster.get("spec") or {}).get("paused"))

    async def reconcile(self, name: str) -> None:
        # The KCP first, then its Machines: a Machine read is never older than the KCP.
        kcp = await self.mgmt.get_or_none(K0S_CONTROL_PLANES, name, self.namespace)
        if kcp is None:
            return
        self.reconciles += 1
        meta, spec = kcp.get("metadata") or {}, kcp.get("spec") or {}
        if ANN_CAPI_PAUSED in (meta.get("annotations") or {}) or await self._cluster_paused(kcp):
            self.paused_seen += 1
            return
        if (spec.get("updateStrategy") or "InPlace") != "InPlace":
            return
        version = spec.get("version")
        machines = [m for m in (await self.mgmt.list(MACHINES, self.namespace)).items
                    if any(o.get("kind") == "K0sControlPlane" and o.get("name") == name
                           for o in (m.get("metadata") or {}).get("ownerReferences") or [])]
        versions = {m["metadata"]["name"]: (m.get("spec") or {}).get("version")
                    for m in machines if not m["metadata"].get("deletionTimestamp")}
        out = {n: v for n, v in versions.items() if v != version}
        await self._status_version(name, versions)
        if not out:
            return
        self.sightings.append(Sighting(name, str(version), out))
        await self._autopilot_plan(str(version), sorted(out))

    async def _status_version(self, name: str, versions: dict[str, str | None]) -> None:
        parsed = []
        for v in versions.values():
            with contextlib.suppress(InvalidVersionError, TypeError):
                parsed.append((K0sVersion.parse(str(v)), str(v)))
        if not parsed:
            return
        lowest = min(parsed)[1]
        with contextlib.suppress(KubeError):
            await self.mgmt.patch(K0S_CONTROL_PLANES, name, {"status": {"version": lowest}},
                                  self.namespace, subresource="status")

    async def _autopilot_plan(self, version: str, machines: list[str]) -> None:
        body = {"apiVersion": AUTOPILOT_PLANS.api_version, "kind": "Plan",
                "metadata": {"name": "autopilot"},
                "spec": {"id": f"k0smotron-stand-in-{version}", "timestamp": "now",
                         "commands": [{"k0supdate": {
                             "version": version,
                             "targets": {"controllers": {"discovery": {
                                 "static": {"nodes": machines}}}}}}]}}
        self.plans_created.append(body)
        if self.workload is None:
            return
        with contextlib.suppress(AlreadyExistsError):
            await self.workload.create(AUTOPILOT_PLANS, body)




@dataclass
class HostedControlPlaneStandIn:
    """STAND-IN for k0smotron's hosted control plane (K0smotronControlPlane): k0s runs as
    pods in the management cluster, rolled by k0smotron itself. Written from k0smotron
    v2.1.0's documented API only (no code of k0smotron's): it skips an object carrying
    ``cluster.x-k8s.io/paused``; on a ``spec.version`` other than ``status.version`` it
    replaces its pods one at a time (``status.readyReplicas`` one short while a pod is
    replaced) and then reports ``status.version``, with ``status.replicas`` and
    ``status.readyReplicas`` both ``spec.replicas``. ``history`` keeps every status it
    wrote, for the tests' skew watchers."""

    mgmt: KubeClient
    namespace: str
    step_seconds: float = 0.2
    history: list[tuple[str, str | None, int]] = field(default_factory=list)
    rolled: list[tuple[str, str]] = field(default_factory=list)  # (name, version) finished

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        started = False
        while True:
            try:
                items = (await self.mgmt.list(K0SMOTRON_CONTROL_PLANES, self.namespace)).items
            except KubeError as e:
                log.warning("hosted control plane stand-in: %s", e)
                items = []
            if not started:
                task_status.started()
                started = True
            for obj in items:
                await self._reconcile(obj)
            await anyio.sleep(0.05)

    async def _status(self, name: str, status: dict[str, Any]) -> None:
        await self.mgmt.patch(K0SMOTRON_CONTROL_PLANES, name, {"status": status},
                              self.namespace, subresource="status")
        self.history.append((name, status.get("version"), int(status.get("readyReplicas", -1))))

    async def _reconcile(self, obj: dict[str, Any]) -> None:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        status = obj.get("status") or {}
        name = meta["name"]
        if ANN_CAPI_PAUSED in (meta.get("annotations") or {}):
            return
        version, replicas = spec.get("version"), int(spec.get("replicas") or 1)
        if not version or status.get("version") == version:
            return
        old = status.get("version")
        for _ in range(replicas):  # one pod at a time
            await self._status(name, {"version": old, "replicas": replicas,
                                      "readyReplicas": replicas - 1})
            await anyio.sleep(self.step_seconds)
            await self._status(name, {"version": old, "replicas": replicas,
                                      "readyReplicas": replicas})
        await self._status(name, {"version": version, "replicas": replicas,
                                  "readyReplicas": replicas, "ready": True})
        self.rolled.append((name, str(version)))


__all__ = ["HostedControlPlaneStandIn", "K0smotronStandIn", "Sighting"]
