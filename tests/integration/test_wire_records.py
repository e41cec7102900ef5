"""On the real kube-apiserver, over both transports: a Reflector that decodes Nodes
straight into the records' subset (fleet.kube.wire + fleet.world.records.node_subset), paged
list and watch alike, feeds a RecordCache the same records (uid and resourceVersion
included) as one that decodes every Node whole."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

from fleet.contract.signal import SIGNAL_VERSION_KEY
from fleet.kube import KubeClient
from fleet.kube.cache import RecordCache
from fleet.kube.resources import NODES
from fleet.kube.transport import TRANSPORTS, TransportName
from fleet.kube.watch import Reflector
from fleet.testing.kubesim.nodes import realistic_node
from fleet.testing.world import World
from fleet.world.clusters import node_cache
from fleet.world.records import NodeRecord, node_subset
from tests.helpers.names import unique

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


def _all(cache: RecordCache[NodeRecord]) -> dict[str, tuple[NodeRecord, str, str]]:
    return {r.name: (r, r.uid, r.resource_version) for r in cache.items()}


class Changes:
    """Wakes a waiter whenever a cache it is given to changes (its ``on_change``)."""

    def __init__(self) -> None:
        self.event = anyio.Event()

    def poke(self) -> None:
        self.event.set()

    async def until(self, cond: Callable[[], bool], what: str) -> None:
        with anyio.fail_after(30):
            while not cond():
                await self.event.wait()
                self.event = anyio.Event()
        assert cond(), what


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_subset_decoding_feeds_the_same_records(crds_installed: World,
                                                      transport: TransportName) -> None:
    server = crds_installed["wl1"]
    group = unique("wire")
    names = [unique(f"{group}-n{i}") for i in range(3)]
    async with await KubeClient.from_kubeconfig(server.kubeconfig(), name="wl1",
                                                transport=transport) as kube:
        for i, name in enumerate(names):
            node = realistic_node(name, "v1.31.2+k0s.0", index=i)
            node["metadata"]["labels"]["test.k0s-fleet.io/group"] = group
            status = node.pop("status")
            await kube.create(NODES, node)
            await kube.patch(NODES, name, {"status": status}, subresource="status")
        changes = Changes()
        fast, whole = node_cache(changes.poke), node_cache(changes.poke)
        selector = f"test.k0s-fleet.io/group={group}"
        reflectors = [
            Reflector(kube, NODES, label_selector=selector, listener=fast.on_event,
                      keep_objects=False, page_size=1, decoder=node_subset),
            Reflector(kube, NODES, label_selector=selector, listener=whole.on_event,
                      keep_objects=False, page_size=1)]
        try:
            async with anyio.create_task_group() as tg:
                for r in reflectors:
                    tg.start_soon(r.run)
                for r in reflectors:
                    with anyio.fail_after(30):
                        await r.synced.wait()
                assert len(_all(fast)) == 3
                assert _all(fast) == _all(whole)
                # churn that changes no record, then changes that do
                for k in range(5):
                    await kube.patch(NODES, names[0], {"metadata": {"annotations": {
                        "example.com/churn": str(k)}}})
                await kube.patch(NODES, names[1], {"metadata": {"annotations": {
                    SIGNAL_VERSION_KEY: "v2"}}, "spec": {"unschedulable": True}})
                await kube.patch(NODES, names[2], {"status": {"conditions": [
                    {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                     "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                     "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}, subresource="status")
                last = await kube.patch(NODES, names[0], {"metadata": {"annotations": {
                    "example.com/churn": "done"}}})
                await kube.delete(NODES, names[2])
                rv = last["metadata"]["resourceVersion"]

                def caught_up() -> bool:
                    return all(
                        c.get(names[0]) is not None
                        and c.get(names[0]).resource_version == rv  # type: ignore[union-attr]
                        and c.get(names[2]) is None for c in (fast, whole))

                await changes.until(caught_up, "both caches saw every change")
                assert _all(fast) == _all(whole)
                rec = fast.get(names[1])
                assert rec is not None and rec.info.unschedulable
                assert rec.annotation(SIGNAL_VERSION_KEY) == "v2"
                tg.cancel_scope.cancel()
        finally:
            for name in names[:2]:
                await kube.delete(NODES, name)
