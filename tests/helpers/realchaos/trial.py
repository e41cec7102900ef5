"""One seeded chaos trial on the real test world.

etcd and one kube-apiserver per cluster (management + one per workload cluster, audited),
the Cluster API objects of each cluster (tests: fleet.testing.capi), one simulated node
per Machine (fake k0s under a supervisor, the real ``k0s-fleet agent`` process), a local
release server with the target's digest pinned, and two ``k0s-fleet controller``
processes with leader election. Every cluster is bumped to the target; the schedule's
faults fire at their step boundaries (tests.helpers.realchaos.schedule) while the
independent watcher judges every event. When the faults have stopped, the operator
retries failed NodePlans and the fleet must converge: every node on the target with the
right bytes, nothing cordoned, no request live, every NodePlan Completed, every
K0sControlPlane and MachineDeployment UpToDate, the leading controller's /healthz 200.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from fleet.contract.nodeplan import NodePlanPhase
from fleet.events import list_events
from fleet.kube import KubeClient, KubeError, NotFoundError
from fleet.kube.resources import (
    CLUSTERS,
    CONFIGMAPS,
    K0S_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    NAMESPACES,
    NODE_PLANS,
    NODES,
)
from fleet.planner import conditions as C
from fleet.rollout.annotations import ROLLOUT_CONFIGMAP, STATE_KEY
from fleet.testing.audit import AuditLog, audit_args
from fleet.testing.capi import FleetCluster, bump, create_cluster, ensure_infra_crd
from fleet.testing.releases import ReleaseServer
from fleet.testing.simnode import SimNode
from fleet.testing.world import ApiServer, World
from fleet.world.model import ANN_RETRY, parse_time
from tests.helpers.realchaos.fencing import check_audit_log
from tests.helpers.realchaos.processes import LEASE_NAME, Agents, Controllers
from tests.helpers.realchaos.schedule import (
    DOWNLOAD_FAULT_MAX,
    FAULT_KINDS,
    OLD,
    TARGET,
    Fault,
    Schedule,
    schedule,
)
from tests.helpers.realchaos.watcher import ChaosWatcher, cordoned, done, live, unavailable

# How often the operator retries one failed NodePlan. Wrong bytes fail a request at once
# (the agent retries no attempt of it), so a node that gets every spoiled answer of a
# download fault needs one retry per answer (seed 3 of `make chaos-real ARGS=--small`:
# wrong-bytes x4 all on one node, given up after 3 retries, the canary wave halted).
OPERATOR_RETRIES = DOWNLOAD_FAULT_MAX

NAMESPACE = "chaos"
SOAK = timedelta(seconds=5)
CANARY_LABELS = {"ring": "canary"}
TOUCH = "chaos.k0s-fleet.test/touch"
USERS = ("fleet-controller", "fleet-agent", "chaos-storm")
REPLICA_USERS = tuple(f"ctl-{i}" for i in range(40))  # one per controller process
REPLAY = ".venv/bin/python -m tests.helpers.realchaos --seed {seed}{small}"


@dataclass
class TrialResult:
    seed: int
    schedule: str
    violations: list[str]
    faults: Counter[str]
    seconds: float
    steps: int = 0
    events: int = 0
    conflicts: Counter[str] = field(default_factory=Counter)  # 409s by user
    controller_exits: list[tuple[str, int]] = field(default_factory=list)
    agent_exits: list[tuple[str, int]] = field(default_factory=list)
    retries: int = 0  # failed node upgrades the operator retried
    workdir: str = ""
    small: bool = False

    @property
    def ok(self) -> bool:
        return not self.violations

    fault_count: int | None = None

    @property
    def replay(self) -> str:
        return REPLAY.format(seed=self.seed, small=" --small" if self.small else "") + (
            f" --faults {self.fault_count}" if self.fault_count is not None else "")

    def report(self) -> str:
        head = (f"seed {self.seed}: {'ok' if self.ok else 'FAILED'} in {self.seconds:.0f}s; "
                f"{self.steps} node steps, {self.events} events checked; faults "
                f"{dict(self.faults)}; 409s {dict(self.conflicts)}; controller exits "
                f"{self.controller_exits}; agent exits {len(self.agent_exits)}; "
                f"operator retries {self.retries}")
        if self.ok:
            return head
        lines = [head, f"  {self.schedule}", f"  replay: {self.replay}",
                 f"  logs: {self.workdir}"]
        lines += [f"  VIOLATION: {v}" for v in self.violations[:10]]
        return "\n".join(lines)


class Trial:
    def __init__(self, seed: int, *, small: bool = False, faults: int | None = None,
                 converge_seconds: float = 300, keep: bool | None = None) -> None:
        self.seed = seed
        self.small = small
        self.fault_count = faults
        self.sched: Schedule = schedule(seed, small=small, faults=faults)
        self.converge_seconds = converge_seconds
        self.keep = keep
        self.faults: Counter[str] = Counter()
        self.violations: list[str] = []
        self.tokens = {u: secrets.token_hex(16) for u in (*USERS, *REPLICA_USERS)}
        self.retried: Counter[str] = Counter()  # NodePlan -> retries asked by the operator

    # -- the whole trial -----------------------------------------------------------------------
    async def run(self) -> TrialResult:
        t0 = time.monotonic()
        workdir = Path(tempfile.mkdtemp(prefix=f"k0s-fleet-chaos-{self.seed}-"))
        result = TrialResult(self.seed, self.sched.describe(), self.violations, self.faults,
                             0.0, workdir=str(workdir), small=self.small,
                             fault_count=self.fault_count)
        names = ["mgmt", *(c.name for c in self.sched.clusters)]
        world = World(names, workdir=workdir / "world", users=self.tokens,
                      extra_args={n: audit_args(workdir / "world" / n / "audit")
                                  for n in names})
        try:
            await anyio.to_thread.run_sync(world.start)
            await world.install_crds()
            await self._run_in(world, workdir, result)
        except Exception as e:
            self.violations.append(f"trial error: {type(e).__name__}: {e}")
        finally:
            with anyio.CancelScope(shield=True):
                for s in world.servers.values():
                    if s.proc is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(s.proc.pid, signal.SIGCONT)
                result.conflicts = self._conflicts(world)
                audit = world["mgmt"].workdir / "audit" / "audit.log"
                if audit.exists():
                    self.violations.extend(check_audit_log(audit, lease=LEASE_NAME,
                                                           user_prefix="ctl-"))
                await anyio.to_thread.run_sync(world.close)
        result.seconds = time.monotonic() - t0
        keep = self.keep if self.keep is not None else not result.ok
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        return result

    @staticmethod
    def _conflicts(world: World) -> Counter[str]:
        out: Counter[str] = Counter()
        for s in world.servers.values():
            with contextlib.suppress(OSError, ValueError):
                for r in AuditLog(s.workdir / "audit" / "audit.log").requests():
                    if r.code == 409 and r.verb != "create":
                        out[r.user] += 1
        return out

    async def _run_in(self, world: World, workdir: Path, result: TrialResult) -> None:
        async with contextlib.AsyncExitStack() as stack:
            mgmt = await stack.enter_async_context(await world["mgmt"].client())
            wl = {c.name: await stack.enter_async_context(await world[c.name].client())
                  for c in self.sched.clusters}
            storm = {n: await stack.enter_async_context(
                await world[n].client(token=self.tokens["chaos-storm"]))
                for n in world.servers}
            await mgmt.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
            await ensure_infra_crd(mgmt)
            rs = await stack.enter_async_context(ReleaseServer())
            old, new = rs.add(OLD), rs.add(TARGET)
            fleet = await self._clusters(world, mgmt, wl)
            nodes = await self._nodes(stack, world, wl, workdir, old)
            watcher = ChaosWatcher(self.sched, soak=SOAK)
            agents = Agents(nodes)
            controllers = Controllers(
                workdir, self._config(rs.base_url, new.sha256),
                lambda identity: world["mgmt"].kubeconfig(token=self.tokens[identity],
                                                          user=identity), mgmt, NAMESPACE)
            try:
                async with anyio.create_task_group() as tg:
                    await tg.start(watcher.run, mgmt, NAMESPACE, wl)
                    await self._all_ready(watcher)
                    watcher.arm()
                    for name in nodes:
                        tg.start_soon(agents.supervise, name)
                    tg.start_soon(controllers.supervise)
                    tg.start_soon(self._operator, mgmt)
                    for fc in fleet:
                        await bump(mgmt, fc, TARGET)
                    async with anyio.create_task_group() as storms:
                        for fault in self.sched.faults:
                            await watcher.wait_steps(fault.at_step, timeout=6)
                            await self._inject(fault, storms, world, mgmt, storm, rs,
                                               watcher, agents, controllers, nodes)
                    rs.modes.clear()  # the faults stop (storms included)
                    result.retries = await self._converge(mgmt, fleet, watcher, nodes,
                                                          new.sha256)
                    leader = await controllers.wait_leader(timeout=60)
                    if leader is None:
                        self.violations.append("no controller took the Lease within 60s "
                                               "after the faults")
                    elif (code := await controllers.healthz(leader)) != 200:
                        self.violations.append(f"leader {leader.identity} /healthz {code}")
                    tg.cancel_scope.cancel()
            finally:
                with anyio.CancelScope(shield=True):
                    await controllers.stop()
            self.violations.extend(watcher.violations)
            self.violations.extend(watcher.final_violations())
            self.violations.extend(controllers.violations)
            self.violations.extend(agents.violations)
            result.steps, result.events = watcher.steps, watcher.events
            result.controller_exits = controllers.exits
            result.agent_exits = agents.exits

    # -- set-up --------------------------------------------------------------------------------
    async def _clusters(self, world: World, mgmt: KubeClient,
                        wl: dict[str, KubeClient]) -> list[FleetCluster]:
        out = []
        for shape in self.sched.clusters:
            kubeconfig = world[shape.name].kubeconfig(token=self.tokens["fleet-controller"],
                                                      user="fleet-controller")
            fc = await create_cluster(mgmt, wl[shape.name], kubeconfig, namespace=NAMESPACE,
                                      name=shape.name, version=OLD,
                                      control_planes=shape.control_planes,
                                      workers=shape.workers,
                                      max_unavailable=shape.max_unavailable,
                                      create_nodes=False)
            if fc.machines != shape.machines:
                raise RuntimeError(f"machines {fc.machines} != schedule's {shape.machines}")
            if shape.wave == "canary":
                await mgmt.patch(CLUSTERS, shape.name,
                                 {"metadata": {"labels": CANARY_LABELS}}, NAMESPACE)
            out.append(fc)
        return out

    async def _nodes(self, stack: contextlib.AsyncExitStack, world: World,
                     wl: dict[str, KubeClient], workdir: Path, old: Any) -> dict[str, SimNode]:
        nodes: dict[str, SimNode] = {}

        async def one(cluster: str, machine: str) -> None:
            kubeconfig = world[cluster].kubeconfig(token=self.tokens["fleet-agent"],
                                                   user="fleet-agent")
            nodes[machine] = await stack.enter_async_context(_sim_node(
                wl[cluster], kubeconfig, workdir / "nodes" / machine, old, machine,
                self.sched.crash_points.get(machine)))

        for shape in self.sched.clusters:
            for machine in shape.machines:
                await one(shape.name, machine)
        return nodes

    def _config(self, base_url: str, sha256: str) -> dict[str, Any]:
        deadline = "10m"  # only the faults may explain a delay: no deadline fires
        return {
            "management": {"namespace": NAMESPACE},
            "clusters": {"namespaces": [NAMESPACE], "unreachableAfter": "5s"},
            "download": {"urlTemplate": base_url + "/k0s/{version}?arch={arch}",
                         "digests": {TARGET: {"amd64": sha256}}},
            "agent": {"drainTimeout": "20s", "verifyTimeout": "20s"},
            "rollout": {
                "maxConcurrentClusters": 2,
                "progressDeadlines": dict.fromkeys(
                    ("pending", "downloading", "cordoning", "applyingUpdate", "restarting",
                     "verifying", "unCordoning"), deadline),
                "waves": [{"name": "canary", "canary": True,
                           "clusterSelector": {"matchLabels": CANARY_LABELS},
                           "soakSeconds": f"{int(SOAK.total_seconds())}s"},
                          {"name": "default", "clusterSelector": {},
                           "maxConcurrentClusters": self.sched.max_concurrent,
                           "failureBudget": self.sched.failure_budget}]},
        }

    async def _all_ready(self, watcher: ChaosWatcher, timeout: float = 120) -> None:
        """Until every node is Ready, schedulable and asked nothing (then judging starts)."""
        with anyio.fail_after(timeout):
            while not all(not unavailable(watcher.nodes[c.name].get(m))
                          for c in self.sched.clusters for m in c.machines):
                await anyio.sleep(0.1)

    # -- faults ----------------------------------------------------------------------------------
    async def _inject(self, fault: Fault, tg: anyio.abc.TaskGroup,  # noqa: PLR0917
                      world: World, mgmt: KubeClient,
                      storm: dict[str, KubeClient], rs: ReleaseServer, watcher: ChaosWatcher,
                      agents: Agents, controllers: Controllers,
                      nodes: dict[str, SimNode]) -> None:
        clusters = [c.name for c in self.sched.clusters]
        self.faults[fault.kind] += 1
        kind = fault.kind
        if kind == "controller-kill":
            leader = await controllers.leader()
            if leader is not None:
                controllers.kill(leader)
        elif kind == "leader-pause":
            leader = await controllers.leader()
            if leader is not None:
                controllers.pause(leader)
                await anyio.sleep(fault.seconds)
                controllers.resume(leader)
        elif kind == "agent-kill":
            busy = sorted(m for c in clusters for m, n in watcher.nodes[c].items() if live(n))
            pool = busy or sorted(nodes)
            agents.kill(pool[fault.pick % len(pool)])
        elif kind == "conflict-storm":
            tg.start_soon(self._storm, storm, fault.seconds)  # while the next faults fire
        elif kind == "workload-down":
            server = world[clusters[fault.pick % len(clusters)]]
            await anyio.to_thread.run_sync(server.stop)
            await anyio.sleep(fault.seconds)
            await anyio.to_thread.run_sync(server.start)
        elif kind in ("mgmt-stall", "workload-stall"):
            name = "mgmt" if kind == "mgmt-stall" else clusters[fault.pick % len(clusters)]
            await _stall(world[name], fault.seconds)
        elif kind == "mgmt-restart":
            await anyio.to_thread.run_sync(world["mgmt"].restart)
        elif kind == "nodeplan-delete":
            await self._delete_plan(mgmt, fault.pick)
        elif kind == "download-fail":
            rs.fail(TARGET, fault.mode, fault.times)
        elif kind == "record-corrupt":
            await self._corrupt_record(mgmt, watcher, fault)
        else:  # pragma: no cover - schedule and trial disagree
            raise ValueError(f"unknown fault {kind!r} (known: {FAULT_KINDS})")

    async def _storm(self, clients: dict[str, KubeClient], seconds: float) -> None:
        """Concurrent writers on every Node, NodePlan and MachineDeployment: one per
        object, each patching an annotation back to back, so that the controller's and
        the agents' resourceVersion-guarded writes meet real 409s."""
        end = time.monotonic() + seconds

        async def hammer(client: KubeClient, res: Any, name: str, ns: str | None) -> None:
            n = 0
            while time.monotonic() < end:
                n += 1
                with anyio.move_on_after(5), contextlib.suppress(KubeError):
                    await client.patch(res, name, {"metadata": {"annotations": {
                        TOUCH: str(n)}}}, ns)
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as tg:
            for name, client in clients.items():
                targets: list[tuple[Any, str | None]] = [
                    (NODE_PLANS, NAMESPACE), (MACHINE_DEPLOYMENTS, NAMESPACE)] \
                    if name == "mgmt" else [(NODES, None)]
                for res, ns in targets:
                    with anyio.move_on_after(5), contextlib.suppress(KubeError):
                        for o in (await client.list(res, ns)).items:
                            for _ in range(2):  # two writers per object
                                tg.start_soon(hammer, client, res, o["metadata"]["name"], ns)

    @staticmethod
    async def _corrupt_record(mgmt: KubeClient, watcher: ChaosWatcher,
                              fault: Fault) -> None:
        """Overwrite the rollout record (not JSON, or JSON of the wrong shape), leave it so
        for the fault's seconds, then repair it as docs/rollout-policy.md tells an operator
        to: delete the key. While it is unreadable the controller must admit no cluster
        (the watcher judges the window) and go on with everything else."""
        garbage = "{\"waves\": {\"canary\": " if fault.mode == "not-json" else \
            '{"waves": [1, 2], "admitted": "everything"}'
        written = False
        with anyio.move_on_after(20):
            while not written:
                try:
                    await mgmt.patch(CONFIGMAPS, ROLLOUT_CONFIGMAP,
                                     {"data": {STATE_KEY: garbage}}, NAMESPACE)
                    written = True
                except NotFoundError:
                    return  # no record yet: nothing to spoil
                except KubeError:
                    await anyio.sleep(0.5)  # a stalled or restarting API server
        started = watcher.wall()
        said = False
        try:
            with anyio.move_on_after(fault.seconds):
                while True:  # the leader says why it holds, on the ConfigMap
                    with contextlib.suppress(KubeError):
                        said = said or any(
                            e.get("reason") == "RolloutRecordUnreadable"
                            and parse_time(e.get("eventTime")) is not None
                            and parse_time(e.get("eventTime")) >= started - timedelta(seconds=1)
                            for e in await list_events(mgmt, NAMESPACE,
                                                       regarding_name=ROLLOUT_CONFIGMAP))
                    await anyio.sleep(1.0)
        finally:
            # repaired even when the write's answer was lost (it may have landed)
            with anyio.CancelScope(shield=True), anyio.move_on_after(60):
                while True:
                    try:
                        await mgmt.patch(CONFIGMAPS, ROLLOUT_CONFIGMAP,
                                         {"data": {STATE_KEY: None}}, NAMESPACE)
                        break
                    except NotFoundError:
                        break
                    except KubeError:
                        await anyio.sleep(0.5)
            if written:
                watcher.record_unreadable(started, watcher.wall())
                if not said:
                    watcher.violations.append(
                        f"the rollout record was unreadable for {fault.seconds:.0f}s "
                        f"({fault.mode}) and no RolloutRecordUnreadable Event said so")

    @staticmethod
    async def _delete_plan(mgmt: KubeClient, pick: int) -> None:
        with anyio.move_on_after(20), contextlib.suppress(KubeError):
            plans = (await mgmt.list(NODE_PLANS, NAMESPACE)).items
            flying = [p for p in plans if (p.get("status") or {}).get("phase")
                      not in (NodePlanPhase.COMPLETED, NodePlanPhase.FAILED)]
            pool = sorted(p["metadata"]["name"] for p in flying or plans)
            if pool:
                with contextlib.suppress(NotFoundError):
                    await mgmt.delete(NODE_PLANS, pool[pick % len(pool)], NAMESPACE)

    # -- the end ---------------------------------------------------------------------------------
    async def _converge(self, mgmt: KubeClient, fleet: list[FleetCluster],
                        watcher: ChaosWatcher, nodes: dict[str, SimNode], sha256: str) -> int:
        """Retry failed NodePlans (the operator) until everything is done; the number of
        retries, or a violation saying what is not done at the deadline."""
        retried = self.retried
        deadline = time.monotonic() + self.converge_seconds
        missing: list[str] = []
        while time.monotonic() < deadline:
            missing = []
            with anyio.move_on_after(20):
                plans = await self._retry_failed(mgmt)
                for p in plans:
                    name, phase = p["metadata"]["name"], (p.get("status") or {}).get("phase")
                    if phase != NodePlanPhase.COMPLETED or p["metadata"].get(
                            "deletionTimestamp"):
                        missing.append(f"NodePlan {name} {phase}: "
                                       f"{(p.get('status') or {}).get('message')}")
                for shape in self.sched.clusters:
                    for m in shape.machines:
                        node = watcher.nodes[shape.name].get(m)
                        if not done(node):
                            missing.append(f"node {m} not done (live {live(node or {})}, "
                                           f"cordoned {cordoned(node or {})})")
                        running = await nodes[m].running_version()
                        if running != TARGET or _sha256(nodes[m].binary) != sha256:
                            missing.append(f"node {m} runs {running}")
                missing += await self._owners_not_done(mgmt, fleet)
            if not missing:
                return sum(retried.values())
            await anyio.sleep(1.0)
        self.violations.append(f"not converged {self.converge_seconds:.0f}s after the faults "
                               f"stopped: " + "; ".join(missing[:12]))
        return sum(retried.values())

    async def _retry_failed(self, mgmt: KubeClient) -> list[dict[str, Any]]:
        """The operator: every Failed NodePlan retried (at most OPERATOR_RETRIES times
        each); returns the NodePlans listed."""
        plans = (await _quiet_list(mgmt, NODE_PLANS)) or []
        for p in plans:
            name, phase = p["metadata"]["name"], (p.get("status") or {}).get("phase")
            ann = p["metadata"].get("annotations") or {}
            if phase == NodePlanPhase.FAILED and ANN_RETRY not in ann \
                    and self.retried[name] < OPERATOR_RETRIES:
                self.retried[name] += 1
                with contextlib.suppress(KubeError):
                    await mgmt.patch(NODE_PLANS, name, {"metadata": {"annotations": {
                        ANN_RETRY: f"chaos-{self.retried[name]}"}}}, NAMESPACE)
        return plans

    async def _operator(self, mgmt: KubeClient) -> None:
        """Retries failed node upgrades while the faults go on (forever; cancelled)."""
        while True:
            with anyio.move_on_after(20):
                await self._retry_failed(mgmt)
            await anyio.sleep(2.0)

    @staticmethod
    async def _owners_not_done(mgmt: KubeClient, fleet: list[FleetCluster]) -> list[str]:
        out = []
        for fc in fleet:
            for res, name in ((K0S_CONTROL_PLANES, fc.kcp), (MACHINE_DEPLOYMENTS, fc.md)):
                if not name:
                    continue
                try:
                    obj = await mgmt.get(res, name, NAMESPACE)
                except KubeError as e:
                    out.append(f"{name}: {e}")
                    continue
                conds = (obj.get("status") or {}).get("conditions") or []
                if not any(c.get("type") == C.UP_TO_DATE and c.get("status") == "True"
                           and f" on {TARGET}" in (c.get("message") or "") for c in conds):
                    out.append(f"{name} not UpToDate")
        return out


async def _quiet_list(client: KubeClient, res: Any) -> list[dict[str, Any]] | None:
    try:
        return (await client.list(res, NAMESPACE)).items
    except KubeError:
        return None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def _stall(server: ApiServer, seconds: float) -> None:
    """SIGSTOP the API server: connections stay open, nothing answers; then SIGCONT."""
    assert server.proc is not None
    os.killpg(server.proc.pid, signal.SIGSTOP)
    try:
        await anyio.sleep(seconds)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.proc.pid, signal.SIGCONT)


@contextlib.asynccontextmanager
async def _sim_node(client: KubeClient, kubeconfig: dict[str, Any],  # noqa: PLR0917
                    root: Path, old: Any, name: str,
                    crash_at: str | None) -> AsyncIterator[SimNode]:
    async with SimNode.running(client, kubeconfig, root, old, name=name,
                               crash_at=crash_at) as node:
        yield node


async def run_trial(seed: int, *, small: bool = False, faults: int | None = None,
                    keep: bool | None = None) -> TrialResult:
    return await Trial(seed, small=small, faults=faults, keep=keep).run()


__all__ = ["NAMESPACE", "Trial", "TrialResult", "run_trial"]
