"""Where is this Machine's in-place update? Pure answer for the UpdateMachine hook.

Input: the NodePlan (as stored; its status is mirrored from the node by the
controller's NodePlan reconciler) and, when the workload cluster could be asked, what
its Node says. Output: the UpdateMachine response.

- Success + retryAfterSeconds > 0: still going; the delay follows the node's phase,
  long while the binary downloads, short around the restart where every second of
  delay is a second of the Machine counted unavailable.
- Success + 0: the NodePlan is Completed *and* the Node runs the target version and
  is Ready (without a workload view, the NodePlan's own runningVersion is trusted).
- Failure: the NodePlan failed; the message carries its reason. CAPI retries failed
  calls with backoff, so the answer stays Failure until someone acts (deleting the
  failed NodePlan makes the next call start a fresh one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleet.contract.nodeplan import NodePlanPhase
from fleet.contract.signal import FAILED_STATES, RUNNING_VERSION_KEY, SignalState
from fleet.contract.versions import same_version
from fleet.extension.wire import ResponseStatus, UpdateMachineResponse

# Seconds until CAPI should ask again, by the phase the node is in.
RETRY_AFTER_SECONDS: Mapping[str, int] = {
    NodePlanPhase.PENDING: 2,              # dispatch is one write away
    SignalState.DOWNLOADING: 10,           # a ~100-250 MB binary
    SignalState.CORDONING: 5,              # draining: bounded by PDBs and grace periods
    SignalState.APPLYING_UPDATE: 2,        # a rename
    SignalState.RESTARTING: 3,             # k0s coming back up
    SignalState.VERIFYING: 3,
    SignalState.UNCORDONING: 2,
    SignalState.COMPLETED: 2,              # waiting for the Node to show version + Ready
}
DEFAULT_RETRY_SECONDS = 5          # a phase we do not know (newer controller, say)
UNOBSERVABLE_RETRY_SECONDS = 10    # the workload cluster did not answer


@dataclass(frozen=True, slots=True)
class NodeObservation:
    """What the workload cluster says about the Machine's Node (or why it could not)."""

    name: str
    found: bool = True
    ready: bool = False
    running_version: str | None = None
    architecture: str | None = None
    error: str | None = None

    @classmethod
    def unobservable(cls, name: str, error: str) -> NodeObservation:
        return cls(name=name, found=False, error=error)

    @classmethod
    def missing(cls, name: str) -> NodeObservation:
        return cls(name=name, found=False)

    def runs(self, version: str) -> bool:
        return self.found and self.ready and same_version(self.running_version, version)

    def describe(self) -> str:
        if self.error:
            return f"node {self.name} cannot be observed: {self.error}"
        if not self.found:
            return f"node {self.name} not found in the workload cluster"
        ready = "Ready" if self.ready else "NotReady"
        return f"node {self.name} runs {self.running_version or 'an unreported version'}, {ready}"


def observe_node(name: str, node: Mapping[str, Any] | None) -> NodeObservation:
    """A NodeObservation from a Node object (None: not found)."""
    if node is None:
        return NodeObservation.missing(name)
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    ready = any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    labels = meta.get("labels") or {}
    arch = (status.get("nodeInfo") or {}).get("architecture") or labels.get("kubernetes.io/arch")
    return NodeObservation(
        name=name, found=True, ready=ready,
        running_version=(meta.get("annotations") or {}).get(RUNNING_VERSION_KEY),
        architecture=arch or None,
    )


def _plan_ref(plan: Mapping[str, Any]) -> str:
    meta = plan.get("metadata") or {}
    return f"NodePlan {meta.get('namespace', '')}/{meta.get('name', '')}"


def failure_reason(plan: Mapping[str, Any]) -> str | None:
    """Why the NodePlan failed, or None when it did not."""
    status = plan.get("status") or {}
    phase = str(status.get("phase") or "")
    node_state = str(status.get("nodeState") or "")
    failed_states = {str(s) for s in FAILED_STATES}
    if phase != NodePlanPhase.FAILED and phase not in failed_states \
            and node_state not in failed_states:
        return None
    reason = next((str(c.get("reason") or "") for c in status.get("conditions") or []
                   if isinstance(c, Mapping) and c.get("type") == "Failed"
                   and c.get("status") == "True"), "")
    reason = reason or (node_state if node_state in failed_states else "") or \
        (phase if phase in failed_states else "")
    message = str(status.get("message") or "")
    parts = [p for p in (reason, message) if p]
    return ": ".join(parts) if parts else "failed without a reason"


def current_phase(plan: Mapping[str, Any]) -> str:
    """The most specific phase: the node's own state while it has one."""
    status = plan.get("status") or {}
    phase = str(status.get("phase") or NodePlanPhase.PENDING)
    node_state = str(status.get("nodeState") or "")
    if phase == NodePlanPhase.COMPLETED:
        return phase
    return node_state or phase


def retry_after(phase: str, table: Mapping[str, int] = RETRY_AFTER_SECONDS) -> int:
    return max(1, int(table.get(phase, DEFAULT_RETRY_SECONDS)))


def update_progress(plan: Mapping[str, Any], node: NodeObservation | None, version: str, *,
                    table: Mapping[str, int] = RETRY_AFTER_SECONDS) -> UpdateMachineResponse:
    """The UpdateMachine answer for an existing NodePlan."""
    ref = _plan_ref(plan)
    if (plan.get("metadata") or {}).get("deletionTimestamp"):
        # Someone deleted it (the documented way to retry a failed plan); a fresh one is
        # created once it is gone.
        return UpdateMachineResponse(
            status=ResponseStatus.SUCCESS,
            retry_after_seconds=retry_after(NodePlanPhase.PENDING, table),
            message=f"{ref} is being deleted; dispatching again once it is gone")
    reason = failure_reason(plan)
    if reason is not None:
        return UpdateMachineResponse(status=ResponseStatus.FAILURE,
                                     message=f"{ref} failed: {reason}")
    phase = current_phase(plan)
    if phase == NodePlanPhase.COMPLETED:
        if node is None:
            running = str((plan.get("status") or {}).get("runningVersion") or "")
            if not running or same_version(running, version):
                return UpdateMachineResponse(
                    status=ResponseStatus.SUCCESS,
                    message=f"{ref} completed: k0s {version}")
            return UpdateMachineResponse(
                status=ResponseStatus.SUCCESS, retry_after_seconds=retry_after(phase, table),
                message=f"{ref} completed but reports k0s {running}, not {version}")
        if node.runs(version):
            return UpdateMachineResponse(
                status=ResponseStatus.SUCCESS,
                message=f"{ref} completed: node {node.name} runs k0s {version} and is Ready")
        delay = UNOBSERVABLE_RETRY_SECONDS if node.error else retry_after(phase, table)
        return UpdateMachineResponse(
            status=ResponseStatus.SUCCESS, retry_after_seconds=delay,
            message=f"{ref} completed; waiting: {node.describe()}")
    where = f"node {node.name}" if node is not None else "node"
    return UpdateMachineResponse(
        status=ResponseStatus.SUCCESS, retry_after_seconds=retry_after(phase, table),
        message=f"{ref}: {where} {phase} (k0s {version})")
