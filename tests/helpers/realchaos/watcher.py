"""The independent invariant watcher of a real-world chaos trial.

It watches what the fleet really looks like (every workload API server's Nodes, the
management server's NodePlans) through its own clients, never the controller's caches or
reasoning, and checks at every event:

- per MachineDeployment, never more workers unavailable (NotReady, cordoned, or carrying a
  live k0s-fleet request) than its maxUnavailable (the only thing taking nodes down in a
  trial is the upgrade itself);
- per cluster, never two control planes unavailable at once;
- no worker with a live request while a control plane of its cluster is not yet done;

and, once every stream has caught up (at the end):

- no node signalled twice for one attempt of one NodePlan (two requests with the same
  plan and attempt but different start times, unless the NodePlan was deleted and
  created anew in between);
- no cluster of the default wave started (its first NodePlan created) before the canary
  wave was complete and soaked (dated by the nodes' own status timestamps and the API
  server's creationTimestamp: no watch lag enters the judgement).

The handlers are plain functions of the events (unit-tested without servers); ``run``
feeds them from real watches. Every distinct node step seen (a signal state of one
request) advances ``steps``, on which the fault schedule fires.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import anyio.abc

from fleet.contract.signal import (
    CORDONED_BY_KEY,
    RUNNING_VERSION_KEY,
    InvalidSignalError,
    SignalData,
    SignalState,
    parse_signal,
)
from fleet.contract.versions import same_version
from fleet.kube import KubeClient, KubeObject
from fleet.kube.resources import NODE_PLANS, NODES
from fleet.kube.watch import Reflector, WatchEvent
from fleet.world.model import parse_time
from tests.helpers.realchaos.schedule import TARGET, ClusterShape, Schedule

DONE_STATES = (SignalState.UNCORDONING, SignalState.COMPLETED)


def _signal(node: KubeObject) -> SignalData | None:
    try:
        return parse_signal((node.get("metadata") or {}).get("annotations"))
    except InvalidSignalError:
        return None


def live(node: KubeObject) -> bool:
    """The node carries a k0s-fleet request that has not ended."""
    sig = _signal(node)
    return sig is not None and (sig.status is None or not sig.status.status.terminal)


def ready(node: KubeObject) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def cordoned(node: KubeObject) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable")) or \
        CORDONED_BY_KEY in ((node.get("metadata") or {}).get("annotations") or {})


def unavailable(node: KubeObject | None) -> bool:
    return node is None or not ready(node) or cordoned(node) or live(node)


def reports(node: KubeObject | None, version: str) -> bool:
    ann = ((node or {}).get("metadata") or {}).get("annotations") or {}
    return same_version(ann.get(RUNNING_VERSION_KEY), version)


def done(node: KubeObject | None, version: str = TARGET) -> bool:
    return node is not None and reports(node, version) and not unavailable(node)


@dataclass
class ChaosWatcher:
    sched: Schedule
    soak: timedelta = timedelta(seconds=5)
    slack: timedelta = timedelta(seconds=1.5)  # creationTimestamp has whole seconds
    clock: Any = time.monotonic
    wall: Any = field(default=lambda: datetime.now(UTC))
    nodes: dict[str, dict[str, KubeObject]] = field(default_factory=dict)  # cluster -> name
    plans: dict[str, KubeObject] = field(default_factory=dict)  # name -> NodePlan
    plan_uids: dict[str, set[str]] = field(default_factory=dict)
    # (cluster, node) -> (planId, attempt) -> request start times seen
    requests: dict[tuple[str, str], dict[tuple[str, int], set[str]]] = field(
        default_factory=dict)
    step_keys: set[tuple[str, str, str, str, str]] = field(default_factory=set)
    # (cluster, node) -> earliest evidence (wall time) that the node was done at TARGET
    done_at: dict[tuple[str, str], datetime] = field(default_factory=dict)
    # default-wave NodePlans: name -> creationTimestamp
    later_wave_starts: dict[str, datetime] = field(default_factory=dict)
    # (cluster, node, planId, request created) -> [start, end]: when each request was live
    # (end: its terminal status timestamp, or when it was seen gone; None while live)
    spans: dict[tuple[str, str, str, str], list[datetime | None]] = field(
        default_factory=dict)
    current: dict[tuple[str, str], tuple[str, str, str, str]] = field(default_factory=dict)
    # cluster -> its first NodePlan's creationTimestamp (the moment it was admitted)
    admitted_at: dict[str, datetime] = field(default_factory=dict)
    # when the rollout record was unreadable (the record-corrupt fault)
    unreadable: list[tuple[datetime, datetime]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    events: int = 0
    armed: bool = False
    max_unavailable_seen: dict[str, int] = field(default_factory=dict)
    _step_changed: anyio.Event = field(default_factory=anyio.Event)

    def __post_init__(self) -> None:
        self.shapes: dict[str, ClusterShape] = {c.name: c for c in self.sched.clusters}
        self.nodes = {c.name: {} for c in self.sched.clusters}

    @property
    def steps(self) -> int:
        return len(self.step_keys)

    def _violate(self, text: str) -> None:
        if text not in self.violations[-20:]:
            self.violations.append(text)

    # -- events ------------------------------------------------------------------------------
    def on_node(self, cluster: str, ev: WatchEvent) -> None:
        shape = self.shapes[cluster]
        name = ev.object["metadata"]["name"]
        if name not in shape.machines:
            return
        self.events += 1
        if ev.type == "DELETED":
            self.nodes[cluster].pop(name, None)
            self._request_gone(cluster, name, None)
        else:
            self.nodes[cluster][name] = ev.object
            self._record_request(cluster, name, ev.object)
        if done(self.nodes[cluster].get(name)):
            self.done_at.setdefault((cluster, name), self.wall())
        self.check(cluster)

    def _request_gone(self, cluster: str, name: str,
                      now: tuple[str, str, str, str] | None) -> None:
        """The node no longer carries the request it carried (or carries ``now``): a
        request that never said it ended ends when it was seen gone."""
        before = self.current.get((cluster, name))
        if before is not None and before != now:
            span = self.spans.get(before)
            if span is not None and span[1] is None:
                span[1] = self.wall()
        if now is None:
            self.current.pop((cluster, name), None)
        else:
            self.current[(cluster, name)] = now

    def _record_request(self, cluster: str, name: str, node: KubeObject) -> None:
        sig = _signal(node)
        if sig is None:
            self._request_gone(cluster, name, None)
            return
        created = sig.created.isoformat()
        span_key = (cluster, name, sig.planId, created)
        self._request_gone(cluster, name, span_key)
        span = self.spans.setdefault(span_key, [sig.created, None])
        if sig.status is not None and sig.status.status.terminal and (
                span[1] is None or sig.status.timestamp < span[1]):
            span[1] = sig.status.timestamp
        self.requests.setdefault((cluster, name), {}).setdefault(
            (sig.planId, sig.command.id), set()).add(created)
        if sig.status is None:
            return
        key = (cluster, name, sig.planId, created, str(sig.status.status))
        if key not in self.step_keys:
            self.step_keys.add(key)
            self._step_changed.set()
            self._step_changed = anyio.Event()
        if sig.status.status in DONE_STATES and same_version(
                sig.command.k0supdate.version, TARGET):
            at = sig.status.timestamp
            prev = self.done_at.get((cluster, name))
            if prev is None or at < prev:
                self.done_at[(cluster, name)] = at

    def on_plan(self, ev: WatchEvent) -> None:
        meta = ev.object["metadata"]
        self.events += 1
        name = meta["name"]
        self.plan_uids.setdefault(name, set()).add(meta["uid"])
        if ev.type == "DELETED":
            self.plans.pop(name, None)
            return
        self.plans[name] = ev.object
        cluster = (ev.object.get("spec") or {}).get("clusterName")
        shape = self.shapes.get(str(cluster))
        created = parse_time(meta.get("creationTimestamp"))
        if shape is not None and created is not None:
            first = self.admitted_at.get(shape.name)
            if first is None or created < first:
                self.admitted_at[shape.name] = created
        if shape is not None and shape.wave != "canary" and created is not None:
            self.later_wave_starts.setdefault(name, created)

    def record_unreadable(self, start: datetime, end: datetime) -> None:
        self.unreadable.append((start, end))

    def check(self, cluster: str) -> None:
        if not self.armed:
            return
        shape = self.shapes[cluster]
        nodes = self.nodes[cluster]
        down = [w for w in shape.worker_names if unavailable(nodes.get(w))]
        self.max_unavailable_seen[cluster] = max(self.max_unavailable_seen.get(cluster, 0),
                                                 len(down))
        if len(down) > shape.max_unavailable:
            self._violate(f"{cluster}: {len(down)} workers unavailable (maxUnavailable "
                          f"{shape.max_unavailable}): {down}")
        cps = [c for c in shape.control_plane_names if unavailable(nodes.get(c))]
        if len(cps) > 1:
            self._violate(f"{cluster}: {len(cps)} control planes down at once: {cps}")
        upgrading = [w for w in shape.worker_names if w in nodes and live(nodes[w])]
        behind = [c for c in shape.control_plane_names if not done(nodes.get(c))]
        if upgrading and behind:
            self._violate(f"{cluster}: workers {upgrading} upgrading while control planes "
                          f"{behind} are not done")

    def arm(self) -> None:
        """Start judging (every node is up and nothing was asked of any yet)."""
        self.armed = True
        for c in self.shapes:
            self.check(c)

    # -- at the end --------------------------------------------------------------------------
    def final_violations(self) -> list[str]:
        out: list[str] = []
        for (cluster, node), by_attempt in sorted(self.requests.items()):
            for (plan_id, attempt), starts in sorted(by_attempt.items()):
                incarnations = len(self.plan_uids.get(plan_id.partition("/")[2], ())) or 1
                if len(starts) > incarnations:
                    out.append(f"{cluster}/{node}: signalled {len(starts)} times for attempt "
                               f"{attempt} of {plan_id} ({incarnations} NodePlan object(s)):"
                               f" {sorted(starts)}")
        out += self.admission_violations()
        canary = [(c.name, m) for c in self.sched.clusters if c.wave == "canary"
                  for m in c.machines]
        if self.later_wave_starts:
            missing = [n for n in canary if n not in self.done_at]
            if missing:
                out.append(f"default wave started ({sorted(self.later_wave_starts)}) but "
                           f"canary nodes {missing} were never seen done")
            else:
                canary_done = max(self.done_at[n] for n in canary)
                for name, created in sorted(self.later_wave_starts.items()):
                    if created + self.slack < canary_done + self.soak:
                        out.append(f"NodePlan {name} created {created.isoformat()}, before "
                                   f"the canary wave was complete ({canary_done.isoformat()})"
                                   f" and soaked {self.soak.total_seconds():.0f}s")
        return out

    def admission_violations(self) -> list[str]:
        """Judged on the API server's and the nodes' own timestamps (no watch lag):

        - no cluster of the default wave admitted (its first NodePlan created) while
          maxConcurrentClusters other clusters of that wave had a node upgrading (a request
          live from before the admission to after it, whatever became of its NodePlan);
        - no cluster admitted while the rollout record was unreadable (some seconds after
          it was spoiled: a decision taken just before may still be carried out)."""
        out: list[str] = []
        slack = self.slack
        for cluster, at in sorted(self.admitted_at.items()):
            shape = self.shapes[cluster]
            for start, end in self.unreadable:
                if start + 4 * slack < at < end:
                    out.append(f"{cluster} admitted at {at.isoformat()} while the rollout "
                               f"record was unreadable ({start.isoformat()} .. "
                               f"{end.isoformat()})")
            if shape.wave == "canary":
                continue
            busy = sorted({c for (c, _n, _p, _cr), (s, e) in self.spans.items()
                           if c != cluster and self.shapes[c].wave == shape.wave
                           and s is not None and s + slack < at
                           and (e is None or e > at + slack)})
            if len(busy) >= self.sched.max_concurrent:
                out.append(f"{cluster} admitted at {at.isoformat()} while {busy} were "
                           f"upgrading (maxConcurrentClusters {self.sched.max_concurrent})")
        return out

    # -- feeding it from real watches ----------------------------------------------------------
    async def wait_steps(self, n: int, timeout: float) -> bool:
        """Until ``n`` node steps were seen (True) or ``timeout`` passed without a new
        step (False: the rollout is not moving; the fault fires anyway)."""
        while self.steps < n:
            changed = self._step_changed
            with anyio.move_on_after(timeout):
                await changed.wait()
                continue
            return False
        return True

    async def run(self, mgmt: KubeClient, namespace: str, workloads: Mapping[str, KubeClient],
                  *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        reflectors = [Reflector(mgmt, NODE_PLANS, namespace=namespace, watch_timeout=60,
                                listener=self._plan_listener)]
        for cluster, client in workloads.items():
            reflectors.append(Reflector(client, NODES, watch_timeout=60,
                                        listener=self._node_listener(cluster)))
        async with anyio.create_task_group() as tg:
            for r in reflectors:
                tg.start_soon(r.run)
            for r in reflectors:
                await r.synced.wait()
            task_status.started()

    async def _plan_listener(self, ev: WatchEvent) -> None:
        self.on_plan(ev)

    def _node_listener(self, cluster: str) -> Any:
        async def listener(ev: WatchEvent) -> None:
            self.on_node(cluster, ev)
        return listener


__all__ = ["ChaosWatcher", "cordoned", "done", "live", "ready", "unavailable"]
