"""Seeded chaos trials over a simulated fleet, judged by an independent watcher.

One trial: a fleet of small clusters (random control planes, workers, budgets; a canary
wave, a prod wave and the default wave) is bumped to a new version and driven by the real
gate (:class:`~fleet.rollout.gate.RolloutGate`) and the real planner
(:func:`~fleet.planner.plan`) while a seeded schedule of faults hits it:

* the controller killed at a random point of a pass (a random prefix of its actions
  lands; the rollout record it had not written is lost), or replaced by another replica
  (the same: only what is durable survives);
* the management API server restarting (passes skipped);
* 409 storms on Nodes and NodePlans (a write fails; the next pass redoes it);
* a workload API server stopped for 10-60 s (its Nodes unknown, marked unreachable);
* agents killed (their node stops answering for a while, then resumes where it was);
* download servers that stall, truncate or serve wrong bytes (the node fails its
  request with FailedDownload, as the agent does after its retries);
* nodes going NotReady for a while.

:class:`InvariantWatcher` sees only the simulated world (never the planner's reasoning)
and checks at every event: never more unavailable workers of a MachineDeployment than
its budget when k0s-fleet starts one; never two control planes of a cluster at once;
never a node signalled twice for one plan attempt; no cluster of a later wave started
before every earlier wave was complete and soaked; and at the end (faults stopped, the
fleet left to settle): every node on the target or its NodePlan Failed with a reason, no
node cordoned by k0s-fleet without a live plan, every NodePlan terminal.

The simulated node side is a model of the agent's protocol (``SimFleet.step_node``); the
same planner and gate run on real API servers in tests/integration. Pure and fast:
thousands of trials take seconds, and a failing trial is replayed from its seed.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from fleet.config.models import FleetConfig
from fleet.contract.nodeplan import NodePlanPhase
from fleet.contract.signal import SignalState
from fleet.contract.versions import same_version
from fleet.planner import PlannerSettings, plan
from fleet.planner.actions import CreateNodePlan, SignalNode
from fleet.planner.simulate import SimFleet, add_cluster, bump
from fleet.rollout.gate import FleetView, RolloutGate
from fleet.rollout.progress import clusters_from_snapshot
from fleet.rollout.state import RolloutState
from fleet.world.budget import UnavailabilityBudget
from fleet.world.model import (
    ANN_RETRY,
    KIND_MD,
    KIND_NODEPLAN,
    ROLE_CONTROLLER,
    ClusterKey,
    NodeInfo,
    ObjectRef,
)

T0 = datetime(2026, 3, 2, 12, 0).astimezone()
OLD = "v1.31.2+k0s.0"
TARGET = "v1.31.3+k0s.0"
CANARY = {"ring": "canary"}
PROD = {"ring": "prod"}
SOAK = {"canary": timedelta(minutes=5), "prod": timedelta(minutes=2),
        "default": timedelta(0)}

BUDGETS: list[int | str] = [1, 2, "50%"]
FAULTS = ("controller-kill", "second-replica", "mgmt-restart", "conflict-storm",
          "workload-down", "agent-kill", "download-stall", "download-truncated",
          "download-wrong-bytes", "node-not-ready")


def chaos_config() -> FleetConfig:
    return FleetConfig.model_validate({"rollout": {
        "maxConcurrentClusters": 2,
        "failureBudget": 2,
        "progressDeadlines": {"pending": "20m", "downloading": "20m", "cordoning": "20m",
                              "applyingUpdate": "20m", "restarting": "20m",
                              "verifying": "20m", "unCordoning": "20m"},
        "waves": [
            {"name": "canary", "canary": True, "clusterSelector": {"matchLabels": CANARY},
             "maxConcurrentClusters": 1, "soakSeconds": "5m"},
            {"name": "prod", "clusterSelector": {"matchLabels": PROD},
             "maxConcurrentClusters": 2, "soakSeconds": "2m", "failureBudget": 1},
        ]}}, by_alias=True, by_name=False)


@dataclass
class TrialResult:
    seed: int
    violations: list[str]
    events: int
    faults: dict[str, int]
    steps: int
    completed_nodes: int
    failed_nodes: int

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass
class InvariantWatcher:
    """Judges the simulated world only, event by event."""

    sim: SimFleet
    waves: dict[ClusterKey, str]
    wave_order: list[str]
    # The world's Nodes of a cluster, also while its API server is away (the truth, not
    # what the controller sees).
    nodes_of: Callable[[ClusterKey], Mapping[str, NodeInfo]]
    # Clusters admitted in the durable rollout record (the ConfigMap): a cluster starts
    # at its admission or its first NodePlan, whichever comes first.
    admitted: Callable[[], Iterable[str]]
    violations: list[str] = field(default_factory=list)
    events: int = 0
    seen_requests: dict[tuple[ClusterKey, str], set[tuple[str, str, int]]] = field(
        default_factory=dict)
    complete_at: dict[ClusterKey, datetime] = field(default_factory=dict)
    started: set[ClusterKey] = field(default_factory=set)
    complete_now: set[ClusterKey] = field(default_factory=set)
    plans_seen: set[tuple[str, str]] = field(default_factory=set)

    def _violate(self, text: str) -> None:
        if len(self.violations) < 20:
            self.violations.append(f"[{self.sim.now:%H:%M:%S}] {text}")

    def _world_nodes(self, ckey: ClusterKey) -> Mapping[str, NodeInfo]:
        return self.nodes_of(ckey)

    def _live(self, ckey: ClusterKey, node: str) -> bool:
        n = self.nodes_of(ckey).get(node)
        sig = n.signal if n is not None else None
        return sig is not None and (sig.status is None or not sig.status.status.terminal)

    def _cluster_complete(self, ckey: ClusterKey) -> bool:
        nodes = self.nodes_of(ckey)
        for m in self.sim.machines.values():
            if (m.ref.namespace, m.cluster) != ckey:
                continue
            n = nodes.get(m.node_name)
            if n is None or not n.ready or n.unschedulable or self._live(ckey, m.node_name):
                return False
            if not (same_version(n.running_version, TARGET) or (
                    n.running_version is None and same_version(m.version, TARGET))):
                return False
        return True

    def observe(self, what: str) -> None:
        """Called after every change to the world."""
        self.events += 1
        self.complete_now = set()
        for ckey in self.sim.clusters:
            if self._cluster_complete(ckey):
                self.complete_now.add(ckey)
                self.complete_at.setdefault(ckey, self.sim.now)  # first completion
        for ckey in self.sim.nodes:
            nodes = self.nodes_of(ckey)
            cps = [m.node_name for m in self.sim.machines.values()
                   if (m.ref.namespace, m.cluster) == ckey and m.role == ROLE_CONTROLLER
                   and self._live(ckey, m.node_name)]
            if len(cps) > 1:
                self._violate(f"{what}: two control planes of {ckey} at once: {cps}")
            for name, n in nodes.items():
                sig = n.signal
                if sig is None:
                    continue
                ident = (sig.planId, sig.created.isoformat(), sig.command.id)
                seen = self.seen_requests.setdefault((ckey, name), set())
                if ident not in seen:
                    seen.add(ident)
                    self._new_request(ckey, name, what)
        for cid in self.admitted():
            ns, _, name = cid.partition("/")
            if (ns, name) not in self.started and (ns, name) in self.waves:
                self.started.add((ns, name))
                self._cluster_started((ns, name), what)
        for key, p in self.sim.nodeplans.items():
            ckey = (p.ref.namespace, p.cluster)
            if ckey not in self.started:
                self.started.add(ckey)
                self._cluster_started(ckey, what)
            if key not in self.plans_seen:
                self.plans_seen.add(key)
                self._plan_created(ckey, p.machine, what)
        self._budgets(what)

    def _md_budget(self, owner: ObjectRef) -> int:
        md = self.sim.deployments[(owner.namespace, owner.name)]
        return UnavailabilityBudget.resolve(md.max_unavailable, md.replicas, md.max_surge).limit

    def _budgets(self, what: str) -> None:
        """What k0s-fleet has taken down (a live request, or its cordon) per MD."""
        taken: dict[ObjectRef, list[str]] = {}
        for m in self.sim.machines.values():
            if m.owner is None or m.owner.kind != KIND_MD:
                continue
            ckey = (m.ref.namespace, m.cluster)
            n = self._world_nodes(ckey).get(m.node_name)
            if n is not None and (n.cordoned_by is not None or self._live(ckey, m.node_name)):
                taken.setdefault(m.owner, []).append(m.node_name)
        for owner, names in taken.items():
            if len(names) > self._md_budget(owner):
                self._violate(f"{what}: {sorted(names)} of {owner.name} taken down at once "
                              f"(maxUnavailable {self._md_budget(owner)})")

    def _plan_created(self, ckey: ClusterKey, machine: str, what: str) -> None:
        """k0s-fleet decided to take this worker down: was there room in the budget?"""
        m = self.sim.machines.get((ckey[0], machine))
        if m is None or m.owner is None or m.owner.kind != KIND_MD:
            return
        nodes = self._world_nodes(ckey)
        limit = self._md_budget(m.owner)
        down = [o.node_name for o in self.sim.machines.values()
                if o.owner == m.owner and o.ref.name != machine
                and ((n := nodes.get(o.node_name)) is None or not n.ready or n.unschedulable
                     or self._live(ckey, o.node_name) or self._plan_live(ckey, o.ref.name))]
        if len(down) + 1 > limit:
            self._violate(f"{what}: {machine} started with {down} already unavailable in "
                          f"{m.owner.name} (maxUnavailable {limit})")

    def _plan_live(self, ckey: ClusterKey, machine: str) -> bool:
        return any(p.machine == machine and (p.ref.namespace, p.cluster) == ckey
                   and p.phase in (NodePlanPhase.PENDING, NodePlanPhase.IN_PROGRESS, "")

                   for p in self.sim.nodeplans.values())

    def _cluster_started(self, ckey: ClusterKey, what: str) -> None:
        """Its first NodePlan: every earlier wave must be complete and soaked by now."""
        wave = self.waves[ckey]
        index = self.wave_order.index(wave)
        for other, w in self.waves.items():
            if self.wave_order.index(w) >= index:
                continue
            done = self.complete_at.get(other)
            if other not in self.complete_now or done is None or self.sim.now < done + SOAK[w]:
                self._violate(f"{what}: {ckey} (wave {wave}) started while {other} "
                              f"(wave {w}) was not complete and soaked")

    def seen_plan_attempts(self) -> Iterable[tuple[str, str, int]]:
        for s in self.seen_requests.values():
            yield from s

    def _new_request(self, ckey: ClusterKey, node: str, what: str) -> None:
        """A node was just signalled: was it allowed to be?"""
        # Never two requests for one attempt of one plan on a node.
        sig = self.nodes_of(ckey)[node].signal
        assert sig is not None
        same_plan = [i for i in self.seen_requests[(ckey, node)] if i[0] == sig.planId
                     and i[2] == sig.command.id]
        if len(same_plan) > 1:
            self._violate(f"{what}: {node} signalled twice for {sig.planId} "
                          f"attempt {sig.command.id}")

    def final(self) -> None:
        live_plans = {(p.ref.namespace, p.cluster, p.node) for p in self.sim.nodeplans.values()
                      if p.phase in (NodePlanPhase.PENDING, NodePlanPhase.IN_PROGRESS, "")}
        for p in self.sim.nodeplans.values():
            if p.phase not in (NodePlanPhase.COMPLETED, NodePlanPhase.FAILED):
                self._violate(f"end: NodePlan {p.ref.name} not terminal ({p.phase!r})")
            elif p.phase == NodePlanPhase.FAILED and not p.message:
                self._violate(f"end: NodePlan {p.ref.name} Failed without a reason")
        failed_nodes = {(p.ref.namespace, p.cluster, p.node) for p in self.sim.nodeplans.values()
                        if p.phase == NodePlanPhase.FAILED and same_version(p.version, TARGET)}
        for m in self.sim.machines.values():
            ckey = (m.ref.namespace, m.cluster)
            n = self.nodes_of(ckey).get(m.node_name)
            if n is None:
                self._violate(f"end: node {m.node_name} missing")
                continue
            on_target = same_version(n.running_version, TARGET) or (
                n.running_version is None and same_version(m.version, TARGET))
            if not on_target and (*ckey, m.node_name) not in failed_nodes:
                self._violate(f"end: {m.node_name} neither on {TARGET} nor failed "
                              f"(runs {n.running_version})")
            if n.cordoned_by is not None and (*ckey, m.node_name) not in live_plans:
                self._violate(f"end: {m.node_name} cordoned by k0s-fleet without a live plan")


@dataclass
class _Outage:
    until: datetime


class Trial:
    """One seeded trial. ``run()`` returns its result; nothing is shared between trials."""

    def __init__(self, seed: int, *, clusters: int = 3, max_steps: int = 1500,
                 ignore_waves: bool = False) -> None:
        """``ignore_waves``: a deliberately broken controller that starts every cluster at
        once (to show that the watcher catches it)."""
        self.seed = seed
        self.ignore_waves = ignore_waves
        self.rnd = random.Random(seed)
        self.max_steps = max_steps
        self.sim = SimFleet(now=T0)
        self.config = chaos_config()
        self.gate = RolloutGate(self.config)
        self.settings = PlannerSettings(deadlines={}, default_deadline=timedelta(minutes=20),
                                        halt_at_failures=2)
        self.state = RolloutState()  # the durable rollout record (ConfigMap)
        waves: dict[ClusterKey, str] = {}
        rings = [("canary", CANARY)] + [("prod", PROD)] * 2 + [("default", {})]
        for i in range(max(3, clusters)):
            wave, labels = rings[i] if i < len(rings) else self.rnd.choice(rings)
            workers = self.rnd.randint(1, 4)
            budget = self.rnd.choice(BUDGETS if workers > 1 else [1])  # 50% of 1 is 0
            key = add_cluster(self.sim, f"c{i}", namespace="fleet",
                              control_planes=self.rnd.choice([0, 1, 3]), workers=workers,
                              max_unavailable=budget, version=OLD)
            self.sim.clusters[key] = dataclasses.replace(self.sim.clusters[key],
                                                         labels=dict(labels))
            waves[key] = wave
        for key in list(self.sim.clusters):
            bump(self.sim, key, TARGET)
        self.watcher = InvariantWatcher(self.sim, waves, ["canary", "prod", "default"],
                                        nodes_of=self._node_table,
                                        admitted=lambda: list(self.state.admitted))
        self.faults: dict[str, int] = dict.fromkeys(FAULTS, 0)
        self.down: dict[ClusterKey, tuple[_Outage, dict[str, NodeInfo]]] = {}
        self.agent_dead: dict[tuple[ClusterKey, str], datetime] = {}
        self.not_ready: dict[tuple[ClusterKey, str], datetime] = {}
        self.doomed: dict[tuple[ClusterKey, str], str] = {}  # download fault per node
        self.mgmt_down_until: datetime | None = None
        self.chaos = True

    # -- the controller ---------------------------------------------------------------
    def _pass(self) -> None:
        if self.mgmt_down_until is not None and self.sim.now < self.mgmt_down_until:
            return
        snap = self.sim.snapshot()
        progress = clusters_from_snapshot(snap)
        decision = self.gate.evaluate(FleetView(progress, state=self.state), self.sim.now)
        actions = plan(snap, self.settings,
                       hold=None if self.ignore_waves else decision.hold).actions
        crash = self.chaos and self.rnd.random() < 0.03
        if crash:
            self.faults[self.rnd.choice(["controller-kill", "second-replica"])] += 1
            # The state write may or may not have landed before the kill.
            if self.rnd.random() < 0.5:
                self.state = decision.state
            else:
                # Not recorded: admissions of this pass are withdrawn, so are its starts.
                decision = decision.without_new_admissions()
                actions = plan(snap, self.settings, hold=decision.hold).actions
            actions = actions[: self.rnd.randint(0, len(actions))]
        else:
            self.state = decision.state
        storm = self.chaos and self.rnd.random() < 0.05
        if storm:
            self.faults["conflict-storm"] += 1
        for a in actions:
            if storm and self.rnd.random() < 0.5:
                continue  # 409 after the retries: the next pass redoes it
            if isinstance(a, SignalNode | CreateNodePlan) and a.cluster in self.down:
                continue  # the workload API server does not answer
            self.sim.apply(a)
            self.watcher.observe(type(a).__name__)

    # -- the node side ----------------------------------------------------------------
    def _nodes(self) -> None:
        for ckey, name in self._active():
            key = (ckey, name)
            if key in self.agent_dead and self.sim.now < self.agent_dead[key]:
                continue
            if self.rnd.random() < 0.4:
                continue
            nodes = self._node_table(ckey)
            n = nodes[name]
            sig = n.signal
            assert sig is not None
            state = sig.status.status if sig.status else None
            fault = self.doomed.get(key)
            if fault is not None and state is SignalState.DOWNLOADING:
                self.faults[fault] += 1
                self.doomed.pop(key)
                self._step(ckey, name, fail=SignalState.FAILED_DOWNLOAD)
            else:
                self._step(ckey, name)
            self.watcher.observe(f"node {name}")

    def _node_table(self, ckey: ClusterKey) -> dict[str, NodeInfo]:
        """The cluster's Nodes as they are (also while its API server is away)."""
        if ckey in self.down:
            return self.down[ckey][1]
        nodes = self.sim.nodes[ckey]
        assert nodes is not None
        return nodes

    def _active(self) -> list[tuple[ClusterKey, str]]:
        out = []
        for ckey in sorted(self.sim.nodes):
            for name, n in sorted(self._node_table(ckey).items()):
                sig = n.signal
                if sig is not None and (sig.status is None or not sig.status.status.terminal):
                    out.append((ckey, name))
        return out

    def _step(self, ckey: ClusterKey, name: str, *, fail: SignalState | None = None) -> None:
        if ckey in self.down:  # the node works on while its API server is away
            outage, saved = self.down[ckey]
            self.sim.nodes[ckey] = saved
            self.sim.step_node(ckey, name, fail=fail)
            self.sim.nodes[ckey] = None
            self.down[ckey] = (outage, saved)
        else:
            self.sim.step_node(ckey, name, fail=fail)

    # -- faults -----------------------------------------------------------------------
    def _inject(self) -> None:
        r = self.rnd
        now = self.sim.now
        if r.random() < 0.02 and self.mgmt_down_until is None:
            self.faults["mgmt-restart"] += 1
            self.mgmt_down_until = now + timedelta(seconds=r.randint(5, 30))
        if r.random() < 0.02:
            ckey = r.choice(sorted(self.sim.clusters))
            if ckey not in self.down:
                self.faults["workload-down"] += 1
                self.down[ckey] = (_Outage(now + timedelta(seconds=r.randint(10, 60))),
                                   self._node_table(ckey))
                self.sim.nodes[ckey] = None
                self.sim.clusters[ckey] = dataclasses.replace(
                    self.sim.clusters[ckey], unreachable_since=now,
                    unreachable_error="connection refused")
        machines = sorted(self.sim.machines.values(), key=lambda m: m.ref.name)
        if r.random() < 0.05 and machines:
            m = r.choice(machines)
            key = ((m.ref.namespace, m.cluster), m.node_name)
            self.faults["agent-kill"] += 1
            self.agent_dead[key] = now + timedelta(seconds=r.randint(5, 120))
        if r.random() < 0.02 and machines:
            m = r.choice(machines)
            self.doomed[((m.ref.namespace, m.cluster), m.node_name)] = r.choice(
                ["download-stall", "download-truncated", "download-wrong-bytes"])
        if r.random() < 0.03 and machines:
            m = r.choice(machines)
            ckey = (m.ref.namespace, m.cluster)
            nodes = self._node_table(ckey)
            n = nodes.get(m.node_name)
            if n is not None:
                self.faults["node-not-ready"] += 1
                nodes[m.node_name] = dataclasses.replace(n, ready=False)
                self.not_ready[(ckey, m.node_name)] = now + timedelta(seconds=r.randint(5, 90))
                self.watcher.observe(f"{m.node_name} NotReady")

    def _heal(self, *, all_now: bool = False) -> None:
        now = self.sim.now
        if self.mgmt_down_until is not None and (all_now or now >= self.mgmt_down_until):
            self.mgmt_down_until = None
        for ckey, (outage, saved) in list(self.down.items()):
            if all_now or now >= outage.until:
                self.sim.nodes[ckey] = saved
                self.sim.clusters[ckey] = dataclasses.replace(
                    self.sim.clusters[ckey], unreachable_since=None, unreachable_error="")
                del self.down[ckey]
                self.watcher.observe(f"{ckey} reachable")
        for key, until in list(self.not_ready.items()):
            if all_now or now >= until:
                ckey, name = key
                nodes = self._node_table(ckey)
                n = nodes.get(name)
                if n is not None:
                    sig = n.signal
                    restarting = sig is not None and sig.status is not None and \
                        sig.status.status is SignalState.RESTARTING
                    nodes[name] = dataclasses.replace(n, ready=not restarting)
                del self.not_ready[key]
                self.watcher.observe(f"{name} Ready")
        for key, until in list(self.agent_dead.items()):
            if all_now or now >= until:
                del self.agent_dead[key]
        if all_now:
            self.doomed.clear()

    # -- the trial --------------------------------------------------------------------
    def _quiet(self) -> bool:
        live = any(p.phase in (NodePlanPhase.PENDING, NodePlanPhase.IN_PROGRESS, "")
                   for p in self.sim.nodeplans.values())
        return not live and not self.sim.active_requests()

    def run(self) -> TrialResult:
        self.watcher.observe("start")
        steps = 0
        retried = False
        for steps in range(1, self.max_steps + 1):
            if self.chaos and steps >= self.max_steps // 3:
                self.chaos = False  # faults stop; the fleet is left to settle
            if not self.chaos and not retried:
                self._heal(all_now=True)
                self._retry_failed()  # the operator, once the faults are gone
                retried = True
            if self.chaos:
                self._inject()
            self._heal()
            self._pass()
            self._nodes()
            self.sim.advance(self.rnd.choice([1, 5, 15, 30]))
            if self._quiet():
                self._pass()  # one more pass records what the last steps did
                if self._quiet() and self._settled():
                    if self.chaos:
                        self.chaos = False  # done early: settle and judge
                        continue
                    if retried:
                        break
        self.watcher.final()
        plans = list(self.sim.nodeplans.values())
        return TrialResult(
            seed=self.seed, violations=list(self.watcher.violations),
            events=self.watcher.events, faults={k: v for k, v in self.faults.items() if v},
            steps=steps,
            completed_nodes=sum(p.phase == NodePlanPhase.COMPLETED for p in plans),
            failed_nodes=sum(p.phase == NodePlanPhase.FAILED for p in plans))

    def _retry_failed(self) -> None:
        for key, p in sorted(self.sim.nodeplans.items()):
            if p.phase == NodePlanPhase.FAILED:
                self.sim.annotate(KIND_NODEPLAN, key, ANN_RETRY, f"chaos-{self.seed}")

    def _settled(self) -> bool:
        """Nothing left that the controller would still start (or is holding back only
        for a soak/window that simulated time will reach)."""
        snap = self.sim.snapshot()
        progress = clusters_from_snapshot(snap)
        decision = self.gate.evaluate(FleetView(progress, state=self.state), self.sim.now)
        starts = [a for a in plan(snap, self.settings, hold=decision.hold).actions
                  if isinstance(a, CreateNodePlan | SignalNode)]
        if starts:
            return False
        if decision.next_wakeup is not None and decision.halted is None:
            self.sim.now = max(self.sim.now, decision.next_wakeup)
            return False
        return True


def run_trials(seeds: Iterable[int], *, clusters: int = 3) -> list[TrialResult]:
    return [Trial(seed, clusters=clusters).run() for seed in seeds]


def summary(results: list[TrialResult], seconds: float) -> str:
    faults: dict[str, int] = dict.fromkeys(FAULTS, 0)
    for r in results:
        for k, v in r.faults.items():
            faults[k] += v
    bad = [r for r in results if not r.ok]
    lines = [f"{len(results)} trials in {seconds:.1f}s, {len(bad)} with violations; "
             f"{sum(r.events for r in results)} events checked; nodes completed "
             f"{sum(r.completed_nodes for r in results)}, failed "
             f"{sum(r.failed_nodes for r in results)}",
             "faults injected: " + ", ".join(f"{k} {v}" for k, v in faults.items())]
    for r in bad[:20]:
        lines.append(f"FAILED seed {r.seed} (replay: python -m tests.helpers.chaos "
                     f"--seed {r.seed}): " + "; ".join(r.violations[:3]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse  # noqa: PLC0415
    import time  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="python -m tests.helpers.chaos",
                                description="Seeded chaos trials over a simulated fleet.")
    p.add_argument("--trials", type=int, default=1000)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--seed", type=int, help="replay one trial and print its violations")
    p.add_argument("--clusters", type=int, default=3)
    args = p.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else range(
        args.first_seed, args.first_seed + args.trials)
    t0 = time.monotonic()
    results = run_trials(seeds, clusters=args.clusters)
    print(summary(results, time.monotonic() - t0))
    if args.seed is not None:
        for v in results[0].violations:
            print(v)
    return 1 if any(not r.ok for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["FAULTS", "InvariantWatcher", "Trial", "TrialResult", "chaos_config", "main",
           "run_trials", "summary"]
