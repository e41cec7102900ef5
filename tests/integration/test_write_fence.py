"""A leader's writes are fenced by its Lease (the chaos suite's leader-pause fault: a
controller SIGSTOPped past its Lease and resumed sent one more status patch after the
other replica had taken over, before its renewal task had run).

Against the real kube-apiserver: a fenced client sends no write while its holder does not
hold (reads still work), and the elector stops holding as soon as its last renewal is
older than the renew deadline on its own clock, before its renewal task has run again.
"""

from __future__ import annotations

import anyio
import pytest

from fleet.controllers.leader import LeaderElector
from fleet.kube import FencedError, KubeClient, NotFoundError
from fleet.kube.resources import CONFIGMAPS
from tests.helpers.names import unique

pytestmark = pytest.mark.anyio


async def test_a_fenced_client_sends_no_write_while_the_lease_is_not_held(
        mgmt: KubeClient, namespace: str) -> None:
    holding = False
    fenced = mgmt.fenced(lambda: holding)
    name = unique("fenced")
    body = {"metadata": {"name": name, "namespace": namespace}, "data": {"k": "v"}}
    with pytest.raises(FencedError, match="not sent"):
        await fenced.create(CONFIGMAPS, body, namespace)
    with pytest.raises(NotFoundError):  # not sent: reads go through
        await fenced.get(CONFIGMAPS, name, namespace)
    holding = True
    await fenced.create(CONFIGMAPS, body, namespace)
    holding = False
    with pytest.raises(FencedError):
        await fenced.patch(CONFIGMAPS, name, {"data": {"k": "w"}}, namespace)
    assert (await mgmt.get(CONFIGMAPS, name, namespace))["data"] == {"k": "v"}


async def test_the_elector_stops_holding_once_its_renewal_is_overdue_on_its_clock(
        mgmt: KubeClient, namespace: str) -> None:
    """A process stopped past its renew deadline: its monotonic clock jumps; ``holds()``
    is false at once, while ``leading`` (the renewal task has not run yet) is still set."""
    offset = 0.0

    def clock() -> float:
        import time  # noqa: PLC0415

        return time.monotonic() + offset

    elector = LeaderElector(mgmt, namespace=namespace, identity="a", name=unique("lease"),
                            lease_seconds=30, monotonic=clock)
    seen: dict[str, bool] = {}

    async def lead() -> None:
        nonlocal offset
        seen["holds while leading"] = elector.holds()
        offset = elector.renew_deadline + 1  # as if stopped that long, just now resumed
        seen["leading after the jump"] = elector.leading
        seen["holds after the jump"] = elector.holds()

    assert not elector.holds()
    with anyio.fail_after(60):
        await elector.run(lead)
    assert seen == {"holds while leading": True, "leading after the jump": True,
                    "holds after the jump": False}
    assert not elector.holds()
