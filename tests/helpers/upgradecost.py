"""What one node upgrade costs in API requests, counted at the real API servers.

A test world of its own (etcd, a management and a workload kube-apiserver, both
auditing every request, see :mod:`fleet.testing.audit`) with three identities: the
controller (``k0s-fleet-controller``, both clusters), the node agents
(``k0s-fleet-agent``, workload cluster) and the harness (everything else: creating the
objects, the simulated kubelet and k0s supervisor, the waiting). One CAPI cluster of
control planes and workers, every node a :class:`~fleet.testing.simnode.SimNode` running
the real agent, binaries from a local release server with pinned digests.

The counted window opens once the controller has settled on the old version (its
conditions written) and every agent watches its node, just before the version bump; it
closes once every NodePlan is Completed, every Machine records the new version, both
owners say K0sFleetUpToDate for it, and neither controller nor agents have made a
request for ``quiet`` seconds. Watches are opened with a long timeout so that no
periodic re-connect falls into the window (those cost per minute, not per upgrade).
Used by ``tests/integration/test_upgrade_requests.py`` and ``bench/requests.py``
(it runs the controller, so it lives with the tests, not in fleet.testing).
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from fleet.config.models import FleetConfig
from fleet.contract.nodeplan import NodePlanPhase
from fleet.contract.versions import same_version
from fleet.controllers.runner import FleetController, Tuning
from fleet.events import EventRecorder
from fleet.kube import KubeClient
from fleet.kube.resources import (
    FLEET_UPGRADES,
    K0S_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINES,
    NAMESPACES,
    NODE_PLANS,
    Resource,
)
from fleet.planner import conditions as C
from fleet.rollout.policy import RolloutPolicy
from fleet.testing.audit import AuditedRequest, AuditLog, audit_args, tally
from fleet.testing.capi import FleetCluster, bump, create_cluster, ensure_infra_crd
from fleet.testing.releases import ReleaseServer
from fleet.testing.simnode import SimNode
from fleet.testing.world import World
from fleet.world.model import ANN_MACHINE_RUNNING_VERSION

CONTROLLER_USER = "k0s-fleet-controller"
AGENT_USER = "k0s-fleet-agent"
V1, V2 = "v1.31.2+k0s.0", "v1.31.3+k0s.0"
SERVERS = ("mgmt", "wl")


@dataclass
class UpgradeCost:
    """Requests made during one rollout, by (server, request), with the node count."""

    nodes: int
    seconds: float
    requests: dict[str, list[AuditedRequest]] = field(default_factory=dict)
    # the FleetUpgrade's status at the end of the window (what `kubectl get` then shows)
    upgrade_status: dict[str, Any] = field(default_factory=dict)

    def of(self, user: str, server: str | None = None) -> list[AuditedRequest]:
        return [r for s, reqs in sorted(self.requests.items()) if server in (None, s)
                for r in reqs if r.user == user]

    def per_node(self, user: str, server: str | None = None) -> float:
        return len(self.of(user, server)) / self.nodes

    def breakdown(self, user: str) -> dict[str, float]:
        """Requests per node upgrade by ``server verb resource``."""
        counts: Counter[str] = Counter()
        for server in sorted(self.requests):
            for key, n in tally(self.of(user, server), by="both").items():
                counts[f"{server} {key}"] += n
        return {k: round(v / self.nodes, 2) for k, v in sorted(counts.items())}

    def summary(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "seconds": round(self.seconds, 1), **{
            who: {"per_node": round(self.per_node(user), 2),
                  "writes_per_node": round(sum(r.write for r in self.of(user)) / self.nodes, 2),
                  "by_request": self.breakdown(user)}
            for who, user in (("controller", CONTROLLER_USER), ("agent", AGENT_USER))}}


def fleet_config(namespace: str, base_url: str, digest: str) -> FleetConfig:
    deadlines = dict.fromkeys(("pending", "downloading", "cordoning", "applyingUpdate",
                               "restarting", "verifying", "unCordoning"), "60s")
    return FleetConfig.model_validate({
        "management": {"namespace": namespace},
        "clusters": {"namespaces": [namespace]},
        "download": {"urlTemplate": base_url + "/k0s/{version}?arch={arch}",
                     "digests": {V2: {"amd64": digest}}},
        "agent": {"drainTimeout": "30s", "verifyTimeout": "30s"},
        "rollout": {"progressDeadlines": deadlines},
    })


async def _condition(client: KubeClient, res: Resource, name: str, ns: str, target: str
                     ) -> bool:
    obj = await client.get(res, name, ns)
    return any(c.get("type") == C.UP_TO_DATE and c.get("status") == "True"
               and f" on {target}" in (c.get("message") or "")
               for c in (obj.get("status") or {}).get("conditions") or [])


async def _settled(admin: KubeClient, fc: FleetCluster, target: str, *, plans: bool) -> bool:
    ns, machines = fc.namespace, len(fc.machines)
    if fc.kcp and not await _condition(admin, K0S_CONTROL_PLANES, fc.kcp, ns, target):
        return False
    if fc.md and not await _condition(admin, MACHINE_DEPLOYMENTS, fc.md, ns, target):
        return False
    if not plans:
        return True
    done = [p for p in (await admin.list(NODE_PLANS, ns)).items
            if (p.get("status") or {}).get("phase") == NodePlanPhase.COMPLETED]
    recorded = [m for m in (await admin.list(MACHINES, ns)).items
                if same_version(((m["metadata"].get("annotations") or {}).get(
                    ANN_MACHINE_RUNNING_VERSION) or m["spec"].get("version")), target)]
    return len(done) == machines and len(recorded) == machines


async def _wait(predicate: Any, timeout: float, what: str) -> None:
    with anyio.move_on_after(timeout):
        while not await predicate():
            await anyio.sleep(0.1)
        return
    raise TimeoutError(f"not {what} within {timeout:g}s")


async def _quiet(logs: dict[str, AuditLog], since: dict[str, int], quiet: float,
                 timeout: float) -> None:
    """Wait until controller and agents made no request for ``quiet`` seconds."""
    def count() -> int:
        return sum(1 for s, log in logs.items() for r in log.requests(since[s])
                   if r.user in (CONTROLLER_USER, AGENT_USER))

    with anyio.fail_after(timeout):
        last, at = count(), time.monotonic()
        while time.monotonic() - at < quiet:
            await anyio.sleep(0.2)
            now = count()
            if now != last:
                last, at = now, time.monotonic()


async def measure_rollout(*, control_planes: int = 1, workers: int = 6,
                          max_unavailable: int = 2, quiet: float = 3.0,
                          timeout: float = 300.0, workdir: Path | None = None,
                          policy: bool = True, record_watch: bool = True) -> UpgradeCost:
    """Roll one cluster from V1 to V2 with real agents; count every request.

    ``policy``: the controller runs with the fleet rollout policy, as `k0s-fleet
    controller` does (its rollout record, Events); ``record_watch``: the policy keeps
    that record from a watch (as deployed) rather than a GET per pass."""
    root = workdir or Path(tempfile.mkdtemp(prefix="k0s-fleet-cost-"))
    try:
        return await _measure(root, control_planes=control_planes, workers=workers,
                              max_unavailable=max_unavailable, quiet=quiet, timeout=timeout,
                              policy=policy, record_watch=record_watch)
    finally:
        if workdir is None and not os.environ.get("K0S_FLEET_KEEP_WORLD"):
            shutil.rmtree(root, ignore_errors=True)


async def _measure(root: Path, *, control_planes: int, workers: int, max_unavailable: int,
                   quiet: float, timeout: float, policy: bool, record_watch: bool
                   ) -> UpgradeCost:
    tokens = {CONTROLLER_USER: secrets.token_hex(16), AGENT_USER: secrets.token_hex(16)}
    world = World(list(SERVERS), workdir=root / "world", users=tokens,
                  extra_args={s: audit_args(root / f"audit-{s}") for s in SERVERS})
    logs = {s: AuditLog(root / f"audit-{s}" / "audit.log") for s in SERVERS}
    with world:
        await world.install_crds()
        async with contextlib.AsyncExitStack() as stack:
            admin = await stack.enter_async_context(await world["mgmt"].client())
            wl = await stack.enter_async_context(await world["wl"].client())
            ctl = await stack.enter_async_context(
                await world["mgmt"].client(token=tokens[CONTROLLER_USER]))
            await ensure_infra_crd(admin)
            ns = f"cost-{secrets.token_hex(4)}"
            await admin.create(NAMESPACES, {"metadata": {"name": ns}})
            fc = await create_cluster(
                admin, wl, world["wl"].kubeconfig(tokens[CONTROLLER_USER], CONTROLLER_USER),
                namespace=ns, name="cost", control_planes=control_planes, workers=workers,
                max_unavailable=max_unavailable, version=V1, create_nodes=False)
            rs = await stack.enter_async_context(ReleaseServer())
            old, new = rs.add(V1), rs.add(V2)
            agent_kubeconfig = world["wl"].kubeconfig(tokens[AGENT_USER], AGENT_USER)
            nodes = [await stack.enter_async_context(SimNode.running(
                wl, agent_kubeconfig, root / f"n{i}", old, name=name))
                for i, name in enumerate(fc.machines)]
            config = fleet_config(ns, rs.base_url, new.sha256)
            recorder = EventRecorder(ctl, instance="cost", default_namespace=ns)
            rollout = RolloutPolicy(ctl, config, recorder=recorder) if policy else None
            controller = FleetController(ctl, config, identity="cost", recorder=recorder,
                                         policy=rollout, tuning=Tuning(watch_timeout=3600))
            async with anyio.create_task_group() as tg:
                if rollout is not None:
                    if record_watch:
                        tg.start_soon(functools.partial(
                            rollout.coordinator.watch, controller.trigger.poke,
                            watch_timeout=3600))
                    tg.start_soon(rollout.wakeups, controller.trigger.poke, controller.clock)
                await tg.start(controller.run)
                await _wait(lambda: _settled(admin, fc, V1, plans=False), timeout, "settled on V1")
                for node in nodes:
                    await _wait(node.agent_ready, timeout, f"agent of {node.name}")
                await _quiet(logs, {s: 0 for s in SERVERS}, quiet, timeout)
                since = {s: log.mark() for s, log in logs.items()}
                t0 = time.monotonic()
                await bump(admin, fc, V2)
                await _wait(lambda: _settled(admin, fc, V2, plans=True), timeout,
                            "rolled out to V2")
                seconds = time.monotonic() - t0

                async def upgrade_status() -> dict[str, Any]:
                    fu = await admin.get(FLEET_UPGRADES, f"to-{fc.name}", ns)
                    return dict(fu.get("status") or {})

                if policy:  # the FleetUpgrade's status says so too (the policy writes it)
                    await _wait(lambda: _complete(upgrade_status), timeout,
                                "the FleetUpgrade Complete")
                await _quiet(logs, since, quiet, timeout)
                until = {s: log.mark() for s, log in logs.items()}
                final = await upgrade_status()
                tg.cancel_scope.cancel()
    return UpgradeCost(nodes=len(fc.machines), seconds=seconds, requests={
        s: log.requests(since[s], until[s]) for s, log in logs.items()}, upgrade_status=final)


async def _complete(status: Any) -> bool:
    return bool((await status()).get("phase") == "Complete")
