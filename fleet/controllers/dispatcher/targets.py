"""Which object an action writes: actions on one object run in order, actions on
different objects concurrently (the controller's ordering key)."""

from __future__ import annotations

from fleet.contract.nodeplan import nodeplan_name
from fleet.planner.actions import Action, ClearSignal, CreateNodePlan, SignalNode, UncordonNode
from fleet.world.model import ObjectRef


def action_target(action: Action) -> tuple[str, ...]:
    """Actions on the same object run in order; different objects run concurrently."""
    if isinstance(action, CreateNodePlan):
        return ("NodePlan", action.machine.namespace,
                nodeplan_name(action.machine.name, action.version))
    for attr in ("plan", "machine", "machine_set", "owner", "obj", "regarding"):
        ref = getattr(action, attr, None)
        if isinstance(ref, ObjectRef):
            return (ref.kind, ref.namespace, ref.name)
    if isinstance(action, SignalNode | ClearSignal | UncordonNode):
        return ("Node", *action.cluster, action.node)
    return ("other",)
