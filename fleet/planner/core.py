"""The planner: a pure function from a Snapshot to the actions that move the fleet on.

Rules (docs/controller.md has the long form):

* Control planes of a cluster: one node at a time, only while every control-plane node is
  Ready and none is in flight or failed-not-cleared, oldest Machine first.
* Workers of a cluster wait until every control-plane Machine runs its KCP's target (its
  version recorded, or its node found Completed on it) and none is in flight, and never go
  to a version newer than the oldest control plane.
* Workers of a MachineDeployment: at most ``maxUnavailable`` unavailable, where
  unavailable = Machines with an in-flight NodePlan + nodes NotReady / unschedulable /
  missing + Failed NodePlans for the target not yet cleared + missing replicas.
* A per-object failure budget halts new dispatches; the retry annotation resets failures.
* Per-phase progress deadlines turn a silent node into a Failed NodePlan.

Everything is recomputed from the snapshot on every pass: there is no memory here.
"""

from __future__ import annotations

from fleet.planner.actions import PlanResult
from fleet.planner.policy import Hold
from fleet.planner.sequencing import Sequencing
from fleet.planner.settings import PlannerSettings
from fleet.planner.upkeep import NodePlanUpkeep
from fleet.world.model import Snapshot


def plan(snapshot: Snapshot, settings: PlannerSettings, *, hold: Hold | None = None
         ) -> PlanResult:
    """Compute the actions for one pass. Pure: same snapshot, same answer.

    ``hold(cluster, owner)`` may name a reason to start no new node upgrade for that
    object now (the fleet rollout's waves, windows and pauses); nodes already in flight
    are looked after regardless.
    """
    return _Pass(snapshot, settings, hold).run()


class _Pass(NodePlanUpkeep, Sequencing):
    """One pass: NodePlan upkeep first (its views feed sequencing), then sequencing."""

    # -- the pass ----------------------------------------------------------------------
    def run(self) -> PlanResult:
        for key in sorted(self.s.nodeplans):
            self._upkeep(self.s.nodeplans[key])
        self._send_requests()
        self._record_completions()
        self._owner_retries()
        self._orphan_signals()
        for key in sorted(self.s.control_planes):
            self._control_plane(self.s.control_planes[key])
        for key in sorted(self.s.deployments):
            self._deployment(self.s.deployments[key])
        return PlanResult(actions=self.actions, wake_at=self.wake_at, decisions=self.decisions)
