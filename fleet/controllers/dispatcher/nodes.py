"""A node's side of an upgrade, on its workload cluster: the upgrade request written to its
Node (or, for a pure controller, its ControlNode) and cleared, and a cordon of ours
lifted once its request is withdrawn.
"""

from __future__ import annotations

import logging
from typing import Any

from fleet.contract.nodeplan import NodePlanPhase
from fleet.contract.signal import CORDONED_BY_KEY, SIGNAL_VERSION, parse_signal
from fleet.controllers.dispatcher.core import DispatcherCore
from fleet.kube import KubeClient, KubeObject, NotFoundError
from fleet.kube.cache import RecordCache
from fleet.kube.resources import CLUSTERS, CONTROL_NODES, NODE_PLANS, NODES, Resource
from fleet.planner.actions import ClearSignal, SignalNode, UncordonNode
from fleet.world.executors import executor
from fleet.world.model import KIND_CONTROL_NODE, ClusterKey, ObjectRef
from fleet.world.records import NodeRecord

log = logging.getLogger(__name__)


class NodeSignals(DispatcherCore):
    def _signal_object(self, cluster: ClusterKey, node_kind: str
                       ) -> tuple[KubeClient, Resource, RecordCache[NodeRecord]] | None:
        """Where a node's signal lives: its workload cluster's client, the resource (Node,
        or ControlNode for a pure controller) and that cluster's cache of it."""
        wc = self.registry.get(cluster)
        if wc is None or wc.client is None:
            return None
        if node_kind == KIND_CONTROL_NODE:
            return wc.client, CONTROL_NODES, wc.control_nodes
        return wc.client, NODES, wc.nodes

    async def _do_SignalNode(self, a: SignalNode) -> None:
        target = self._signal_object(a.cluster, a.node_kind)
        if target is None:
            return
        client, res, cache = target
        ex = executor(a.executor)
        req = a.request
        value = ex.encode(req)

        def mutate(node: KubeObject) -> dict[str, Any] | None:
            ann = (node.get("metadata") or {}).get("annotations") or {}
            cur = ex.read(ann)
            if cur is not None and cur.is_request(req.plan_id, req.created, req.attempt):
                return None  # carries this very request already
            if cur is not None and cur.plan_id != req.plan_id and not cur.terminal and (
                    ex.shared_key or self._plan_alive(cur.plan_id)):
                return None  # another live request: the planner waits for it
            return {"metadata": {"annotations": {ex.version_key: SIGNAL_VERSION,
                                                 ex.data_key: value}}}

        await self._patch(client, res, a.node, None, mutate, cache=cache)

    def _plan_alive(self, plan_id: str) -> bool:
        ns, _, name = plan_id.partition("/")
        obj = self.view[NODE_PLANS].get(name, ns)
        if obj is None:
            return False
        phase = (obj.get("status") or {}).get("phase")
        return phase not in (NodePlanPhase.COMPLETED, NodePlanPhase.FAILED)

    # -- nodes -----------------------------------------------------------------------------
    async def _do_ClearSignal(self, a: ClearSignal) -> None:
        target = self._signal_object(a.cluster, a.node_kind)
        if target is None:
            return
        client, res, cache = target
        ex = executor(a.executor)

        def mutate(node: KubeObject) -> dict[str, Any] | None:
            ann = (node.get("metadata") or {}).get("annotations") or {}
            if ex.plan_id_in(ann) != a.plan_id:
                return None
            return {"metadata": {"annotations": dict.fromkeys((ex.data_key, ex.version_key))}}

        try:
            obj = await self._patch(client, res, a.node, None, mutate, cache=cache)
        except NotFoundError:
            return
        if obj is not None:
            log.info("cleared request %s from %s %s", a.plan_id, a.node_kind, a.node)

    async def _do_UncordonNode(self, a: UncordonNode) -> None:
        wc = self.registry.get(a.cluster)
        if wc is None or wc.client is None:
            return

        def mutate(node: KubeObject) -> dict[str, Any] | None:
            ann = (node.get("metadata") or {}).get("annotations") or {}
            if CORDONED_BY_KEY not in ann:
                return None  # not our cordon: never lift someone else's
            try:
                sig = parse_signal(ann)
            except ValueError:
                sig = None
            if sig is not None and (sig.status is None or not sig.status.status.terminal) \
                    and self._plan_alive(sig.planId):
                return None
            return {"spec": {"unschedulable": None},
                    "metadata": {"annotations": {CORDONED_BY_KEY: None}}}

        try:
            obj = await self._patch(wc.client, NODES, a.node, None, mutate, cache=wc.nodes)
        except NotFoundError:
            return
        if obj is not None:
            cluster = self.view[CLUSTERS].get(a.cluster[1], a.cluster[0])
            await self.event(cluster or ObjectRef("Cluster", *a.cluster), "NodeUncordoned",
                             f"uncordoned node {a.node}: its upgrade request was withdrawn",
                             action="Uncordon")
