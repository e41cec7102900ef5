"""The fleet rollout as the controller's policy (:class:`~fleet.planner.policy.FleetPolicy`).

:class:`RolloutPolicy` is given to the controller when it is built:

* before each planning pass it turns the snapshot into cluster progress, asks the
  :class:`~fleet.rollout.coordinator.RolloutCoordinator` (the gate + its durable record
  + Events) and hands the planner the decision as its hold (:class:`DecisionHold`);
* it publishes every decision to a :class:`DecisionBoard` (the status endpoint's board)
  and tells it of every pass (metrics);
* :meth:`RolloutPolicy.run` keeps the rollout ConfigMap from a watch (no GET per pass;
  a change someone else made pokes the controller) and pokes the controller when the
  gate's next wake-up (end of a soak, opening of a maintenance window) comes, since no
  watch event would announce it (:meth:`RolloutPolicy.wakeups`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Protocol

import anyio

from fleet.config.models import FleetConfig
from fleet.events import EventRecorder
from fleet.kube import KubeClient
from fleet.planner.policy import Hold
from fleet.rollout.coordinator import RolloutCoordinator
from fleet.rollout.gate import DecisionHold, GateDecision
from fleet.rollout.intents import UpgradeStatusWriter
from fleet.rollout.progress import ClusterProgress, ProgressMemo, foreign_digest
from fleet.world.fence import fleet_wide_writes
from fleet.world.model import Snapshot

log = logging.getLogger(__name__)


class DecisionBoard(Protocol):
    """Where the rollout's decisions go (the status endpoint's board)."""

    def publish(self, decision: GateDecision, clusters: Sequence[ClusterProgress]) -> None: ...

    def observe_pass(self, snapshot: Snapshot) -> None: ...


class RolloutPolicy:
    """The controller's policy: snapshot in, the gate's hold out."""

    def __init__(self, mgmt: KubeClient, config: FleetConfig, *, recorder: EventRecorder,
                 board: DecisionBoard | None = None,
                 clock: Callable[[], datetime] | None = None,
                 fleet_writer: Callable[[], bool] | None = None) -> None:
        kw = {"clock": clock} if clock is not None else {}
        self.coordinator = RolloutCoordinator(mgmt, config, recorder=recorder, **kw)
        self.mgmt = mgmt
        self.clock = clock or (lambda: datetime.now(UTC))
        self.config = config
        self.board = board
        # Sharded replicas: whether this one does the fleet-wide writes now (wave times
        # in the rollout record, FleetUpgrade status); None = always (one active replica).
        self.fleet_writer = fleet_writer
        self.decision: GateDecision | None = None
        self._wakeup_changed = anyio.Event()
        self.progress = ProgressMemo()
        # FleetUpgrade status: from the cached objects, count-only changes coalesced.
        self.upgrade_status = UpgradeStatusWriter(mgmt, clock=self.clock, recorder=recorder)
        # Count-only changes wait only while :meth:`wakeups` runs (it writes them later).
        self._waking = False

    async def __call__(self, snapshot: Snapshot) -> Hold:
        clusters = self.progress.clusters(snapshot)
        writer = self.fleet_writer is None or self.fleet_writer()
        # Decided as the fleet-wide writer: its writes (the record with wave times, the
        # FleetUpgrade status, their Events) are sent only while the writer Lease is held
        # (the sharded replicas' fence, fleet.controllers.shard.ShardMembership.write_fence).
        with fleet_wide_writes(writer):
            decision = await self.coordinator.decide(clusters, snapshot.now,
                                                     fleet_writer=writer)
            previous = self._next_wakeup()
            self.decision = decision
            if self.board is not None:
                self.board.publish(decision, clusters)
            # The upgrade intents' status: per wave and per cluster, from this decision.
            if writer:
                await self.upgrade_status.write(snapshot.upgrades, snapshot.intents, decision,
                                                clusters, defer=self._waking)
            else:
                self.upgrade_status.forget()  # the fleet writer (another replica) writes it
        if self._next_wakeup() != previous:
            self._wakeup_changed.set()
        return DecisionHold(decision)

    def digest(self, part: Snapshot, names: Mapping[str, str]) -> Snapshot:
        """What the controller keeps of the snapshot part of a cluster another replica
        acts on: its rollout progress, all this policy reads of it
        (:func:`fleet.rollout.progress.foreign_digest`)."""
        return foreign_digest(part, names)

    def _next_wakeup(self) -> datetime | None:
        """The gate's next wake-up, or a deferred FleetUpgrade status write's, if sooner."""
        times = [t for t in (self.decision.next_wakeup if self.decision is not None else None,
                             self.upgrade_status.due) if t is not None]
        return min(times, default=None)

    @property
    def stopped(self) -> bool:
        """Emergency stop in force (config or annotation): the controller should also hold
        starts and signals of NodePlans already created, as for rollout.emergencyStop."""
        return self.decision is not None and self.decision.emergency_stop is not None

    def on_pass(self, snapshot: Snapshot) -> None:
        if self.board is not None:
            self.board.observe_pass(snapshot)

    async def run(self, poke: Callable[[], None], clock: Callable[[], datetime]) -> None:
        """The policy's background work, until cancelled: the rollout ConfigMap's watch
        and the gate's wake-ups (both poke the controller)."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.wakeups, poke, clock)
            await self.coordinator.watch(poke)

    async def wakeups(self, poke: Callable[[], None], clock: Callable[[], datetime]) -> None:
        """Poke the controller when the gate's next wake-up time comes, or a deferred
        FleetUpgrade status write is due (until cancelled)."""
        self._waking = True
        try:
            await self._wakeups(poke, clock)
        finally:
            self._waking = False

    async def _wakeups(self, poke: Callable[[], None], clock: Callable[[], datetime]) -> None:
        while True:
            self._wakeup_changed = anyio.Event()
            at = self._next_wakeup()
            delay = math.inf if at is None else max(0.0, (at - clock()).total_seconds())
            with anyio.move_on_after(delay):
                await self._wakeup_changed.wait()
                continue
            poke()
            # The pass that follows moves next_wakeup on; re-check soon in any case.
            with anyio.move_on_after(1.0):
                await self._wakeup_changed.wait()
