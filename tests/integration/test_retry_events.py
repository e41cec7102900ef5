"""A retried NodePlan attempt that fails with the very same text gets its own Event
(issue #12 item 6: Events are deduplicated on content, so each attempt is part of it)."""

from __future__ import annotations

import anyio
import pytest

from fleet.contract.signal import SignalState
from fleet.events import list_events
from fleet.kube import KubeClient
from fleet.kube.resources import MACHINE_DEPLOYMENTS, NODE_PLANS
from fleet.planner import conditions as C
from fleet.testing.capi import annotate, bump, create_cluster, ensure_infra_crd
from fleet.testing.responder import Behaviour, NodeResponder
from fleet.testing.world import World
from fleet.world.model import ANN_RETRY
from tests.helpers.controller import V2, fleet_config, running_controller, wait_condition
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio


async def _failed_events(mgmt: KubeClient, namespace: str) -> list[dict[str, object]]:
    return [e for e in await list_events(mgmt, namespace)
            if e.get("reason") == "NodeUpgradeFailed"]


async def test_each_failed_attempt_is_an_event_even_with_the_same_text(
        mgmt: KubeClient, wl2: KubeClient, crds_installed: World, namespace: str) -> None:
    await ensure_infra_crd(mgmt)
    fc = await create_cluster(mgmt, wl2, crds_installed["wl2"].kubeconfig(),
                              namespace=namespace, name=unique("ev"), control_planes=0,
                              workers=1, max_unavailable=1)
    node = fc.workers[0]
    responder = NodeResponder(wl2, step_seconds=0.02, only=lambda n: n == node,
                              behaviours={node: Behaviour(fail_at=SignalState.DOWNLOADING)})
    async with anyio.create_task_group() as tg:
        await tg.start(responder.run)
        async with running_controller(mgmt, fleet_config(namespace)):
            await bump(mgmt, fc, V2)
            await wait_condition(mgmt, MACHINE_DEPLOYMENTS, fc.md or "", namespace, C.HALTED,
                                 timeout=60)
            [first] = (await mgmt.list(NODE_PLANS, namespace)).items
            message = first["status"]["message"]
            # Retry; the node fails the same way again.
            await annotate(mgmt, MACHINE_DEPLOYMENTS, fc.md or "", namespace, {ANN_RETRY: "1"})
            with anyio.fail_after(60):
                while True:
                    [p] = (await mgmt.list(NODE_PLANS, namespace)).items
                    st = p.get("status") or {}
                    if st.get("attempts") == 2 and st.get("phase") == "Failed":
                        break
                    await anyio.sleep(0.2)
            assert p["status"]["message"] == message  # the very same text
            with anyio.fail_after(30):
                while len(await _failed_events(mgmt, namespace)) < 2:
                    await anyio.sleep(0.2)
        tg.cancel_scope.cancel()
    events = await _failed_events(mgmt, namespace)
    assert len(events) == 2 and {e["note"] for e in events} == {message}
