"""Condition types and reasons k0s-fleet writes on MachineDeployments, K0sControlPlanes
and NodePlans. Names are stable API: `kubectl wait --for=condition=<type>` uses them."""

from __future__ import annotations

# On MachineDeployment / K0sControlPlane (status.conditions, next to Cluster API's own).
UP_TO_DATE = "K0sFleetUpToDate"  # every machine runs the target version
PROGRESSING = "K0sFleetProgressing"  # nodes are being upgraded in place right now
HALTED = "K0sFleetHalted"  # failure budget spent; new dispatches stopped
IN_PLACE = "K0sFleetInPlace"  # False: some change is not "only the version"
# The one writer of versions: True while the object's version is the one k0s-fleet wrote
# (or adopted); False when someone else changed it (no node is started then).
VERSION_WRITER = "K0sFleetVersionWriter"
# True while another controller moves the object (a Cluster API rollout, k0smotron, an
# autopilot Plan, another runtime extension): k0s-fleet starts no node meanwhile.
OTHER_DRIVER = "K0sFleetOtherDriver"

# On NodePlan.
NP_DISPATCHED = "Dispatched"  # the node carries the request
NP_COMPLETED = "Completed"  # node on the target version and Ready
NP_FAILED = "Failed"

# Reasons.
R_UP_TO_DATE = "UpToDate"
R_UPGRADING = "Upgrading"
R_WAITING = "Waiting"
R_IDLE = "Idle"
R_NODES_UPGRADING = "NodesUpgrading"
R_HALTED = "FailureBudgetExceeded"
R_WITHIN_BUDGET = "WithinFailureBudget"
R_IN_PLACE = "InPlace"
R_NOT_IN_PLACE = "NotInPlace"
R_MAX_UNAVAILABLE_ZERO = "MaxUnavailableZero"
R_INVALID_MAX_UNAVAILABLE = "InvalidMaxUnavailable"
R_INVALID_VERSION = "InvalidVersion"
R_DEADLINE = "ProgressDeadlineExceeded"
R_NODE_FAILED = "NodeFailed"
R_SIGNALLED = "Signalled"
R_NOT_SIGNALLED = "NotSignalled"
# Not signalled: its node is available, and taking it down now would exceed the owner's
# budget (peers went unavailable since the NodePlan was created). No deadline runs.
R_WAITING_FOR_BUDGET = "WaitingForBudget"
R_COMPLETED = "Completed"
R_IN_PROGRESS = "InProgress"
R_WRITTEN = "WrittenByK0sFleet"
R_CHANGED_BY_OTHER = "VersionChangedByOther"
R_NO_OTHER_DRIVER = "NoOtherDriver"
R_CAPI_ROLLOUT = "MachineDeploymentRollout"
R_K0SMOTRON = "K0smotronUnpaused"
R_PAUSE_REMOVED = "PauseRemoved"
R_OTHER_EXTENSION = "InPlaceUpdateByOtherExtension"
R_AUTOPILOT_PLAN = "AutopilotPlan"
R_CLUSTER_UNREACHABLE = "ClusterUnreachable"  # its workload API server does not answer

# On a MachineDeployment's K0sFleetUpToDate (docs/capi.md, observed): CAPI v1.14 marks a
# Machine UpToDate only when the kubelet's version string equals spec.version exactly.
CAPI_UP_TO_DATE_NOTE = ("as the nodes report; Cluster API v1.14 will not mark these Machines "
                        "UpToDate: a k0s kubelet reports {kubelet} for a Machine at {target}")
