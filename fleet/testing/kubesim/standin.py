"""A stand-in for the node agents of kubesim's Nodes, so a rollout over 10 000 nodes
needs no 10 000 agent processes. Test/benchmark-only; the real agent is tested on its
own (tests/integration/test_agent_*.py).

It reacts to every Node write carrying a k0s-fleet request (read with
:func:`fleet.contract.signal.parse_signal`) and walks the protocol's states to Completed as the
agent does (the patches are :func:`fleet.testing.responder.step_patch`'s, the shared
scripted responder's): cordon, NotReady while restarting, Ready again with the new
``kubeletVersion`` and the running version reported, uncordon. Each step waits
``step_seconds`` and is written into the cluster's store with the object's
resourceVersion as precondition, like an API write (its writes are not counted as API
requests: the stand-in lives inside the server).

It records, per cluster, when each request was first seen and when each node reported
Completed (wall clock), for "a node's completion to the next node's request".
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fleet.contract.signal import (
    HAPPY_PATH,
    SIGNAL_DATA_KEY,
    InvalidSignalError,
    SignalData,
    SignalState,
    parse_signal,
)
from fleet.testing.kubesim.patches import MERGE
from fleet.testing.kubesim.store import KINDS, ApiError, Change, ClusterStore
from fleet.testing.responder import step_patch
from fleet.world.reported import kubelet_version

log = logging.getLogger(__name__)

NODES = KINDS[("", "v1", "nodes")]
_MARK = SIGNAL_DATA_KEY.encode()


@dataclass
class NodeAgentStandIn:
    step_seconds: float = 0.0
    # (cluster, node, planId) -> wall time the request was first seen
    seen: dict[tuple[str, str, str], float] = field(default_factory=dict)
    # (cluster, node, planId) -> wall time Completed was written
    completed: dict[tuple[str, str, str], float] = field(default_factory=dict)
    # (cluster, node) -> every distinct request written to it (planId, created, command id)
    signals: dict[tuple[str, str], set[tuple[str, datetime, int]]] = field(default_factory=dict)
    failures: int = 0
    _busy: dict[tuple[str, str], tuple[str, datetime, int]] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def on_change(self, cluster: str, store: ClusterStore, change: Change) -> None:
        obj = change.obj
        if obj.kind is not NODES or change.type == "DELETED" or _MARK not in obj.raw:
            return
        try:
            sig = parse_signal((obj.decode().get("metadata") or {}).get("annotations"))
        except InvalidSignalError:
            return
        if sig is None or (sig.status is not None and sig.status.status.terminal):
            return
        key = (sig.planId, sig.created, sig.command.id)
        self.signals.setdefault((cluster, obj.name), set()).add(key)
        if self._busy.get((cluster, obj.name)) == key:
            return
        self.seen.setdefault((cluster, obj.name, sig.planId), time.time())
        self._busy[(cluster, obj.name)] = key
        task = asyncio.get_running_loop().create_task(self._walk(cluster, store, obj.name, sig))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _walk(self, cluster: str, store: ClusterStore, name: str, sig: SignalData) -> None:
        key = (sig.planId, sig.created, sig.command.id)
        state = sig.status.status if sig.status else None
        order = list(HAPPY_PATH)
        try:
            for nxt in order[0 if state is None else order.index(state) + 1:]:
                await asyncio.sleep(self.step_seconds)
                if self._busy.get((cluster, name)) != key or not self._step(store, name, sig,
                                                                              nxt):
                    return
                if nxt is SignalState.COMPLETED:
                    self.completed[(cluster, name, sig.planId)] = time.time()
        except ApiError as e:
            self.failures += 1
            log.warning("stand-in %s/%s: %s", cluster, name, e.message)
        finally:
            if self._busy.get((cluster, name)) == key:
                self._busy.pop((cluster, name), None)

    @staticmethod
    def _step(store: ClusterStore, name: str, sig: SignalData, state: SignalState) -> bool:
        node = store.get(NODES, "", name)
        patch: dict[str, Any] | None = step_patch(node.decode(), sig, state)
        if patch is None:
            return False
        patch["metadata"]["resourceVersion"] = str(node.rv)
        node = store.patch(NODES, "", name, content_type=MERGE, patch=patch)
        if state in (SignalState.RESTARTING, SignalState.VERIFYING):
            ready = state is SignalState.VERIFYING
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            status: dict[str, Any] = {"conditions": [{
                "type": "Ready", "status": "True" if ready else "False",
                "reason": "KubeletReady" if ready else "KubeletNotReady",
                "message": "kubesim stand-in", "lastHeartbeatTime": now,
                "lastTransitionTime": now}]}
            if ready:
                kubelet = kubelet_version(sig.command.k0supdate.version)
                status["nodeInfo"] = {"kubeletVersion": kubelet, "kubeProxyVersion": kubelet}
            store.patch(NODES, "", name, content_type="application/strategic-merge-patch+json",
                        patch={"metadata": {"resourceVersion": str(node.rv)}, "status": status},
                        subresource="status")
        return True

    def report(self) -> dict[str, Any]:
        return {"seen": [[*k, t] for k, t in self.seen.items()],
                "completed": [[*k, t] for k, t in self.completed.items()],
                "failures": self.failures, "busy": len(self._busy),
                "signals": len(self.signals),
                "multi_signal": [[c, n, len(keys)] for (c, n), keys in self.signals.items()
                                 if len(keys) > 1]}
