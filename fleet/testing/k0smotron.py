"""The k0smotron stand-in: k0smotron v2.1.0's K0sControlPlane reactions, for tests.

k0smotron cannot be built here. This STAND-IN reproduces only these rules of k0smotron
v2.1.0's, as documented and as observed with the real controller (docs/capi.md,
"k0smotron v2.1.0"; no code of k0smotron's is used or copied):

* **pause**: it skips a K0sControlPlane carrying ``cluster.x-k8s.io/paused``, or whose
  Cluster has ``spec.paused: true``; a Cluster carrying only the paused annotation is
  **not** skipped. A skipped KCP's status is not recomputed either.
* **status**: on every reconcile it does not skip, ``status.version`` becomes the minimum
  over the KCP's Machines (the KCP's ``+k0s.N`` suffix added to a Machine version
  without one), and the KCP ``Available`` (condition, ``controlPlaneInitialized``) once
  the workload API answers. After a pause is removed the first recompute comes
  ``status_lag_after_unpause`` seconds late (0.6 s were observed).
* **what it writes into the spec**: it needs the Cluster's ``spec.controlPlaneEndpoint``
  (nothing more happens without one) and writes its host into
  ``spec.k0sConfigSpec.k0s.spec.api.externalAddress`` of the KCP itself.
* **when it acts**: only once the newest control-plane Machine has an autopilot
  ``ControlNode`` of the same name at least ``control_node_min_age`` seconds old (60 in
  k0smotron; configurable so tests need not wait a minute) and the KCP is ``Available``;
  before that, nothing (no in-place update, no scaling).
* **up to date**: a Machine whose ``spec.version`` equals the KCP's (a Machine version
  without the ``+k0s.N`` suffix taking the KCP's), whose infrastructure Machine is still
  cloned from the KCP's template and whose k0s-config annotation still matches the KCP's
  ``k0sConfigSpec`` (``k0s`` left out here) is up to date; ``updateStrategy`` other than
  ``InPlace`` is not played.
* standalone (no extension path), when only versions are out of date, it creates the
  cluster's single autopilot ``Plan`` named ``autopilot`` for every out-of-date control
  plane.

Every reconcile reads the KCP and then its Machines fresh from the API server (so what it
sees is a real state of the management cluster, never a mix of lagging watch caches), and
records each time it finds an unpaused KCP, its gate open, with an out-of-date Machine:
that is the moment real k0smotron would start its own rollout next to k0s-fleet's.
``able`` counts the reconciles where nothing held it (so a test can tell "found nothing
to do" from "could not have acted"), ``waits`` why it could not act.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc

from fleet.contract.versions import InvalidVersionError, K0sVersion
from fleet.kube import AlreadyExistsError, KubeClient, KubeError, patch_with_retry
from fleet.kube.resources import (
    AUTOPILOT_PLANS,
    CLUSTERS,
    CONTROL_NODES,
    K0S_CONTROL_PLANES,
    K0SMOTRON_CONTROL_PLANES,
    MACHINES,
    NAMESPACES,
)
from fleet.kube.watch import Reflector, WatchEvent
from fleet.testing.providers import PLAYED
from fleet.world.model import (
    ANN_CAPI_PAUSED,
    ANN_CLONED_FROM_GROUPKIND,
    ANN_CLONED_FROM_NAME,
    ANN_K0S_CONFIG,
    LABEL_CLUSTER_NAME,
)

log = logging.getLogger(__name__)

# k0smotron v2.1.0's wait for the newest control plane's ControlNode.
CONTROL_NODE_MIN_AGE = 60.0
# How late the first status recompute after an unpause came with the real controller.
STATUS_LAG_AFTER_UNPAUSE = 0.6


@dataclass
class Sighting:
    """An unpaused KCP, nothing holding k0smotron, with out-of-date Machines: k0smotron
    would act here. ``out_of_date``: Machine -> its version; ``not_in_place``: those
    whose infrastructure or bootstrap config changed too (a replacement, not an update)."""

    kcp: str
    kcp_version: str
    out_of_date: dict[str, str | None]
    not_in_place: tuple[str, ...] = ()


def version_matches(machine_version: str | None, kcp_version: str | None) -> bool:
    """k0smotron's "on the KCP's version": equal, a missing ``+k0s.N`` suffix on either
    side taken from the KCP's (else ``+k0s.0``)."""
    if not machine_version or not kcp_version:
        return False
    if machine_version == kcp_version:
        return True
    suffix = kcp_version.split("+", 1)[1] if "+" in kcp_version else "k0s.0"
    want = kcp_version if "+" in kcp_version else f"{kcp_version}+{suffix}"
    have = machine_version if "+" in machine_version else f"{machine_version}+{suffix}"
    try:
        return K0sVersion.parse(have) == K0sVersion.parse(want)
    except InvalidVersionError:
        return False


def _without_k0s(spec: Any) -> dict[str, Any]:
    """A k0sConfigSpec less ``k0s``, with empty values dropped (Go's omitempty)."""
    def clean(v: Any) -> Any:
        if isinstance(v, dict):
            out = {k: clean(x) for k, x in v.items()}
            return {k: x for k, x in out.items() if x not in (None, {}, [], "", False)}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v
    return clean({k: v for k, v in (spec or {}).items() if k != "k0s"}) \
        if isinstance(spec, dict) else {}


def _group_kind(ref: dict[str, Any]) -> str:
    av, kind = str(ref.get("apiVersion") or ""), str(ref.get("kind") or "")
    group = av.split("/", 1)[0] if "/" in av else ""
    return f"{kind}.{group}" if group else kind


async def register_control_nodes(workload: KubeClient, names: list[str]) -> None:
    """The autopilot ``ControlNode`` k0s creates for each controller (named after its
    Machine), as k0s autopilot would: k0smotron waits for the newest one's age."""
    for name in names:
        with contextlib.suppress(AlreadyExistsError):
            await workload.create(CONTROL_NODES, {
                "apiVersion": CONTROL_NODES.api_version, "kind": CONTROL_NODES.kind,
                "metadata": {"name": name}, "spec": {}})


@dataclass
class K0smotronStandIn:
    """Watches the KCPs and Machines of one namespace and reacts as k0smotron v2.1.0."""

    mgmt: KubeClient
    namespace: str
    # The workload cluster: k0smotron reads its ControlNodes and pings its API there
    # (no client: the KCP never becomes Available, so the stand-in never acts).
    workload: KubeClient | None = None
    # Whether to create the autopilot Plan in the workload cluster (else only recorded).
    create_plans: bool = True
    control_node_min_age: float = CONTROL_NODE_MIN_AGE
    status_lag_after_unpause: float = STATUS_LAG_AFTER_UNPAUSE
    sightings: list[Sighting] = field(default_factory=list)
    paused_seen: int = 0  # reconciles that found a KCP paused (and so did nothing)
    able: int = 0  # reconciles where nothing held k0smotron (it would act on what it found)
    waits: list[str] = field(default_factory=list)  # why it could not act (deduplicated)
    reconciles: int = 0
    plans_created: list[dict[str, Any]] = field(default_factory=list)
    config_writes: list[tuple[str, str]] = field(default_factory=list)  # (KCP, address)
    _wake: anyio.Event = field(default_factory=anyio.Event)
    _was_paused: dict[str, bool] = field(default_factory=dict)

    async def _poke(self, _event: WatchEvent) -> None:
        self._wake.set()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        kcps = Reflector(self.mgmt, K0S_CONTROL_PLANES, namespace=self.namespace,
                         listener=self._poke, watch_timeout=60)
        machines = Reflector(self.mgmt, MACHINES, namespace=self.namespace,
                             listener=self._poke, watch_timeout=60)
        clusters = Reflector(self.mgmt, CLUSTERS, namespace=self.namespace,
                             listener=self._poke, watch_timeout=60)
        async with anyio.create_task_group() as tg:
            for r in (kcps, machines, clusters):
                tg.start_soon(r.run)
            for r in (kcps, machines, clusters):
                await r.synced.wait()
            await self.reconcile_all()
            task_status.started()
            while True:
                # k0smotron requeues a KCP that is not yet Available or up to date (its
                # gate may open by the clock alone: the ControlNode's age).
                with anyio.move_on_after(max(0.2, min(self.control_node_min_age, 2.0))):
                    await self._wake.wait()
                self._wake = anyio.Event()
                try:
                    await self.reconcile_all()
                except KubeError as e:
                    log.warning("k0smotron stand-in: %s", e)

    async def reconcile_all(self) -> None:
        for kcp in (await self.mgmt.list(K0S_CONTROL_PLANES, self.namespace)).items:
            await self.reconcile(kcp["metadata"]["name"])

    async def _cluster(self, kcp: dict[str, Any]) -> dict[str, Any] | None:
        name = ((kcp.get("metadata") or {}).get("labels") or {}).get(LABEL_CLUSTER_NAME)
        if not name:
            return None
        return await self.mgmt.get_or_none(CLUSTERS, name, self.namespace)

    def _wait(self, why: str) -> None:
        if not self.waits or self.waits[-1] != why:
            self.waits.append(why)

    async def reconcile(self, name: str) -> None:
        # The KCP first, then its Machines: a Machine read is never older than the KCP.
        kcp = await self.mgmt.get_or_none(K0S_CONTROL_PLANES, name, self.namespace)
        if kcp is None:
            return
        self.reconciles += 1
        meta, spec = kcp.get("metadata") or {}, kcp.get("spec") or {}
        cluster = await self._cluster(kcp)
        # Cluster API's rule as k0smotron applies it: the Cluster's spec.paused or the
        # KCP's own annotation; the Cluster's annotation is not looked at.
        if ANN_CAPI_PAUSED in (meta.get("annotations") or {}) or bool(
                ((cluster or {}).get("spec") or {}).get("paused")):
            self.paused_seen += 1
            self._was_paused[name] = True
            return
        if self._was_paused.pop(name, False) and self.status_lag_after_unpause > 0:
            await anyio.sleep(self.status_lag_after_unpause)  # the observed lag
            kcp = await self.mgmt.get_or_none(K0S_CONTROL_PLANES, name, self.namespace)
            if kcp is None:
                return
            meta, spec = kcp.get("metadata") or {}, kcp.get("spec") or {}
        machines = [m for m in (await self.mgmt.list(MACHINES, self.namespace)).items
                    if any(o.get("kind") == "K0sControlPlane" and o.get("name") == name
                           for o in (m.get("metadata") or {}).get("ownerReferences") or [])
                    and not (m.get("metadata") or {}).get("deletionTimestamp")]
        available = await self._status(kcp, machines)
        if cluster is None:
            self._wait(f"{name}: no owning Cluster")
            return
        endpoint = ((cluster.get("spec") or {}).get("controlPlaneEndpoint") or {})
        if not endpoint.get("host"):
            self._wait(f"{name}: the Cluster's controlPlaneEndpoint is not set")
            return
        await self._external_address(kcp, str(endpoint["host"]))
        if (spec.get("updateStrategy") or "InPlace") != "InPlace":
            return
        if not available:
            self._wait(f"{name}: not Available (workload API not reached)")
            return
        if why := await self._newest_not_ready(machines):
            self._wait(f"{name}: {why}")
            return
        self.able += 1
        version = spec.get("version")
        out: dict[str, str | None] = {}
        not_in_place: list[str] = []
        for m in machines:
            mname, mver = m["metadata"]["name"], (m.get("spec") or {}).get("version")
            same_config = await self._config_unchanged(kcp, m)
            if version_matches(mver, version) and same_config:
                continue
            out[mname] = mver
            if not same_config:
                not_in_place.append(mname)
        if not out:
            return
        self.sightings.append(Sighting(name, str(version), out, tuple(sorted(not_in_place))))
        in_place = sorted(n for n in out if n not in not_in_place)
        if in_place:
            await self._autopilot_plan(str(version), in_place)

    async def _status(self, kcp: dict[str, Any], machines: list[dict[str, Any]]) -> bool:
        """k0smotron's status: the lowest Machine version and, once the workload API
        answers, Available (other conditions kept). Whether the KCP is Available."""
        name, spec = kcp["metadata"]["name"], kcp.get("spec") or {}
        parsed = []
        for m in machines:
            v = (m.get("spec") or {}).get("version")
            with contextlib.suppress(InvalidVersionError, TypeError):
                parsed.append((K0sVersion.parse(str(v)), str(v)))
        lowest = min(parsed)[1] if parsed else None
        kcp_version = str(spec.get("version") or "")
        if lowest and "+" in kcp_version and "+" not in lowest:
            lowest = f"{lowest}+{kcp_version.split('+', 1)[1]}"
        available = await self._workload_answers()

        def mutate(obj: dict[str, Any]) -> dict[str, Any] | None:
            status = obj.get("status") or {}
            patch: dict[str, Any] = {}
            if lowest and status.get("version") != lowest:
                patch["version"] = lowest
            conds = list(status.get("conditions") or [])
            if available and not any(c.get("type") == "Available" and c.get("status") == "True"
                                     for c in conds):
                now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                conds = [c for c in conds if c.get("type") != "Available"] + [{
                    "type": "Available", "status": "True", "reason": "Available",
                    "message": "", "lastTransitionTime": now}]
                patch["conditions"] = conds
                patch["initialization"] = {"controlPlaneInitialized": True}
            return {"status": patch} if patch else None

        with contextlib.suppress(KubeError):
            await patch_with_retry(self.mgmt, K0S_CONTROL_PLANES, name, mutate, self.namespace,
                                   subresource="status", current=kcp)
        return available

    async def _workload_answers(self) -> bool:
        if self.workload is None:
            return False
        try:
            await self.workload.get(NAMESPACES, "kube-system")
        except KubeError:
            return False
        return True

    async def _newest_not_ready(self, machines: list[dict[str, Any]]) -> str:
        """'' once the newest control-plane Machine's ControlNode is old enough."""
        if not machines:
            return ""
        newest = max(machines, key=lambda m: (m["metadata"].get("creationTimestamp") or "",
                                              m["metadata"]["name"]))
        mname = newest["metadata"]["name"]
        assert self.workload is not None  # Available needs it
        try:
            cn = await self.workload.get_or_none(CONTROL_NODES, mname)
        except KubeError as e:
            return f"ControlNode {mname}: {e}"
        if cn is None:
            return f"no ControlNode {mname} yet"
        created = datetime.strptime(cn["metadata"]["creationTimestamp"],
                                    "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        age = time.time() - created.timestamp()
        if age < self.control_node_min_age:
            return f"ControlNode {mname} joined {age:.0f}s ago"
        return ""

    async def _config_unchanged(self, kcp: dict[str, Any], machine: dict[str, Any]) -> bool:
        """The Machine's infrastructure Machine still cloned from the KCP's template and
        its k0s-config annotation still the KCP's k0sConfigSpec (``k0s`` left out)."""
        spec = kcp.get("spec") or {}
        template = (spec.get("machineTemplate") or {}).get("infrastructureRef") or {}
        ref = (machine.get("spec") or {}).get("infrastructureRef") or {}
        res = PLAYED.get((str(ref.get("apiGroup") or ""), str(ref.get("kind") or "")))
        if res is None:
            return False
        infra = await self.mgmt.get_or_none(res, str(ref.get("name") or ""), self.namespace)
        ann = ((infra or {}).get("metadata") or {}).get("annotations") or {}
        if (ann.get(ANN_CLONED_FROM_NAME), ann.get(ANN_CLONED_FROM_GROUPKIND)) != (
                template.get("name"), _group_kind(template)):
            return False
        raw = ((machine.get("metadata") or {}).get("annotations") or {}).get(ANN_K0S_CONFIG)
        try:
            have = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            return False
        return have is not None and _without_k0s(have) == _without_k0s(
            spec.get("k0sConfigSpec"))

    async def _external_address(self, kcp: dict[str, Any], host: str) -> None:
        """k0smotron writes the Cluster's endpoint host into the KCP's k0s config."""
        k0s = ((kcp.get("spec") or {}).get("k0sConfigSpec") or {}).get("k0s")
        if not isinstance(k0s, dict):
            return
        nllb = ((((k0s.get("spec") or {}).get("network") or {}).get("nodeLocalLoadBalancing")
                 or {}).get("enabled"))
        if nllb or ((k0s.get("spec") or {}).get("api") or {}).get("externalAddress") == host:
            return
        name = kcp["metadata"]["name"]
        await self.mgmt.patch(K0S_CONTROL_PLANES, name, {"spec": {"k0sConfigSpec": {"k0s": {
            "spec": {"api": {"externalAddress": host}}}}}}, self.namespace)
        self.config_writes.append((name, host))

    async def _autopilot_plan(self, version: str, machines: list[str]) -> None:
        body = {"apiVersion": AUTOPILOT_PLANS.api_version, "kind": "Plan",
                "metadata": {"name": "autopilot"},
                "spec": {"id": f"k0smotron-stand-in-{version}", "timestamp": "now",
                         "commands": [{"k0supdate": {
                             "version": version,
                             "targets": {"controllers": {"discovery": {
                                 "static": {"nodes": machines}}}}}}]}}
        self.plans_created.append(body)
        if self.workload is None or not self.create_plans:
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


__all__ = ["CONTROL_NODE_MIN_AGE", "STATUS_LAG_AFTER_UNPAUSE", "HostedControlPlaneStandIn",
           "K0smotronStandIn", "Sighting", "register_control_nodes", "version_matches"]
