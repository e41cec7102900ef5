"""Leader election against a real kube-apiserver that stalls (issue #12 item 3).

The holder reaches the API server through a proxy that stops moving bytes (connections
stay open: nothing fails, nothing answers), the standby talks to it directly. The holder
must stop acting before the standby starts: each renewal is cut off at the renew
deadline, not left to the client's 30 s request timeout.
"""

from __future__ import annotations

import time

import anyio
import pytest

from fleet.controllers.leader import LeaderElector, LostLeadershipError
from fleet.kube import KubeClient
from fleet.kube.resources import LEASES
from fleet.testing.proxy import StallingProxy
from fleet.testing.world import World
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio

LEASE = 9  # seconds; renew every 3 s, give up 6 s after the last good renewal started


async def test_holder_stops_before_standby_takes_over_when_the_server_stalls(
        world: World, mgmt: KubeClient, namespace: str) -> None:
    name = unique("lease")
    server = world["mgmt"]
    events: dict[str, float] = {}
    holder_leading = anyio.Event()
    async with StallingProxy(server.port) as proxy:
        config = server.kubeconfig()
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
        async with await KubeClient.from_kubeconfig(config, name="via-proxy") as via_proxy:
            holder = LeaderElector(via_proxy, namespace=namespace, identity="holder",
                                   name=name, lease_seconds=LEASE)
            standby = LeaderElector(mgmt, namespace=namespace, identity="standby",
                                    name=name, lease_seconds=LEASE, retry_every=0.5)

            async def hold() -> None:
                holder_leading.set()
                try:
                    await anyio.sleep_forever()
                finally:
                    events["holder stopped"] = time.monotonic()

            async def stand_by() -> None:
                events["standby leads"] = time.monotonic()
                await anyio.sleep_forever()

            async def run_holder() -> None:
                with pytest.raises(LostLeadershipError):
                    await holder.run(hold)
                events["holder run returned"] = time.monotonic()

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run_holder)
                    await holder_leading.wait()
                    tg.start_soon(standby.run, stand_by)
                    # Let a couple of renewals go through, then stall the holder's path.
                    lease = await mgmt.get(LEASES, name, namespace)
                    first = lease["spec"]["renewTime"]
                    while (await mgmt.get(LEASES, name, namespace))["spec"]["renewTime"] == first:
                        await anyio.sleep(0.2)
                    proxy.stall()
                    events["stalled"] = time.monotonic()
                    while "standby leads" not in events:
                        await anyio.sleep(0.1)
                    tg.cancel_scope.cancel()
    assert "holder stopped" in events and "holder run returned" in events, events
    assert events["holder stopped"] < events["standby leads"], (
        f"the old holder still acted {events['holder stopped'] - events['standby leads']:.1f}s "
        "after the standby took over")
    lease = await mgmt.get(LEASES, name, namespace)
    assert lease["spec"].get("holderIdentity") in ("standby", None)  # released on exit


async def test_a_renew_deadline_that_cannot_work_is_refused(mgmt: KubeClient) -> None:
    with pytest.raises(ValueError, match="renew_deadline"):
        LeaderElector(mgmt, namespace="x", identity="a", lease_seconds=9, renew_deadline=10)
