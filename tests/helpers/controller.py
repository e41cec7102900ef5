"""Running the controller on the test world and watching its invariants."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from opentelemetry.sdk.trace import TracerProvider

from fleet.config.models import FleetConfig
from fleet.contract.signal import RUNNING_VERSION_KEY, InvalidSignalError, parse_signal
from fleet.contract.versions import same_version
from fleet.controllers.runner import FleetController, Tuning
from fleet.events import EventRecorder
from fleet.kube import KubeClient, KubeObject
from fleet.kube.resources import (
    K0S_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINES,
    NODE_PLANS,
    NODES,
    Resource,
)
from fleet.kube.watch import Reflector, WatchEvent
from fleet.planner import conditions as C
from fleet.rollout.policy import RolloutPolicy
from fleet.testing.capi import FleetCluster, create_cluster
from fleet.testing.world import World
from tests.helpers.names import unique

V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"


@dataclass
class InvariantWatcher:
    """Checks, at every Node event of the workload cluster and every NodePlan event, that
    no rule was broken. Uses only facts of one watch stream per rule (no cross-stream
    ordering assumptions)."""

    fc: FleetCluster
    max_unavailable: int
    cp_target: str | None = None
    nodes: dict[str, KubeObject] = field(default_factory=dict)
    plan_uids: dict[str, set[str]] = field(default_factory=dict)
    plans: dict[str, KubeObject] = field(default_factory=dict)
    requests: dict[str, set[tuple[str, str, int]]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    events: int = 0
    max_seen_unavailable: int = 0
    max_seen_cp: int = 0
    armed: bool = False  # checks start once the initial listing is complete

    def _live(self, name: str) -> bool:
        node = self.nodes.get(name)
        if node is None:
            return False
        try:
            sig = parse_signal((node.get("metadata") or {}).get("annotations"))
        except InvalidSignalError:
            return False
        return sig is not None and (sig.status is None or not sig.status.status.terminal)

    def _unavailable(self, name: str) -> bool:
        node = self.nodes.get(name)
        if node is None:
            return True
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (node.get("status") or {}).get("conditions") or [])
        return not ready or bool((node.get("spec") or {}).get("unschedulable")) \
            or self._live(name)

    async def on_node(self, ev: WatchEvent) -> None:
        name = ev.object["metadata"]["name"]
        if name not in self.fc.machines:
            return
        self.events += 1
        if ev.type == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = ev.object
            try:
                sig = parse_signal((ev.object.get("metadata") or {}).get("annotations"))
            except InvalidSignalError:
                sig = None
            if sig is not None:
                self.requests.setdefault(name, set()).add(
                    (sig.planId, sig.created.isoformat(), sig.command.id))
        self.check()

    async def on_plan(self, ev: WatchEvent) -> None:
        meta = ev.object["metadata"]
        self.events += 1
        self.plan_uids.setdefault(meta["name"], set()).add(meta["uid"])
        if len(self.plan_uids[meta["name"]]) > 1:
            self.violations.append(f"NodePlan {meta['name']} created twice")
        # What `kubectl get nodeplans` shows: never more worker plans in flight than the
        # budget (a finished node's plan is recorded before the next one starts).
        if ev.type == "DELETED":
            self.plans.pop(meta["name"], None)
        else:
            self.plans[meta["name"]] = ev.object
        if self.armed:
            live = [n for n, p in self.plans.items()
                    if (p.get("spec") or {}).get("machineName") in self.fc.workers
                    and (p.get("status") or {}).get("phase") not in ("Completed", "Failed")]
            if len(live) > self.max_unavailable:
                self.violations.append(f"{len(live)} worker NodePlans in flight: {live}")

    def check(self) -> None:
        if not self.armed:
            return
        unavailable = [w for w in self.fc.workers if self._unavailable(w)]
        self.max_seen_unavailable = max(self.max_seen_unavailable, len(unavailable))
        if len(unavailable) > self.max_unavailable:
            self.violations.append(f"{len(unavailable)} workers unavailable: {unavailable}")
        cps = [c for c in self.fc.control_planes if self._live(c)]
        self.max_seen_cp = max(self.max_seen_cp, len(cps))
        if len(cps) > 1:
            self.violations.append(f"two control planes at once: {cps}")
        if any(self._live(w) for w in self.fc.workers) and self.cp_target:
            for c in self.fc.control_planes:
                node = self.nodes.get(c) or {}
                running = ((node.get("metadata") or {}).get("annotations") or {}).get(
                    RUNNING_VERSION_KEY)
                if self._live(c) or not same_version(running, self.cp_target):
                    self.violations.append(f"worker upgrading while control plane {c} is not "
                                           f"done ({running})")

    async def run(self, mgmt: KubeClient, workload: KubeClient, *,
                  task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        nodes = Reflector(workload, NODES, listener=self.on_node, watch_timeout=60)
        plans = Reflector(mgmt, NODE_PLANS, namespace=self.fc.namespace,
                          listener=self.on_plan, watch_timeout=60)
        async with anyio.create_task_group() as tg:
            tg.start_soon(nodes.run)
            tg.start_soon(plans.run)
            await nodes.synced.wait()
            await plans.synced.wait()
            self.armed = True
            self.check()
            task_status.started()


PROVIDER = TracerProvider()


def tuning(**kw: Any) -> Tuning:
    """The controller's tuning in tests: 30 s management watches, and ``kw``."""
    return Tuning(**{"watch_timeout": 30, **kw})


@contextlib.asynccontextmanager
async def running_controller(mgmt: KubeClient, config: FleetConfig, **kw: Any
                             ) -> AsyncIterator[FleetController]:
    kw.setdefault("tracer", PROVIDER.get_tracer("test"))
    kw.setdefault("tuning", tuning())
    controller = FleetController(mgmt, config, **kw)
    async with anyio.create_task_group() as tg:
        await tg.start(controller.run)
        try:
            yield controller
        finally:
            tg.cancel_scope.cancel()


async def acted_on_current_state(controller: FleetController, mgmt: KubeClient,
                                 namespace: str, resources: list[Resource]) -> bool:
    """True when the controller's caches hold every object of ``resources`` in
    ``namespace`` at the server's resourceVersion and the controller has settled (its
    last pass decided on them, nothing in flight): stopping it now cuts no sequence it
    began on what it saw (a pause it wrote and has not yet released)."""
    if not controller.settled():
        return False
    for res in resources:
        cache = controller.view[res]
        for obj in (await mgmt.list(res, namespace)).items:
            meta = obj["metadata"]
            cached = cache.object(meta["name"], namespace)
            if cached is None or cached["metadata"].get("resourceVersion") \
                    != meta.get("resourceVersion"):
                return False
    return controller.settled()


@contextlib.asynccontextmanager
async def policy_controller(mgmt: KubeClient, config: FleetConfig, **kw: Any
                            ) -> AsyncIterator[FleetController]:
    """The controller as the entry point runs it: its rollout policy attached (it writes
    the FleetUpgrade status) and Events recorded."""
    recorder = EventRecorder(mgmt, instance="k0s-fleet",
                             default_namespace=config.management.namespace)
    policy = RolloutPolicy(mgmt, config, recorder=recorder)
    async with running_controller(mgmt, config, recorder=recorder, policy=policy,
                                  **kw) as controller, anyio.create_task_group() as tg:
        # the gate's wake-ups (a soak's end, a window opening), as the entry point pokes
        # the controller with them (fleet/cli/controller.py): no watch event announces them
        tg.start_soon(policy.wakeups, controller.trigger.poke, controller.clock)
        try:
            yield controller
        finally:
            tg.cancel_scope.cancel()


def intent_config(namespace: str) -> FleetConfig:
    """A fleet whose upgrades come from FleetUpgrades and whose nodes answer through the
    scripted responder: no digests (unverified downloads allowed), a request not picked
    up within 60 s counts as stalled, every other deadline as in production."""
    return FleetConfig.model_validate({
        "management": {"namespace": namespace},
        "clusters": {"namespaces": [namespace]},
        "download": {"urlTemplate": "https://releases.invalid/{version}/k0s-{arch}",
                     "allowUnverified": True},
        "rollout": {"progressDeadlines": {"pending": "60s"}},
    })


async def small_cluster(mgmt: KubeClient, wl: KubeClient, world: World, namespace: str, *,
                        prefix: str, control_planes: int, workers: int,
                        version: str = V1) -> FleetCluster:
    """A fleet cluster on the shared workload API server ``wl1`` (maxUnavailable 1)."""
    return await create_cluster(mgmt, wl, world["wl1"].kubeconfig(), namespace=namespace,
                                name=unique(prefix), control_planes=control_planes,
                                workers=workers, max_unavailable=1, version=version)


async def all_up_to_date(mgmt: KubeClient, fcs: list[FleetCluster]) -> bool:
    """Every cluster's K0sControlPlane and MachineDeployment has K0sFleetUpToDate=True."""
    for fc in fcs:
        for res, name in ((K0S_CONTROL_PLANES, fc.kcp), (MACHINE_DEPLOYMENTS, fc.md)):
            if name is None:
                continue
            st = (await mgmt.get(res, name, fc.namespace)).get("status") or {}
            if not any(c.get("type") == C.UP_TO_DATE and c.get("status") == "True"
                       for c in st.get("conditions") or []):
                return False
    return True


async def machine_versions(mgmt: KubeClient, fc: FleetCluster) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for m in (await mgmt.list(MACHINES, fc.namespace)).items:
        name = m["metadata"]["name"]
        ann = m["metadata"].get("annotations") or {}
        out[name] = ann.get(RUNNING_VERSION_KEY) or m["spec"].get("version")
    return out


async def wait_condition(  # noqa: PLR0917
        mgmt: KubeClient, res: Any, name: str, namespace: str, ctype: str,
        status: str = "True", *, timeout: float = 60, target: str | None = None
) -> KubeObject:
    """Wait for a condition (written for ``target``, when given: a condition left from
    before a version bump does not count)."""
    with anyio.fail_after(timeout):
        while True:
            obj = await mgmt.get(res, name, namespace)
            st = obj.get("status") or {}
            # Cluster API's MachineDeployment CRD prunes status.k0sFleet: the condition's
            # message names the target ("3/3 machines on v1.31.3+k0s.0 ...").
            for c in st.get("conditions") or []:
                fresh = target is None or f" on {target}" in (c.get("message") or "")
                if fresh and c.get("type") == ctype and c.get("status") == status:
                    return obj
            await anyio.sleep(0.05)


async def wait_rollout(mgmt: KubeClient, fc: FleetCluster, timeout: float = 90,
                       target: str = V2) -> None:
    """Every Machine of the cluster's KCP and MD on ``target``, as the controller says,
    and recorded so on the Machines (a worker's record is written with its spec.version at
    the end of the paused sequence, a moment after its MD reads up to date)."""
    if fc.kcp:
        await wait_condition(mgmt, K0S_CONTROL_PLANES, fc.kcp, fc.namespace, C.UP_TO_DATE,
                             timeout=timeout, target=target)
    if fc.md:
        await wait_condition(mgmt, MACHINE_DEPLOYMENTS, fc.md, fc.namespace, C.UP_TO_DATE,
                             timeout=timeout, target=target)
    with anyio.fail_after(timeout):
        while not all(same_version(v, target) for name, v in
                      (await machine_versions(mgmt, fc)).items() if name in fc.machines):
            await anyio.sleep(0.1)


def fleet_config(namespace: str, **rollout: Any) -> FleetConfig:
    return FleetConfig.model_validate(fleet_config_dict(namespace, **rollout))


def fleet_config_dict(namespace: str, **rollout: Any) -> dict[str, Any]:
    return {
        "management": {"namespace": namespace},
        "clusters": {"namespaces": [namespace]},
        "download": {"urlTemplate": "https://releases.invalid/{version}/k0s-{arch}",
                     "allowUnverified": True},
        "agent": {"drainTimeout": "1s", "verifyTimeout": "1s"},
        "rollout": {"failureBudget": 1,
                    "progressDeadlines": {"pending": "3s", "downloading": "5s",
                                          "cordoning": "5s", "applyingUpdate": "5s",
                                          "restarting": "5s", "verifying": "5s",
                                          "unCordoning": "5s"},
                    **rollout},
    }


class Lines:
    """A text stream that keeps what the CLI writes, line by line (for `follow`'s out)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, s: str) -> None:
        self.lines.append(s)

    def flush(self) -> None:
        pass
