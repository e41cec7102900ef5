"""A scripted stand-in for the node agents of one workload cluster.

It watches the cluster's Nodes and answers every k0s-fleet request the way the agent's
protocol does (Downloading -> Cordoning -> ApplyingUpdate -> Restarting -> Verifying ->
UnCordoning -> Completed, cordoning, NotReady while restarting, reporting the running
version), with a fixed time per step, so that controller tests and benchmarks control
the node side exactly: a node can be told to stay silent or to fail at a given state.
The real agent is tested on its own (tests/integration/test_agent_*.py). Test-only.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc

from fleet.contract.signal import (
    AUTOPILOT_SIGNAL_DATA_KEY,
    CORDONED_BY_KEY,
    HAPPY_PATH,
    RUNNING_VERSION_KEY,
    SIGNAL_DATA_KEY,
    InvalidSignalError,
    SignalData,
    SignalState,
    SignalStatus,
    parse_signal,
)
from fleet.kube import KubeClient, KubeError, KubeObject, patch_with_retry
from fleet.kube.resources import NODES, Resource
from fleet.kube.watch import Reflector, WatchEvent
from fleet.testing.capi import set_node_ready

log = logging.getLogger(__name__)

RESPONDER = "test-responder"


@dataclass(frozen=True)
class Behaviour:
    """How one node answers: ``silent`` never answers; ``fail_at`` fails on entering that
    state (with ``SignalState.FAILED_*`` named by ``failure``); ``stall_at`` stops there."""

    silent: bool = False
    fail_at: SignalState | None = None
    failure: SignalState = SignalState.FAILED_DOWNLOAD
    stall_at: SignalState | None = None


@dataclass(frozen=True)
class Step:
    node: str
    plan_id: str
    state: str
    at: float  # time.monotonic()


def step_patch(node: KubeObject, sig: SignalData, state: SignalState,
               reason: str = "") -> dict[str, object] | None:
    """The merge patch (without resourceVersion) by which a node answers ``sig`` with
    ``state``, as the agent's protocol does: the status in the signal, cordoning and
    uncordoning what it cordoned, the running version once verifying. None when the
    node no longer carries that request (replaced or withdrawn)."""
    ann = (node.get("metadata") or {}).get("annotations") or {}
    try:
        cur = parse_signal(ann)
    except InvalidSignalError:
        return None
    if cur is None or not cur.same_request(sig) or cur.command.id != sig.command.id:
        return None
    data = cur.with_status(SignalStatus(status=state, timestamp=datetime.now(UTC),
                                        reason=reason))
    patch: dict[str, object] = {}
    annotations: dict[str, str | None] = {SIGNAL_DATA_KEY: data.to_json()}
    if state == SignalState.CORDONING and not (node.get("spec") or {}).get("unschedulable"):
        patch["spec"] = {"unschedulable": True}
        annotations[CORDONED_BY_KEY] = RESPONDER
    if state == SignalState.VERIFYING:
        annotations[RUNNING_VERSION_KEY] = sig.command.k0supdate.version
    if (state == SignalState.UNCORDONING or state.failed) and CORDONED_BY_KEY in ann:
        patch["spec"] = {"unschedulable": None}
        annotations[CORDONED_BY_KEY] = None
    patch["metadata"] = {"annotations": annotations}
    return patch


@dataclass
class NodeResponder:
    client: KubeClient
    step_seconds: float = 0.0
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    only: Callable[[str], bool] = field(default=lambda _n: True)
    steps: list[Step] = field(default_factory=list)
    requests: dict[str, list[tuple[str, datetime, int]]] = field(default_factory=dict)
    # when each request was first seen: (node, planId) -> time.monotonic()
    seen_at: dict[tuple[str, str], float] = field(default_factory=dict)
    _busy: dict[str, tuple[str, datetime, int]] = field(default_factory=dict)
    _tg: anyio.abc.TaskGroup | None = None
    resource: Resource = NODES  # CONTROL_NODES: pure k0s controllers (no Node, no Ready)

    def behave(self, node: str, behaviour: Behaviour) -> None:
        self.behaviours[node] = behaviour

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        reflector = Reflector(self.client, self.resource, listener=self._on_event,
                              watch_timeout=60)
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(reflector.run)
            await reflector.synced.wait()
            task_status.started()

    async def _on_event(self, event: WatchEvent) -> None:
        if event.type == "DELETED" or self._tg is None:
            return
        node = event.object
        name = node["metadata"]["name"]
        if not self.only(name):
            return
        try:
            sig = parse_signal((node.get("metadata") or {}).get("annotations"))
        except InvalidSignalError:
            return
        if sig is None or (sig.status is not None and sig.status.status.terminal):
            return
        key = (sig.planId, sig.created, sig.command.id)
        if self._busy.get(name) == key:
            return
        if key not in self.requests.setdefault(name, []):
            self.requests[name].append(key)
            self.seen_at.setdefault((name, sig.planId), time.monotonic())
        self._busy[name] = key
        self._tg.start_soon(self._walk, name, sig)

    async def _walk(self, name: str, sig: SignalData) -> None:
        behaviour = self.behaviours.get(name, Behaviour())
        key = (sig.planId, sig.created, sig.command.id)
        try:
            if behaviour.silent:
                return
            state = sig.status.status if sig.status else None
            order = list(HAPPY_PATH)
            start = 0 if state is None else order.index(state) + 1
            for nxt in order[start:]:
                await anyio.sleep(self.step_seconds)
                if self._busy.get(name) != key:
                    return  # replaced or withdrawn
                if behaviour.stall_at == nxt:
                    return
                if behaviour.fail_at == nxt:
                    await self._write(name, sig, behaviour.failure, "scripted failure")
                    return
                if not await self._write(name, sig, nxt, ""):
                    return
        except KubeError as e:
            log.warning("responder %s: %s", name, e)
        finally:
            if self._busy.get(name) == key:
                self._busy.pop(name, None)

    async def _write(self, name: str, sig: SignalData, state: SignalState, reason: str) -> bool:
        if self.resource is NODES and state == SignalState.RESTARTING:
            await set_node_ready(self.client, name, False)
        elif self.resource is NODES and state == SignalState.VERIFYING:
            await set_node_ready(self.client, name, True)

        def mutate(node: KubeObject) -> dict[str, object] | None:
            return step_patch(node, sig, state, reason)

        result = await patch_with_retry(self.client, self.resource, name, mutate)
        if result is None:
            return False
        self.steps.append(Step(name, sig.planId, state.value, time.monotonic()))
        return True


AUTOPILOT_PATH = ("Downloading", "Cordoning", "ApplyingUpdate", "Restart", "UnCordoning",
                  "Completed")


@dataclass
class AutopilotResponder:
    """Stock k0s autopilot's node side (its ``k0sproject.io/autopilot-signal-*`` keys),
    for the ``autopilot`` executor: walks the autopilot signal's states, cordons, goes
    NotReady on Restart and comes back with the new kubelet version. Test-only."""

    client: KubeClient
    step_seconds: float = 0.0
    only: Callable[[str], bool] = field(default=lambda _n: True)
    steps: list[Step] = field(default_factory=list)
    _busy: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    _tg: anyio.abc.TaskGroup | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        reflector = Reflector(self.client, NODES, listener=self._on_event, watch_timeout=60)
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(reflector.run)
            await reflector.synced.wait()
            task_status.started()

    @staticmethod
    def _signal(node: KubeObject) -> dict[str, Any] | None:
        raw = ((node.get("metadata") or {}).get("annotations") or {}).get(
            AUTOPILOT_SIGNAL_DATA_KEY)
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            return None
        return data if isinstance(data, dict) else None

    async def _on_event(self, event: WatchEvent) -> None:
        if event.type == "DELETED" or self._tg is None:
            return
        name = event.object["metadata"]["name"]
        data = self._signal(event.object)
        if not self.only(name) or data is None:
            return
        state = (data.get("status") or {}).get("status")
        if state == "Completed" or str(state).startswith("Failed"):
            return
        key = (str(data.get("planId")), str(data.get("created")),
               int((data.get("command") or {}).get("id") or 0))
        if self._busy.get(name) == key:
            return
        self._busy[name] = key
        self._tg.start_soon(self._walk, name, key, data)

    async def _walk(self, name: str, key: tuple[str, str, int], data: dict[str, Any]) -> None:
        version = str(((data.get("command") or {}).get("k0supdate") or {}).get("version"))
        state = (data.get("status") or {}).get("status")
        start = AUTOPILOT_PATH.index(state) + 1 if state in AUTOPILOT_PATH else 0
        try:
            for nxt in AUTOPILOT_PATH[start:]:
                await anyio.sleep(self.step_seconds)
                if self._busy.get(name) != key:
                    return
                if nxt == "Restart":
                    await set_node_ready(self.client, name, False)
                if nxt == "UnCordoning":
                    kubelet = version.split("+", maxsplit=1)[0] + "+k0s"
                    await self.client.patch(NODES, name, {"status": {"nodeInfo": {
                        "kubeletVersion": kubelet}}}, subresource="status")
                    await set_node_ready(self.client, name, True)

                def mutate(node: KubeObject, nxt: str = nxt) -> dict[str, Any] | None:
                    cur = self._signal(node)
                    if cur is None or (str(cur.get("planId")), str(cur.get("created")),
                                       int((cur.get("command") or {}).get("id") or 0)) != key:
                        return None
                    cur["status"] = {"status": nxt,
                                     "timestamp": datetime.now(UTC).isoformat()}
                    patch: dict[str, Any] = {"metadata": {"annotations": {
                        AUTOPILOT_SIGNAL_DATA_KEY: json.dumps(cur)}}}
                    if nxt == "Cordoning":
                        patch["spec"] = {"unschedulable": True}
                    elif nxt == "UnCordoning":
                        patch["spec"] = {"unschedulable": None}
                    return patch

                if await patch_with_retry(self.client, NODES, name, mutate) is None:
                    return
                self.steps.append(Step(name, key[0], nxt, time.monotonic()))
        except KubeError as e:
            log.warning("autopilot responder %s: %s", name, e)
        finally:
            if self._busy.get(name) == key:
                self._busy.pop(name, None)
