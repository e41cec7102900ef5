"""The fleet rollout wired into the controller: its ``policy`` hook, status and metrics.

``attach_rollout(controller)`` is the one call the controller's entry point makes:

* it becomes the controller's ``policy``: before each planning pass it turns the
  snapshot into cluster progress (labels and annotations from the controller's own
  Cluster cache), asks the :class:`~fleet.rollout.coordinator.RolloutCoordinator` (the
  gate + its durable record + Events) and hands the planner ``decision.hold``;
* it publishes every decision to a :class:`~fleet.status.server.StatusBoard` and feeds
  the planner's actions to the metrics (``on_pass``);
* ``serve()`` runs the HTTP endpoints (/status, /healthz, /readyz, /metrics) on
  ``status.port`` on every replica, and pokes the controller when the gate's next
  wake-up (end of a soak, opening of a maintenance window) comes, since no watch event
  would announce it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio

from fleet.config import FleetConfig
from fleet.events import EventRecorder
from fleet.kube import KubeClient
from fleet.kube.resources import CLUSTERS
from fleet.model import ClusterKey, ObjectRef, Snapshot
from fleet.planner.actions import PlanResult
from fleet.rollout.coordinator import RolloutCoordinator
from fleet.rollout.gate import GateDecision
from fleet.rollout.intents import write_upgrade_status
from fleet.rollout.progress import clusters_from_snapshot
from fleet.status.server import StatusBoard, make_app, serve

log = logging.getLogger(__name__)

Hold = Callable[[ClusterKey, ObjectRef], "str | None"]
ClusterMeta = tuple[Mapping[str, str], Mapping[str, str]]


def cluster_meta(objects: Iterable[Mapping[str, Any]]) -> dict[ClusterKey, ClusterMeta]:
    """(labels, annotations) of CAPI Cluster objects, by (namespace, name)."""
    out: dict[ClusterKey, ClusterMeta] = {}
    for obj in objects:
        m = obj.get("metadata") or {}
        out[(m.get("namespace") or "", m.get("name") or "")] = (
            dict(m.get("labels") or {}), dict(m.get("annotations") or {}))
    return out


class RolloutPolicy:
    """Callable as the controller's ``policy``: snapshot in, the gate's hold out."""

    def __init__(self, mgmt: KubeClient, config: FleetConfig, *,
                 meta: Callable[[], Mapping[ClusterKey, ClusterMeta]],
                 recorder: EventRecorder | None = None, board: StatusBoard | None = None,
                 clock: Callable[[], datetime] | None = None) -> None:
        kw = {"clock": clock} if clock is not None else {}
        self.coordinator = RolloutCoordinator(mgmt, config, recorder=recorder, **kw)
        self.mgmt = mgmt
        self.clock = clock or (lambda: datetime.now(UTC))
        self.config = config
        self.meta = meta
        self.board = board if board is not None else StatusBoard()
        self.decision: GateDecision | None = None
        self._wakeup_changed = anyio.Event()

    async def __call__(self, snapshot: Snapshot) -> Hold:
        clusters = clusters_from_snapshot(snapshot, self.meta())
        decision = await self.coordinator.decide(clusters, snapshot.now)
        previous = self.decision.next_wakeup if self.decision is not None else None
        self.decision = decision
        self.board.publish(decision, clusters)
        # The upgrade intents' status: per wave and per cluster, from this very decision.
        await write_upgrade_status(self.mgmt, snapshot.upgrades, snapshot.intents, decision,
                                   clusters, clock=self.clock)
        if decision.next_wakeup != previous:
            self._wakeup_changed.set()
        return decision.hold

    @property
    def stopped(self) -> bool:
        """Emergency stop in force (config or annotation): the controller should also hold
        starts and signals of NodePlans already created, as for rollout.emergencyStop."""
        return self.decision is not None and self.decision.emergency_stop is not None

    def on_pass(self, snapshot: Snapshot, result: PlanResult) -> None:
        self.board.metrics.observe_nodeplans(snapshot.nodeplans.values())

    async def wakeups(self, poke: Callable[[], None], clock: Callable[[], datetime]) -> None:
        """Poke the controller when the gate's next wake-up time comes (forever)."""
        while True:
            self._wakeup_changed = anyio.Event()
            at = self.decision.next_wakeup if self.decision is not None else None
            delay = math.inf if at is None else max(0.0, (at - clock()).total_seconds())
            with anyio.move_on_after(delay):
                await self._wakeup_changed.wait()
                continue
            poke()
            # The pass that follows moves next_wakeup on; re-check soon in any case.
            with anyio.move_on_after(1.0):
                await self._wakeup_changed.wait()


class _Controller(Protocol):
    """What attach_rollout needs of fleet.controllers.runner.FleetController."""

    mgmt: KubeClient
    config: FleetConfig
    recorder: EventRecorder
    clock: Callable[[], datetime]
    policy: Any
    on_pass: Any
    view: Any
    trigger: Any
    ready: anyio.Event


class RolloutRuntime:
    def __init__(self, controller: _Controller, policy: RolloutPolicy) -> None:
        self.controller = controller
        self.policy = policy

    @property
    def board(self) -> StatusBoard:
        return self.policy.board

    async def wake_on_schedule(self) -> None:
        """Poke the controller when a soak ends or a window opens (no watch event says
        so), until cancelled. ``serve`` runs it too; run it alone when not serving HTTP."""
        await self.policy.wakeups(self.controller.trigger.poke, self.controller.clock)

    async def serve(self, *, host: str = "0.0.0.0", port: int | None = None) -> None:
        """HTTP endpoints + wake-ups, until cancelled, on every replica. /readyz answers
        as soon as the server runs: a standby replica must count as ready too, or an HA
        Deployment never finishes rolling; /status is 503 until this replica leads."""
        c = self.controller
        app = make_app(self.board)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: serve(app, host=host, port=port if port is not None
                                        else c.config.status.port))
            tg.start_soon(self.wake_on_schedule)


def attach_rollout(controller: _Controller, *, board: StatusBoard | None = None
                   ) -> RolloutRuntime:
    """Make the fleet rollout the controller's policy; returns what to ``serve()``."""
    view = controller.view

    def meta() -> Mapping[ClusterKey, ClusterMeta]:
        return cluster_meta(view[CLUSTERS])

    policy = RolloutPolicy(controller.mgmt, controller.config, meta=meta,
                           recorder=controller.recorder, board=board, clock=controller.clock)
    controller.policy = policy
    if controller.on_pass is None:
        controller.on_pass = policy.on_pass
    return RolloutRuntime(controller, policy)
