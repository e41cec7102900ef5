"""The planner: snapshot in, actions out. Pure; the controllers do the I/O."""

from fleet.planner.actions import Action, Decision, PlanResult
from fleet.planner.core import plan
from fleet.planner.policy import FleetPolicy, Hold
from fleet.planner.settings import COMPLETING, PENDING, PlannerSettings

__all__ = ["COMPLETING", "PENDING", "Action", "Decision", "FleetPolicy", "Hold", "PlanResult",
           "PlannerSettings", "plan"]
