"""The signal's status member is data to the agent, never orders (issue 29, finding 2).

Anyone allowed to patch a Node could write the status member of its signal (the chart's
signal policy now narrows that to the controller and the node's own agent; these tests
write as the admin, which the policy lets through, so what is shown here is the agent's
own refusal). Each test performs one attack on a simulated node with the real agent
process against the real kube-apiserver, and asserts that it is refused, that nothing ran
(nothing downloaded, the binary not swapped, k0s not restarted, the node not cordoned or
drained), and that the agent reported it (its log; the forged status is overwritten with
the agent's own record where it has one).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import anyio
import pytest

from fleet.agents.files import sha256_file
from fleet.contract.signal import (
    SIGNAL_DATA_KEY,
    SIGNAL_VERSION,
    SIGNAL_VERSION_KEY,
    K0sUpdateCommand,
    SignalCommand,
    SignalData,
    SignalState,
    SignalStatus,
    parse_signal,
    replace_status,
    utcnow,
)
from fleet.kube import KubeClient, KubeObject
from fleet.kube.resources import NAMESPACES, NODES, PODS
from fleet.testing.providers import kubelet_version
from fleet.testing.releases import Release, ReleaseServer
from fleet.testing.simnode import SimNode
from tests.helpers.agent import MANGLED, NEW, OLD, TERMINAL
from tests.helpers.names import unique
from tests.helpers.pods import controlled

pytestmark = pytest.mark.anyio

REPORTED = "ignoring a status this agent did not write"
REDIRECTED = "v1.32.5+k0s.0"  # served by the trusted server as a redirect elsewhere


@pytest.fixture(scope="module")
async def evil() -> AsyncIterator[ReleaseServer]:
    """Another origin, outside every prefix the agent accepts, serving a working k0s."""
    async with ReleaseServer() as rs:
        rs.add(NEW)
        yield rs


@pytest.fixture(scope="module")
async def releases(evil: ReleaseServer) -> AsyncIterator[ReleaseServer]:
    async with ReleaseServer() as rs:
        rs.add(OLD)
        rs.add(NEW)
        rs.add(MANGLED)
        rs.fail(MANGLED, "wrong-bytes")
        rs.add(REDIRECTED)
        rs.fail(REDIRECTED, f"redirect:{evil.releases[NEW].url}")
        yield rs


def mangled(rel: Release) -> bytes:
    """What ReleaseServer serves in its wrong-bytes mode."""
    return bytes(b ^ 0x5A for b in rel.body[:64]) + rel.body[64:]


def forged(url: str, version: str, sha256: str | None, status: SignalStatus | None, *,
           allow_unverified: bool = False) -> tuple[str, str]:
    """(plan id, signal value): a request as the controller writes it, plus ``status``."""
    plan = unique("forged")
    request = SignalData(planId=plan, created=utcnow(), command=SignalCommand(
        id=1, k0supdate=K0sUpdateCommand(url=url, version=version, sha256=sha256,
                                         allowunverified=allow_unverified))).to_json()
    return plan, (request if status is None else replace_status(request, status))


async def write_signal(client: KubeClient, node: SimNode, raw: str) -> None:
    await client.patch(NODES, node.name, {"metadata": {"annotations": {
        SIGNAL_VERSION_KEY: SIGNAL_VERSION, SIGNAL_DATA_KEY: raw}}})


async def wait_log(node: SimNode, needle: str, timeout: float = 20.0, *,
                   ended: bool = False) -> None:
    """Until the agent's log says ``needle`` (a terminal status first fails the wait,
    unless the request had ``ended`` before)."""
    with anyio.fail_after(timeout):
        while needle not in node.log_text():
            sig = node.signal()
            assert ended or not (
                sig is not None and sig.status is not None and sig.status.status.terminal
                and needle.split(":", maxsplit=1)[0] == sig.planId), \
                f"the agent acted on it: {sig.status}\n{node.log_text()[-3000:]}"
            await anyio.sleep(0.05)


async def wait_agent_watching(node: SimNode) -> None:
    with anyio.fail_after(20):
        while not await node.agent_ready():
            await anyio.sleep(0.05)


def ann_of(obj: KubeObject | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("annotations") or {})


def cordoned(obj: KubeObject | None) -> bool:
    return bool(((obj or {}).get("spec") or {}).get("unschedulable"))


@pytest.fixture
async def victim_ns(wl1: KubeClient) -> str:
    name = unique("hostile")
    await wl1.create(NAMESPACES, {"metadata": {"name": name}})
    return name


async def place_victim(client: KubeClient, ns: str, node: str) -> str:
    """A pod a drain would evict."""
    name = unique("victim")
    await client.create(PODS, {"metadata": {"name": name, "ownerReferences": controlled()},
                               "spec": {"nodeName": node,
                                        "containers": [{"name": "c", "image": "pause"}]}}, ns)
    await client.patch(PODS, name, {"status": {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}, ns,
        subresource="status")
    return name


async def signal_now(node: SimNode) -> SignalData | None:
    """The signal as the API server holds it now (``node.signal()`` is the simulated
    node's watch, which may not have seen the test's own write yet when the agent,
    watching too, has already answered it)."""
    obj = await node.client.get(node.res, node.name)
    return parse_signal(((obj or {}).get("metadata") or {}).get("annotations") or {})


def untouched(node: SimNode, before: str | None) -> None:
    assert sha256_file(node.binary) == before, "the binary was replaced"
    assert node.restarts == 0, "k0s was restarted"
    assert not list(node.binary.parent.glob(".k0s.fleet-*")), "something was staged"
    assert not cordoned(node.latest), "the node was cordoned"
    assert node.agent is not None and node.agent.returncode is None
    assert "Traceback" not in node.log_text()


# -- 1. status.sha256 taken over the request's digest ----------------------------------------------
async def test_forged_status_digest_never_installs_other_bytes(
        sim: Any, releases: ReleaseServer) -> None:
    """The mirror serves other bytes than the request's digest names (MANGLED's
    wrong-bytes mode), and a status names those bytes' digest at ApplyingUpdate. Before:
    the agent fetched them again, verified them against the status's digest, installed
    them and restarted k0s onto them."""
    rel = releases.releases[MANGLED]
    evil_digest = hashlib.sha256(mangled(rel)).hexdigest()
    assert evil_digest != rel.sha256
    async with sim() as node:
        await wait_agent_watching(node)
        before, fetched = sha256_file(node.binary), releases.requests[MANGLED]
        plan, raw = forged(rel.url, MANGLED, rel.sha256, SignalStatus(
            status=SignalState.APPLYING_UPDATE, sha256=evil_digest, previousversion=OLD))
        await write_signal(node.client, node, raw)
        await wait_log(node, f"{plan}: {REPORTED}")
        untouched(node, before)
        assert releases.requests[MANGLED] == fetched, "the agent downloaded"
        sig = await signal_now(node)
        assert sig is not None and sig.status is not None
        assert sig.status.status is SignalState.APPLYING_UPDATE  # left as written: not ours


# -- 2. a status naming a later step skips the policy ----------------------------------------------
async def test_status_naming_a_later_step_skips_no_check(
        sim: Any, releases: ReleaseServer, evil: ReleaseServer) -> None:
    """A request the agent's policy refuses (a URL outside its prefixes; no digest while
    the agent refuses unverified binaries), written with status Downloading. Before: the
    policy ran only in the first step, so the agent downloaded from the other origin (or
    unverified), drained, installed and restarted."""
    async with sim() as node:
        await wait_agent_watching(node)
        before = sha256_file(node.binary)
        outside, unverified = evil.releases[NEW], releases.releases[NEW]
        fetched = (evil.requests[NEW], releases.requests[NEW])
        downloading = SignalStatus(status=SignalState.DOWNLOADING, previousversion=OLD)
        for url, sha, allow in ((outside.url, outside.sha256, False),
                                (unverified.url, None, True)):
            plan, raw = forged(url, NEW, sha, downloading, allow_unverified=allow)
            await write_signal(node.client, node, raw)
            await wait_log(node, f"{plan}: {REPORTED}")
            untouched(node, before)
        assert (evil.requests[NEW], releases.requests[NEW]) == fetched, "the agent downloaded"
        # the same request without a status is refused by the policy, as it always was
        plan, raw = forged(outside.url, NEW, outside.sha256, None)
        await write_signal(node.client, node, raw)
        sig = await node.wait_for(plan, TERMINAL, timeout=20)
        assert sig.status is not None and sig.status.status is SignalState.INVALID_REQUEST
        assert evil.requests[NEW] == fetched[0]
        untouched(node, before)


# -- 3. deadlines from status.timestamp ------------------------------------------------------------
def ready(obj: KubeObject) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


async def test_a_1970_timestamp_does_not_cut_the_verification(
        sim: Any, wl1: KubeClient, releases: ReleaseServer) -> None:
    """The agent stopped in Verifying; the node is not Ready yet. Someone rewrites the
    status's timestamp to 1970. Before: the verify deadline ran from that timestamp, so
    the agent gave the node one second, declared the upgrade failed and rolled it back.
    Now the deadline runs from the agent's own record: it waits, the node becomes Ready,
    the upgrade completes."""
    new = releases.releases[NEW]
    async with sim(crash_at="Verifying:before") as node:
        plan = await node.request(new)
        assert await node.wait_agent_exit(timeout=60) != 0
        sig = await node.wait_for(plan, {SignalState.VERIFYING}, timeout=10)
        assert sig.status is not None
        # the supervisor has restarted k0s onto NEW and reported it Ready; then Ready goes
        await node.wait_until(lambda o: ready(o) and (o.get("status") or {}).get(
            "nodeInfo", {}).get("kubeletVersion") == kubelet_version(NEW), timeout=20)
        await node.set_ready(False, "kubelet still starting")
        await node.wait_until(lambda o: not ready(o), timeout=20)
        epoch = datetime(1970, 1, 1, tzinfo=UTC)
        raw = ann_of(node.latest)[SIGNAL_DATA_KEY]
        await write_signal(wl1, node, replace_status(raw, sig.status.model_copy(
            update={"timestamp": epoch})))
        await node.wait_until(lambda o: (s := node.signal()) is not None
                              and s.status is not None and s.status.timestamp == epoch)
        await node.start_agent()
        await wait_log(node, f"{plan}: {REPORTED}", timeout=30)
        await node.set_ready(True, "kubelet ready")
        sig = await node.wait_for(plan, TERMINAL, timeout=40)
        assert sig.status is not None
        assert sig.status.status is SignalState.COMPLETED, (sig.status.reason,
                                                            node.log_text()[-3000:])
        assert "RolledBack" not in node.states(plan)
        assert node.restarts == 1 and sha256_file(node.binary) == new.sha256


# -- 4. Cordoning / Restarting written by someone else ---------------------------------------------
async def test_cordoning_or_restarting_written_by_another_writer_does_nothing(
        sim: Any, wl1: KubeClient, releases: ReleaseServer, victim_ns: str) -> None:
    """Restarting on a request for the running version, Cordoning on a request for a new
    one, Restarting again on a request the agent completed itself. Before: the agent
    restarted k0s for the first and the third, and cordoned, drained, installed and
    restarted for the second."""
    old, new = releases.releases[OLD], releases.releases[NEW]
    async with sim() as node:
        await wait_agent_watching(node)
        victim = await place_victim(wl1, victim_ns, node.name)
        before = sha256_file(node.binary)
        cases = [
            forged(old.url, OLD, old.sha256, SignalStatus(
                status=SignalState.RESTARTING, previousversion=OLD)),
            forged(new.url, NEW, new.sha256, SignalStatus(
                status=SignalState.CORDONING, previousversion=OLD, sha256=new.sha256)),
        ]
        for plan, raw in cases:
            await write_signal(wl1, node, raw)
            await wait_log(node, f"{plan}: {REPORTED}")
            untouched(node, before)
            assert await wl1.get_or_none(PODS, victim, victim_ns) is not None, "drained"
        # a request the agent completed itself, then a Restarting written into it
        plan = await node.request(old, force=False)
        sig = await node.wait_for(plan, TERMINAL, timeout=20)
        assert sig.status is not None and sig.status.status is SignalState.COMPLETED
        raw = ann_of(node.latest)[SIGNAL_DATA_KEY]
        await write_signal(wl1, node, replace_status(raw, SignalStatus(
            status=SignalState.RESTARTING, previousversion=OLD)))
        await wait_log(node, f"{plan}: {REPORTED}", ended=True)
        untouched(node, before)
        sig = await signal_now(node)
        assert sig is not None and sig.status is not None
        # not resumed: left as written, or the agent's own Completed written back over it
        # (it restores its record's status; which of the two is seen is timing)
        assert sig.status.status in (SignalState.RESTARTING, SignalState.COMPLETED), sig.status
        assert await wl1.get_or_none(PODS, victim, victim_ns) is not None


# -- 5. a redirect to another origin ---------------------------------------------------------------
async def test_redirect_to_another_origin_is_refused(
        sim: Any, releases: ReleaseServer, evil: ReleaseServer) -> None:
    """The request's URL is under the accepted prefix; the server there redirects to
    another origin serving a binary with the requested digest. Before: the agent followed
    the redirect and installed it. Now: FailedDownload naming the refused hop, nothing
    fetched from the other origin."""
    target = evil.releases[NEW]
    async with sim() as node:
        before, fetched = sha256_file(node.binary), evil.requests[NEW]
        plan = await node.request(version=NEW, url=releases.releases[REDIRECTED].url,
                                  sha256=target.sha256)
        sig = await node.wait_for(plan, TERMINAL, timeout=30)
        assert sig.status is not None
        assert sig.status.status is SignalState.FAILED_DOWNLOAD, sig.status
        assert "not under any prefix" in sig.status.reason and target.url in sig.status.reason
        assert "refused" in node.log_text()
        assert evil.requests[NEW] == fetched
        untouched(node, before)


async def test_backslash_in_the_url_is_refused(sim: Any, releases: ReleaseServer) -> None:
    r"""``\`` is no path separator to the agent's prefix check, but is one to some
    servers and proxies: a URL with characters outside RFC 3986 is refused as such."""
    new = releases.releases[NEW]
    url = new.url.rsplit("/", 1)[0] + "/..\\..\\elsewhere\\k0s"
    async with sim() as node:
        before = sha256_file(node.binary)
        plan = await node.request(new, url=url)
        sig = await node.wait_for(plan, TERMINAL, timeout=20)
        assert sig.status is not None and sig.status.status is SignalState.INVALID_REQUEST
        assert "RFC 3986" in sig.status.reason and "'\\\\'" in sig.status.reason
        untouched(node, before)
