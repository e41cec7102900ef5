"""Who carries out a node's upgrade, and how a request to it is written, read back and
judged complete (docs/agent.md "Protocol"; docs/controller.md "One node's upgrade: the
NodePlan"). Pure.

- ``agent``: the k0s-fleet agent, through the fleet's own signal annotation; its
  requests carry the fleet's node policy; done when the node reports the version.
- ``autopilot``: stock k0s autopilot on the node, through autopilot's own signal
  annotation; that key is shared with k0s's own autopilot controller, so a live request
  there that is not one of ours is never overwritten; done when the node reports the
  version, or (stock nodes carry no k0s-fleet annotation) when the kubelet runs its
  Kubernetes release.

The planner and the dispatcher ask :func:`executor` instead of branching on its name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from fleet.contract.signal import (
    AUTOPILOT_SIGNAL_DATA_KEY,
    AUTOPILOT_SIGNAL_VERSION_KEY,
    SIGNAL_DATA_KEY,
    SIGNAL_VERSION_KEY,
    AutopilotSignal,
    InvalidSignalError,
    K0sUpdateCommand,
    NodePolicy,
    SignalCommand,
    SignalData,
    SignalState,
    parse_autopilot_signal,
    parse_signal,
)
from fleet.contract.versions import kubernetes_release, same_version
from fleet.world.model import (
    EXECUTOR_AGENT,
    EXECUTOR_AUTOPILOT,
    NodeInfo,
    NodePlanInfo,
    format_time,
    parse_time,
)


@dataclass(frozen=True, slots=True)
class CarriedRequest:
    """A request as a node carries it, whatever the executor's encoding."""

    plan_id: str
    created: datetime | None
    command_id: int
    # None: not answered yet (or nothing the executor reports that we know).
    state: SignalState | None
    reason: str = ""
    # when the node entered ``state``, by the node's own clock (None: not said)
    at: datetime | None = None
    # what the node's drain did with each pod ("<ns>/<pod>: <outcome>"), where it says
    drain: tuple[str, ...] = ()

    @property
    def terminal(self) -> bool:
        return self.state is not None and self.state.terminal

    def is_request(self, plan_id: str, created: datetime | None, command_id: int) -> bool:
        """Exactly this request: same plan, same start, same attempt."""
        return (self.plan_id, self.created, self.command_id) == (plan_id, created, command_id)


@dataclass(frozen=True, slots=True)
class Request:
    """What a node is asked to do (one attempt of one NodePlan)."""

    plan_id: str
    created: datetime
    attempt: int
    version: str
    url: str
    sha256: str
    allow_unverified: bool
    force: bool
    traceparent: str = ""
    policy: NodePolicy | None = None


def request_for(p: NodePlanInfo, *, created: datetime, attempt: int,
                traceparent: str) -> Request:
    """The request that carries out NodePlan ``p`` (its node policy only where the
    executor takes one)."""
    return Request(
        plan_id=p.plan_id, created=created, attempt=attempt, version=p.version, url=p.url,
        sha256=p.sha256, allow_unverified=p.allow_unverified, force=p.force,
        traceparent=traceparent,
        policy=p.node_policy if executor(p.executor).carries_policy else None)


class Executor(Protocol):
    name: str
    # The annotations a request is written under (value, and protocol version).
    data_key: str
    version_key: str
    # Whether requests carry the fleet's node policy.
    carries_policy: bool
    # Whether others (not k0s-fleet) write requests under the same key.
    shared_key: bool

    def carried(self, node: NodeInfo) -> CarriedRequest | None:
        """The request the node carries for this executor, as parsed into the snapshot."""
        ...

    def read(self, annotations: Mapping[str, str]) -> CarriedRequest | None:
        """The same from raw annotations (the dispatcher's freshest object)."""
        ...

    def plan_id_in(self, annotations: Mapping[str, str]) -> str | None:
        """Whose request the annotations carry, even when it is otherwise unreadable."""
        ...

    def encode(self, request: Request) -> str:
        """The annotation value asking for ``request``."""
        ...

    def runs(self, node: NodeInfo, version: str) -> bool:
        """The node runs ``version``: the request is done as far as the version goes."""
        ...


def _from_agent(sig: SignalData | None) -> CarriedRequest | None:
    if sig is None:
        return None
    return CarriedRequest(
        plan_id=sig.planId, created=sig.created, command_id=sig.command.id,
        state=sig.status.status if sig.status is not None else None,
        reason=sig.status.reason if sig.status is not None else "",
        at=sig.status.timestamp if sig.status is not None else None,
        drain=(sig.status.drain or ()) if sig.status is not None else ())


def _from_autopilot(ap: AutopilotSignal | None) -> CarriedRequest | None:
    if ap is None:
        return None
    state, reason = ap.state, ""
    if state is None and ap.raw_state:
        # An autopilot state we do not know: a failure if it says so, else progress.
        state = (SignalState.INVALID_REQUEST if ap.raw_state.startswith("Failed")
                 else SignalState.DOWNLOADING)
        reason = f"autopilot: {ap.raw_state}"
    return CarriedRequest(plan_id=ap.plan_id, created=parse_time(ap.created),
                          command_id=ap.command_id, state=state, reason=reason,
                          at=parse_time(ap.at) if ap.at else None)


class AgentExecutor:
    name = EXECUTOR_AGENT
    data_key = SIGNAL_DATA_KEY
    version_key = SIGNAL_VERSION_KEY
    carries_policy = True
    shared_key = False

    def carried(self, node: NodeInfo) -> CarriedRequest | None:
        return _from_agent(node.signal)

    def read(self, annotations: Mapping[str, str]) -> CarriedRequest | None:
        try:
            return _from_agent(parse_signal(dict(annotations)))
        except InvalidSignalError:
            return None

    def plan_id_in(self, annotations: Mapping[str, str]) -> str | None:
        raw = annotations.get(self.data_key)
        try:
            plan_id = json.loads(raw).get("planId") if raw else None
        except (ValueError, AttributeError):
            return None
        return plan_id if isinstance(plan_id, str) else None

    def encode(self, request: Request) -> str:
        return SignalData(
            planId=request.plan_id, created=request.created,
            traceparent=request.traceparent or None,
            command=SignalCommand(id=request.attempt, k0supdate=K0sUpdateCommand(
                url=request.url, version=request.version, sha256=request.sha256 or None,
                forceupdate=request.force, allowunverified=request.allow_unverified,
                policy=request.policy))).to_json()

    def runs(self, node: NodeInfo, version: str) -> bool:
        return same_version(node.running_version, version)


def kubelet_runs(node: NodeInfo, version: str) -> bool:
    """Stock k0s nodes (executor autopilot) carry no k0s-fleet annotation: the kubelet's
    version (v1.31.3+k0s) tells the Kubernetes release; a pure controller has none, and
    autopilot's own Completed has to do."""
    if node.kubelet_version is None:
        return True
    release = kubernetes_release(node.kubelet_version)
    return release is not None and release == kubernetes_release(version)


class AutopilotExecutor:
    name = EXECUTOR_AUTOPILOT
    data_key = AUTOPILOT_SIGNAL_DATA_KEY
    version_key = AUTOPILOT_SIGNAL_VERSION_KEY
    carries_policy = False
    shared_key = True

    def carried(self, node: NodeInfo) -> CarriedRequest | None:
        return _from_autopilot(node.autopilot_signal)

    def read(self, annotations: Mapping[str, str]) -> CarriedRequest | None:
        return _from_autopilot(parse_autopilot_signal(annotations.get(self.data_key)))

    def plan_id_in(self, annotations: Mapping[str, str]) -> str | None:
        ap = parse_autopilot_signal(annotations.get(self.data_key))
        return ap.plan_id if ap is not None else None

    def encode(self, request: Request) -> str:
        return json.dumps({
            "planId": request.plan_id, "created": format_time(request.created),
            "command": {"id": request.attempt, "k0supdate": {
                "url": request.url, "version": request.version, "sha256": request.sha256,
                "forceupdate": request.force}}}, separators=(",", ":"))

    def runs(self, node: NodeInfo, version: str) -> bool:
        return same_version(node.running_version, version) or kubelet_runs(node, version)


AGENT = AgentExecutor()
AUTOPILOT = AutopilotExecutor()
EXECUTORS: Mapping[str, Executor] = {AGENT.name: AGENT, AUTOPILOT.name: AUTOPILOT}


def executor(name: str) -> Executor:
    """The executor called ``name``; anything else is the agent (the CRD allows only
    these two)."""
    return EXECUTORS.get(name, AGENT)
