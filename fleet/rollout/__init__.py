"""Fleet-wide rollout policy: waves, soak, failure budgets, windows, pause and stop.

``gate`` is the pure wave engine the controller consults before each dispatch;
``progress`` builds its input from the controller's snapshot; ``state`` is the durable
record kept in the rollout ConfigMap.
"""

from fleet.rollout.gate import FleetControls, FleetView, GateDecision, RolloutGate

__all__ = ["FleetControls", "FleetView", "GateDecision", "RolloutGate"]
