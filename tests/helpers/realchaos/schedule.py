"""A real-world chaos trial's fleet and fault schedule, derived from its seed alone (pure).

The same seed always gives the same fleet (clusters, control planes, workers, budgets,
waves), the same agent crash points and the same faults, each fired at the same *step
boundary*: when the independent watcher has seen that many node steps (signal states,
Downloading .. Completed) across the fleet. What real processes make of it varies with
timing; the schedule does not.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from fleet.contract.signal import HAPPY_PATH

OLD = "v1.31.2+k0s.0"
TARGET = "v1.31.3+k0s.0"

# Every fault kind a schedule can hold (what each one does: tests/helpers/realchaos/trial.py).
FAULT_KINDS = (
    "controller-kill",   # SIGKILL the leading controller process; a replacement is started
    "leader-pause",      # SIGSTOP the leader past its Lease (a standby takes over), SIGCONT
    "agent-kill",        # SIGKILL the agent of a node with a live request; restarted
    "conflict-storm",    # concurrent writers on Nodes, NodePlans, MDs: real 409s
    "workload-down",     # a workload kube-apiserver stopped, started again
    "mgmt-stall",        # SIGSTOP / SIGCONT the management kube-apiserver
    "workload-stall",    # SIGSTOP / SIGCONT a workload kube-apiserver
    "mgmt-restart",      # the management kube-apiserver stopped and started
    "nodeplan-delete",   # a NodePlan in flight deleted
    "download-fail",     # the release server stalls, truncates or serves wrong bytes
    "record-corrupt",    # the rollout record overwritten with garbage; repaired later
)
RECORD_MODES = ("not-json", "wrong-shape")
DOWNLOAD_MODES = ("stall", "truncate", "wrong-bytes", "500")
# A download-fail fault spoils at most this many requests to the release server.
DOWNLOAD_FAULT_MAX = 4
# Points at which an agent kills itself (fleet.agents.agent.crash_point) on its first run.
CRASH_POINTS = (
    *(f"{s}:{w}" for s in HAPPY_PATH[:-1] for w in ("before", "after")),
    "Restarting:marked",
    "Completed:after",
)
STEPS_PER_NODE = len(HAPPY_PATH)


@dataclass(frozen=True)
class ClusterShape:
    name: str
    wave: str  # "canary" or "default"
    control_planes: int
    workers: int
    max_unavailable: int

    @property
    def machines(self) -> list[str]:
        return [*self.control_plane_names, *self.worker_names]

    @property
    def control_plane_names(self) -> list[str]:
        return [f"{self.name}-cp-{i}" for i in range(self.control_planes)]

    @property
    def worker_names(self) -> list[str]:
        return [f"{self.name}-md-{i}" for i in range(self.workers)]


@dataclass(frozen=True)
class Fault:
    kind: str
    at_step: int  # fired once the watcher has seen this many node steps fleet-wide
    seconds: float  # how long it lasts (outages, pauses, storms)
    pick: int  # which target (cluster, node, plan), taken modulo what exists when fired
    mode: str = ""  # download-fail: how the release server misbehaves; record-corrupt: how
    times: int = 0  # download-fail: for how many requests

    def describe(self) -> str:
        extra = f" {self.mode} x{self.times}" if self.kind == "download-fail" else (
            f" {self.mode}" if self.mode else "")
        return f"{self.kind}@step{self.at_step} {self.seconds:.0f}s pick {self.pick}{extra}"


@dataclass(frozen=True)
class Schedule:
    seed: int
    clusters: tuple[ClusterShape, ...]
    faults: tuple[Fault, ...]
    crash_points: dict[str, str] = field(default_factory=dict)  # node -> crash point
    # the default wave's policy: clusters upgrading at once, failed clusters tolerated
    max_concurrent: int = 2
    failure_budget: int = 0

    @property
    def machines(self) -> list[str]:
        return [m for c in self.clusters for m in c.machines]

    @property
    def total_steps(self) -> int:
        return STEPS_PER_NODE * len(self.machines)

    def describe(self) -> str:
        shape = ", ".join(f"{c.name}({c.wave}: {c.control_planes} cp, {c.workers} w, "
                          f"maxUnavailable {c.max_unavailable})" for c in self.clusters)
        crashes = ", ".join(f"{n}@{p}" for n, p in sorted(self.crash_points.items()))
        return (f"seed {self.seed}: {shape}; default wave maxConcurrentClusters "
                f"{self.max_concurrent}, failureBudget {self.failure_budget}; faults: "
                + "; ".join(f.describe() for f in self.faults)
                + (f"; agent crash points: {crashes}" if crashes else ""))


def schedule(seed: int, *, clusters: int = 3, faults: int | None = None,
             small: bool = False) -> Schedule:
    """The fleet and faults of trial ``seed``. ``small`` keeps the fleet to what a CI
    slice can afford (at most one control plane, two workers per cluster)."""
    if clusters < 2:
        raise ValueError(f"a chaos fleet needs at least 2 clusters (got {clusters}): a "
                         "canary wave and the rest")
    rnd = random.Random(f"k0s-fleet-realchaos/{seed}")
    shapes = []
    for i in range(clusters):
        cps = rnd.choice((0, 1) if small else (0, 1, 1, 3))
        workers = rnd.randint(1, 2 if small else 3)
        if cps == 0 and workers == 1:
            workers = 2
        shapes.append(ClusterShape(name=f"c{i}", wave="canary" if i == 0 else "default",
                                   control_planes=cps, workers=workers,
                                   max_unavailable=rnd.choice((1, 1, 2))))
    sched = Schedule(seed, tuple(shapes), ())
    total = sched.total_steps
    count = faults if faults is not None else rnd.randint(5, 8)
    # every kind once before any repeats, in a seeded order; the rest drawn at random
    kinds = list(FAULT_KINDS)
    rnd.shuffle(kinds)
    kinds = kinds[:count] + [rnd.choice(FAULT_KINDS) for _ in range(count - len(kinds))]
    steps = sorted(rnd.randint(1, max(2, total * 4 // 5)) for _ in kinds)
    out = [_fault(rnd, kind, step) for kind, step in zip(kinds, steps, strict=True)]
    machines = sched.machines
    crash_nodes = rnd.sample(machines, k=min(len(machines), rnd.randint(1, 3)))
    crash = {n: rnd.choice(CRASH_POINTS) for n in crash_nodes}
    # drawn from their own stream, so that they do not shift the fleet's and faults' draws
    policy = random.Random(f"k0s-fleet-realchaos/{seed}/wave-policy")
    return Schedule(seed, tuple(shapes), tuple(out), crash,
                    max_concurrent=policy.choice((1, 2)), failure_budget=policy.choice((0, 1)))


def _fault(rnd: random.Random, kind: str, step: int) -> Fault:
    seconds = {
        "leader-pause": rnd.uniform(8, 14),  # past the 6 s Lease: a standby takes over
        "conflict-storm": rnd.uniform(8, 20),
        "workload-down": rnd.uniform(10, 25),  # past clusters.unreachableAfter (5 s)
        "mgmt-stall": rnd.uniform(2, 8),  # past the 4 s renew deadline sometimes
        "workload-stall": rnd.uniform(2, 10),
    }.get(kind, 0.0)
    pick = rnd.randrange(1_000_000)
    if kind == "record-corrupt":
        return Fault(kind, step, round(rnd.uniform(12, 20), 1), pick, rnd.choice(RECORD_MODES))
    if kind == "download-fail":
        # up to the agent's 3 attempts: recovered by its retries, or a FailedDownload
        return Fault(kind, step, 0.0, pick, rnd.choice(DOWNLOAD_MODES),
                     rnd.randint(1, DOWNLOAD_FAULT_MAX))
    return Fault(kind, step, round(seconds, 1), pick)


__all__ = ["CRASH_POINTS", "DOWNLOAD_FAULT_MAX", "DOWNLOAD_MODES", "FAULT_KINDS", "OLD",
           "RECORD_MODES",
           "STEPS_PER_NODE", "TARGET", "ClusterShape", "Fault", "Schedule", "schedule"]
