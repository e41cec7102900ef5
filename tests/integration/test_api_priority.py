"""The chart's API Priority and Fairness objects, installed by the real helm into a real
kube-apiserver with APF on, classify the controller ServiceAccount's Lease requests (and
nothing else of it) into the chart's own priority level; a GET that APF rejects with 429
and Retry-After is sent again after the wait (fleet.kube.errors.retry_wait); and the
client layer's write limiter bounds the writes that reach a real API server
(fleet.kube.ratelimit).

The test world's API servers run with ``--enable-priority-and-fairness=false``; this
module starts one more on the same etcd with it on. The server names the FlowSchema and
the priority level it classified a request into in the response headers
``X-Kubernetes-PF-FlowSchema-UID`` / ``X-Kubernetes-PF-PriorityLevel-UID``.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from fleet.controllers.leader import LeaderElector
from fleet.kube import FencedError, KubeClient, WriteLimiter
from fleet.kube.resources import CONFIGMAPS, LEASES, SERVICE_ACCOUNTS
from fleet.testing.world import ApiServer, World
from tests.helpers.charts import (
    CLUSTER_WIDE_SECRETS,
    CONTROLLER_CHART,
    FLOW_SCHEMAS,
    PRIORITY_LEVELS,
    ROLE_BINDINGS,
    ROLES,
    helm_cli,
    kubeconfig_file,
)
from tests.helpers.names import fresh_namespace, unique
from tests.helpers.rbac import service_account_token

pytestmark = pytest.mark.anyio

FS_UID, PL_UID = "X-Kubernetes-PF-FlowSchema-UID", "X-Kubernetes-PF-PriorityLevel-UID"


@pytest.fixture(scope="module")
async def apf_server(world: World) -> AsyncIterator[ApiServer]:
    """An API server of its own with API Priority and Fairness on (the later flag wins)."""
    server = await anyio.to_thread.run_sync(lambda: world.add_server(
        unique("apf"), extra_args=["--enable-priority-and-fairness=true"]))
    try:
        yield server
    finally:
        await anyio.to_thread.run_sync(world.remove_server, server.name)


def _classified(server: ApiServer, token: str, method: str, path: str,
                body: bytes | None = None) -> tuple[int, tuple[str, str]]:
    """One request as ``token``'s identity: (status, (FlowSchema UID, PriorityLevel UID))."""
    ctx = ssl.create_default_context(cadata=server.ca_pem.decode())
    ctx.check_hostname = False
    req = urllib.request.Request(f"{server.url}{path}", method=method, data=body, headers={
        "Authorization": f"Bearer {token}", "Accept": "application/json",
        "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
            return resp.status, (resp.headers.get(FS_UID, ""), resp.headers.get(PL_UID, ""))
    except urllib.error.HTTPError as e:  # classified all the same (APF runs before authz)
        return e.code, (e.headers.get(FS_UID, ""), e.headers.get(PL_UID, ""))


async def test_the_chart_gives_the_controllers_lease_requests_their_own_priority_level(
        apf_server: ApiServer, tmp_path: Path) -> None:
    ns, release = unique("kf-apf"), unique("k0s-fleet")
    kubeconfig = kubeconfig_file(apf_server, tmp_path)
    # Installed as docs/operations.md "Install" says, by an identity that may create
    # FlowSchemas (the admin); helm sees flowcontrol.apiserver.k8s.io/v1 by discovery.
    out = await helm_cli("install", release, CONTROLLER_CHART, "--namespace", ns,
                         "--create-namespace", "--kubeconfig", kubeconfig,
                         "--set", CLUSTER_WIDE_SECRETS)
    assert "STATUS: deployed" in out
    name = f"{release}-leases"  # the release name holds the chart's: fullname = release
    async with await apf_server.client() as admin:
        fs = await admin.get(FLOW_SCHEMAS, name)
        pl = await admin.get(PRIORITY_LEVELS, name)
        assert fs["spec"]["priorityLevelConfiguration"]["name"] == name
        ours = (str(fs["metadata"]["uid"]), str(pl["metadata"]["uid"]))
        token = await service_account_token(admin, ns, release)
        lease_path = LEASES.path(ns, "k0s-fleet-controller")
        lease = (b'{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":'
                 b'{"name":"k0s-fleet-controller"},"spec":{"holderIdentity":"apf-test"}}')
        # The server applies a new FlowSchema on its own schedule: wait for it to.
        with anyio.fail_after(60):
            while True:
                status, uids = await anyio.to_thread.run_sync(
                    _classified, apf_server, token, "GET", lease_path)
                if uids == ours:
                    break
                await anyio.sleep(0.2)
        assert status == 404  # classified and authorized: the Lease is not there yet
        # What a leader's renewal sends: create, get, update of its Lease.
        status, uids = await anyio.to_thread.run_sync(
            _classified, apf_server, token, "POST", LEASES.path(ns), lease)
        assert (status, uids) == (201, ours)
        current = await admin.get(LEASES, "k0s-fleet-controller", ns)
        update = lease.replace(b'"name":"k0s-fleet-controller"}', (
            b'"name":"k0s-fleet-controller","resourceVersion":"'
            + current["metadata"]["resourceVersion"].encode() + b'"}'))
        status, uids = await anyio.to_thread.run_sync(
            _classified, apf_server, token, "PUT", lease_path, update)
        assert (status, uids) == (200, ours)
        # The same identity's other requests are not: its rollout ConfigMap, a list of
        # the Leases (not a renewal), and a Lease in another namespace.
        fs_builtin = await admin.get(FLOW_SCHEMAS, "service-accounts")
        for path in (CONFIGMAPS.path(ns, "k0s-fleet-rollout"), LEASES.path(ns),
                     LEASES.path("default", "k0s-fleet-controller")):
            status, (fs_uid, pl_uid) = await anyio.to_thread.run_sync(
                _classified, apf_server, token, "GET", path)
            assert fs_uid and pl_uid, path
            assert fs_uid not in ours and pl_uid not in ours, path
            assert fs_uid == fs_builtin["metadata"]["uid"], path
        # Another identity's Lease request is not either (the admin is exempt).
        status, (fs_uid, _) = await anyio.to_thread.run_sync(
            _classified, apf_server, apf_server.admin_token, "GET", lease_path)
        assert status == 200 and fs_uid != ours[0]
    await helm_cli("uninstall", release, "--namespace", ns, "--kubeconfig", kubeconfig,
                   "--wait")
    async with await apf_server.client() as admin:
        assert await admin.get_or_none(FLOW_SCHEMAS, name) is None
        assert await admin.get_or_none(PRIORITY_LEVELS, name) is None


async def test_a_get_apf_rejects_is_sent_again_after_the_wait_the_server_asks(
        apf_server: ApiServer) -> None:
    """A ServiceAccount whose list requests fall in a priority level of ~3 seats that
    rejects rather than queues (a list of 1000 objects takes them all): of 40 lists at
    once through the client, the server rejects some with 429 and Retry-After (counted by
    the client; rounds repeat until it does, else the test proves nothing); every list
    returns every object, the rejected ones sent again after the wait (before, the 429
    was raised to the caller: a reflector started its list over)."""
    sa, level = "lister", unique("kf-429-level")
    async with await apf_server.client() as admin, fresh_namespace(admin) as ns:
        await admin.create(SERVICE_ACCOUNTS, {"metadata": {"name": sa}}, ns)
        # (the built-in "view" role is filled by kube-controller-manager: not here)
        await admin.create(ROLES, {"metadata": {"name": sa}, "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]}, ns)
        await admin.create(ROLE_BINDINGS, {
            "metadata": {"name": sa, "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}, ns)
        pl = await admin.create(PRIORITY_LEVELS, {
            "metadata": {"name": level},
            "spec": {"type": "Limited", "limited": {
                "nominalConcurrencyShares": 1, "lendablePercent": 0,
                "borrowingLimitPercent": 0, "limitResponse": {"type": "Reject"}}}})
        await admin.create(FLOW_SCHEMAS, {
            "metadata": {"name": level},
            "spec": {"priorityLevelConfiguration": {"name": level},
                     "matchingPrecedence": 500,
                     "rules": [{"subjects": [{"kind": "ServiceAccount", "serviceAccount": {
                         "name": sa, "namespace": ns}}],
                         "resourceRules": [{"apiGroups": [""], "resources": ["configmaps"],
                                            "verbs": ["list"], "namespaces": [ns]}]}]}})
        try:
            async def at_once(n: int, one: Callable[[], Awaitable[None]]) -> None:
                async with anyio.create_task_group() as tg:
                    for _ in range(n):
                        tg.start_soon(one)

            created = iter(range(1000))

            async def create() -> None:
                for i in created:
                    await admin.create(CONFIGMAPS, {"metadata": {"name": f"c{i:04d}"},
                                                    "data": {"v": "x" * 2000}}, ns)

            await at_once(16, create)
            token = await service_account_token(admin, ns, sa)
            with anyio.fail_after(60):  # the server applies the level on its schedule
                while (await anyio.to_thread.run_sync(
                        _classified, apf_server, token, "GET", CONFIGMAPS.path(ns)))[1][1] \
                        != pl["metadata"]["uid"]:
                    await anyio.sleep(0.2)
            async with await apf_server.client(token=token) as client:
                sizes: list[int] = []

                async def listed() -> None:
                    sizes.append(len((await client.list(CONFIGMAPS, ns)).items))

                with anyio.fail_after(240):
                    for _ in range(5):
                        await at_once(40, listed)
                        if client.retries_asked:
                            break
                assert client.retries_asked > 0, "no list was rejected: nothing proved"
                assert sizes == [1000] * len(sizes)
        finally:
            await admin.delete(FLOW_SCHEMAS, level)
            await admin.delete(PRIORITY_LEVELS, level)


class FakeTime:
    """A clock the test moves, and a sleep that returns once the clock passed its end."""

    def __init__(self) -> None:
        self.now = 0.0
        self._moved = anyio.Event()
        self.sleeping = 0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        until = self.now + seconds
        self.sleeping += 1
        try:
            while self.now < until - 1e-9:
                await self._moved.wait()
        finally:
            self.sleeping -= 1

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self._moved.set()
        self._moved = anyio.Event()


@pytest.fixture
async def mgmt_plain(world: World) -> AsyncIterator[KubeClient]:
    """The management API server (its CRDs not needed)."""
    async with await world["mgmt"].client() as client:
        yield client


async def test_the_write_limiter_bounds_the_writes_that_reach_the_server(
        mgmt_plain: KubeClient) -> None:
    """13 creates at once through a client limited to burst 3 then 2 per second (fake
    time): the server holds 3 objects until the clock moves, one more per 0.5 s after,
    never more than burst + qps * t; reads pass at once; a write whose turn comes after
    the Lease fence closed is not sent; the renewals' client (reopen) is not limited."""
    mgmt = mgmt_plain
    time = FakeTime()
    limiter = WriteLimiter(2, 3, clock=time.clock, sleep=time.sleep)
    held = True
    client = mgmt.limited(limiter).fenced(lambda: held)
    assert client.write_limiter is limiter
    async with fresh_namespace(mgmt) as ns:
        label = unique("burst")

        async def stored() -> int:
            return len((await mgmt.list(CONFIGMAPS, ns, label_selector=f"test={label}")).items)

        async def until_stored(n: int) -> None:
            with anyio.fail_after(30):
                while await stored() < n:
                    await anyio.sleep(0.02)

        async def create(i: int) -> None:
            await client.create(CONFIGMAPS, {"metadata": {
                "name": f"w{i}", "namespace": ns, "labels": {"test": label}}})

        async with anyio.create_task_group() as tg:
            for i in range(13):
                tg.start_soon(create, i)
            await until_stored(3)
            with anyio.fail_after(30):
                while time.sleeping < 10:
                    await anyio.sleep(0.01)
            # the other ten wait for their turn; the server has the burst only
            assert (limiter.stats.taken, limiter.stats.delayed) == (13, 10)
            assert await stored() == 3
            await client.get(CONFIGMAPS, "w0", ns)  # reads are not limited
            for step in range(1, 11):
                time.advance(0.5)  # one token per 1/qps
                await until_stored(3 + step)
                assert await stored() == 3 + step <= 3 + 2 * time.now
        assert limiter.stats.waited_seconds == pytest.approx(sum(k / 2 for k in range(1, 11)))
        # the fence is asked when the write's turn comes, not when it started waiting
        assert limiter.bucket.tokens() < 1
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                async def late_write() -> None:
                    with pytest.raises(FencedError):
                        await create(99)

                tg.start_soon(late_write)
                while time.sleeping < 1:
                    await anyio.sleep(0.01)
                held = False
                time.advance(1.0)
        assert await mgmt.get_or_none(CONFIGMAPS, "w99", ns) is None
        renewals = await client.reopen(name="renewals")
        try:
            assert renewals.write_limiter is None
        finally:
            await renewals.close()


async def test_the_lease_renewals_do_not_queue_behind_limited_writes(
        mgmt_plain: KubeClient) -> None:
    """A leader elector given the controller's limited client (the CLI gives it the
    unlimited one anyway) takes and renews its Lease while four writes of that client wait
    for a token that does not come (fake time): the renewals run on the client reopen()
    builds, which has no limiter."""
    mgmt = mgmt_plain
    time = FakeTime()
    limiter = WriteLimiter(1, 1, clock=time.clock, sleep=time.sleep)
    limited = mgmt.limited(limiter)
    async with fresh_namespace(mgmt) as ns:
        elector = LeaderElector(limited, namespace=ns, identity="a", name=unique("lease"),
                                lease_seconds=6)

        async def lead() -> None:
            renewals: set[str] = set()
            with anyio.fail_after(30):
                while len(renewals) < 3:  # taken, then renewed twice
                    lease = await mgmt.get(LEASES, elector.name, ns)
                    renewals.add(lease["spec"]["renewTime"])
                    await anyio.sleep(0.1)
            assert time.sleeping == 4 and limiter.stats.taken == 5
            time.advance(10.0)  # the writes (and the elector's release) may go now

        async def write(i: int) -> None:
            await limited.create(CONFIGMAPS, {"metadata": {"name": f"w{i}",
                                                           "namespace": ns}})

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(5):  # one token: the first goes, four wait
                    tg.start_soon(write, i)
                while time.sleeping < 4:
                    await anyio.sleep(0.01)
                await elector.run(lead)
        assert len((await mgmt.list(CONFIGMAPS, ns)).items) >= 5
