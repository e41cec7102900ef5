"""The node agent against a real kube-apiserver, real files and real processes.

Every test runs a simulated node (fleet.testing.simnode): a Node in workload cluster
wl1, a fake k0s under a supervisor, and the agent as a real subprocess.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import AsyncIterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet.agents.files import sha256_file
from fleet.contract.signal import (
    HAPPY_PATH,
    RUNNING_VERSION_KEY,
    SIGNAL_DATA_KEY,
    SIGNAL_REJECTED_KEY,
    SIGNAL_VERSION_KEY,
    DrainTimeoutAction,
    NodePolicy,
    SignalState,
    signal_digest,
)
from fleet.kube import KubeClient, KubeObject
from fleet.kube.resources import NAMESPACES, NODES, PDBS, PODS
from fleet.testing.releases import ReleaseServer
from fleet.testing.simnode import SimNode
from tests.helpers.agent import (
    BROKEN,
    MANGLED,
    NEW,
    OLD,
    STALLS,
    TERMINAL,
    uncordoned,
)
from tests.helpers.names import unique
from tests.helpers.pods import controlled

pytestmark = pytest.mark.anyio

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
@pytest.fixture
async def wl1_namespace(wl1: KubeClient) -> AsyncIterator[str]:
    name = unique("agent")
    await wl1.create(NAMESPACES, {"metadata": {"name": name}})
    yield name
    # no namespace controller runs: the namespace stays Terminating, which is harmless


async def make_pod(client: KubeClient, ns: str, node: str, name: str, *,
                   labels: dict[str, str] | None = None,
                   meta: dict[str, Any] | None = None) -> KubeObject:
    await client.create(PODS, {
        "metadata": {"name": name, "namespace": ns, "labels": labels or {},
                     "ownerReferences": controlled(), **(meta or {})},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
    }, ns)
    # what a kubelet would report; a Pending pod may be evicted whatever its budget says
    return await client.patch(PODS, name, {"status": {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}, ns,
        subresource="status")


async def pod_names(client: KubeClient, node: str) -> set[str]:
    pods = await client.list(PODS, field_selector=f"spec.nodeName={node}")
    return {p["metadata"]["name"] for p in pods.items}


def leftovers(node: SimNode) -> list[str]:
    files = [p.name for p in node.binary.parent.iterdir() if p.name != "k0s"]
    files += [p.name for p in node.state_dir.iterdir() if p.name != "agent.lock"]
    return sorted(files)


async def wait_clean(node: SimNode, timeout: float = 10) -> None:
    """The agent removes staged/rollback files and markers right after a terminal write."""
    with anyio.fail_after(timeout):
        while leftovers(node):
            await anyio.sleep(0.05)


def record_timing(line: str) -> None:
    print(line)
    path = os.environ.get("K0S_FLEET_TIMINGS")
    if path:
        with open(path, "a") as fh:
            fh.write(line + "\n")


# -- the happy path ---------------------------------------------------------------------------
async def test_happy_path(sim: Any, releases: ReleaseServer, wl1: KubeClient,
                          wl1_namespace: str, tmp_path: Path) -> None:
    """Drains (PDB-free pods evicted, DaemonSet/mirror pods left), swaps, restarts once,
    verifies, uncordons; one trace under the request's traceparent; idle afterwards."""
    new = releases.releases[NEW]
    spans = tmp_path / "spans.jsonl"
    async with sim(agent_args=["--trace-file", str(spans)]) as node:
        ns = wl1_namespace
        await make_pod(wl1, ns, node.name, "web-1")
        await make_pod(wl1, ns, node.name, "web-2")
        await make_pod(wl1, ns, node.name, "ds-pod", meta={"ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "controller": True,
            "uid": "00000000-0000-0000-0000-000000000001"}]})
        await make_pod(wl1, ns, node.name, "static",
                       meta={"annotations": {"kubernetes.io/config.mirror": "x"}})
        with anyio.fail_after(20):
            while not await node.agent_ready():
                await anyio.sleep(0.05)
        t0 = anyio.current_time()
        plan = await node.request(new, traceparent=TRACEPARENT)
        sig = await node.wait_for(plan, TERMINAL, timeout=60)
        wall = anyio.current_time() - t0
        assert sig.status is not None
        assert sig.status.status is SignalState.COMPLETED, sig.status.reason
        assert node.states(plan) == [str(s) for s in HAPPY_PATH]
        assert await node.running_version() == NEW
        assert sha256_file(node.binary) == new.sha256
        assert node.restarts == 1
        assert await pod_names(wl1, node.name) == {"ds-pod", "static"}
        assert node.latest is not None and uncordoned(node.latest)
        assert node.latest["metadata"]["annotations"][RUNNING_VERSION_KEY] == NEW
        assert sig.status.previousversion == OLD and sig.status.sha256 == new.sha256
        await wait_clean(node)

        hist = [t for t in node.history if t.plan_id == plan]
        steps = {a.state: (b.at - a.at).total_seconds() for a, b in pairwise(hist)}
        record_timing(f"agent_happy_path_seconds total={wall:.3f} (request written -> "
                      f"Completed observed; binary {len(new.body)} bytes) " +
                      " ".join(f"{k}={v:.3f}" for k, v in steps.items()))

        # idle: no CPU while nothing changes, and its resident memory
        cpu0 = node.agent_cpu_seconds()
        await anyio.sleep(3)  # a measurement window, not synchronisation
        cpu1 = node.agent_cpu_seconds()
        rss = node.agent_rss_kib()
        assert cpu0 is not None and cpu1 is not None and rss is not None
        record_timing(f"agent_idle rss_kib={rss} cpu_seconds_over_3s={cpu1 - cpu0:.3f}")
        assert cpu1 - cpu0 < 0.1

        assert await node.stop_agent() == 0  # SIGTERM: clean exit, spans flushed
    recorded = [json.loads(line) for line in spans.read_text().splitlines()]
    _, trace_id, dispatch_span, _ = TRACEPARENT.split("-")
    (upgrade,) = [s for s in recorded if s["name"] == "agent.upgrade"]
    # the controller's dispatch span (the request's traceparent) -> upgrade -> steps
    assert upgrade["parent_span_id"] == dispatch_span
    assert upgrade["attributes"]["k0s_fleet.outcome"] == "Completed"
    assert upgrade["attributes"]["k0s_fleet.previous_version"] == OLD
    steps_recorded = sorted(s["name"] for s in recorded if s is not upgrade)
    assert steps_recorded == sorted(f"agent.{step}" for step in
                                    ("Start", *(str(s) for s in HAPPY_PATH[:-1])))
    for s in recorded:
        assert s["trace_id"] == trace_id and s["links"] == []
        assert s["attributes"]["k0s_fleet.node"] == node.name
        assert s["attributes"]["k8s.node.name"] == node.name  # OpenTelemetry semconv
        if s is not upgrade:
            assert s["parent_span_id"] == upgrade["span_id"]
            assert upgrade["start_time_unix_nano"] <= s["start_time_unix_nano"]
            assert s["end_time_unix_nano"] <= upgrade["end_time_unix_nano"] + 1_000_000
    download = next(s for s in recorded if s["name"] == "agent.Downloading")
    assert download["attributes"]["k0s_fleet.download.bytes"] == len(new.body)


async def test_already_on_version(sim: Any, releases: ReleaseServer) -> None:
    async with sim() as node:
        plan = await node.request(releases.releases[OLD])
        sig = await node.wait_for(plan, TERMINAL, timeout=30)
        assert sig.status is not None and sig.status.status is SignalState.COMPLETED
        assert "already running" in sig.status.reason
        assert node.states(plan) == ["Completed"]
        assert node.restarts == 0
        assert releases.requests[OLD] == 0  # nothing downloaded


async def test_controlnode_of_a_pure_controller(sim: Any, releases: ReleaseServer) -> None:
    async with sim(signal_object="controlnode") as node:
        plan = await node.request(releases.releases[NEW])
        sig = await node.wait_for(plan, TERMINAL, timeout=60)
        assert sig.status is not None and sig.status.status is SignalState.COMPLETED, \
            sig.status.reason
        assert node.states(plan) == [str(s) for s in HAPPY_PATH]
        assert await node.running_version() == NEW and node.restarts == 1


@pytest.mark.parametrize("strategy", ["command", "pid-file"])
async def test_other_restart_and_version_strategies(sim: Any, releases: ReleaseServer,
                                                    tmp_path: Path, strategy: str) -> None:
    """``command`` restart; and no status socket: pid file + ``k0s version``."""
    pid_file = tmp_path / "run" / "k0s.pid"
    if strategy == "command":
        args = ["--restart-strategy", "command",
                "--restart-command", f"sh -c 'kill -TERM \"$(cat {pid_file})\"'"]
    else:
        args = ["--status-socket", "", "--version-source", "binary",
                "--verify-stable-seconds", "0.5"]
    async with sim(agent_args=args) as node:
        plan = await node.request(releases.releases[NEW])
        sig = await node.wait_for(plan, TERMINAL, timeout=60)
        assert sig.status is not None
        assert sig.status.status is SignalState.COMPLETED, sig.status.reason
        assert node.states(plan) == [str(s) for s in HAPPY_PATH]
        assert await node.running_version() == NEW and node.restarts == 1


# -- download failures: the installed binary is untouched --------------------------------------
@pytest.mark.parametrize(("version", "needle"), [
    (MANGLED, "sha256 mismatch"),
    ("v9.9.9+k0s.0", "HTTP 404"),
    (STALLS, "stalled"),
])
async def test_download_failures(sim: Any, releases: ReleaseServer, version: str,
                                 needle: str) -> None:
    rel = releases.releases.get(version)
    async with sim(agent_args=["--download-stall-timeout", "0.5"]) as node:
        before = sha256_file(node.binary)
        if rel is None:
            plan = await node.request(version=version, url=f"{releases.base_url}/k0s/{version}",
                                      sha256="d" * 64)
        else:
            plan = await node.request(rel)
        sig = await node.wait_for(plan, TERMINAL, timeout=30)
        assert sig.status is not None and sig.status.status is SignalState.FAILED_DOWNLOAD
        assert needle in sig.status.reason
        assert node.states(plan) == ["Downloading", "FailedDownload"]
        assert sha256_file(node.binary) == before
        assert node.restarts == 0
        await wait_clean(node)
        assert node.latest is not None and uncordoned(node.latest)


# -- a new binary that cannot start ---------------------------------------------------------
async def test_binary_that_fails_to_start_is_rolled_back(sim: Any,
                                                         releases: ReleaseServer) -> None:
    old = releases.releases[OLD]
    async with sim(agent_args=["--verify-timeout", "3"]) as node:
        plan = await node.request(releases.releases[BROKEN])
        sig = await node.wait_for(plan, TERMINAL, timeout=60)
        assert sig.status is not None
        assert sig.status.status is SignalState.ROLLED_BACK, sig.status.reason
        assert f"rolled back to {OLD}" in sig.status.reason
        assert "not running" in sig.status.reason
        assert await node.running_version() == OLD
        assert sha256_file(node.binary) == old.sha256
        await node.wait_until(uncordoned)
        assert node.states(plan)[-2:] == ["Verifying", "RolledBack"]
        assert node.latest is not None
        assert node.latest["metadata"]["annotations"][RUNNING_VERSION_KEY] == OLD


# -- drain: PodDisruptionBudgets -------------------------------------------------------------
@pytest.mark.parametrize("outcome", ["fail", "proceed"])
async def test_pdb_blocks_eviction(sim: Any, releases: ReleaseServer, wl1: KubeClient,
                                   wl1_namespace: str, outcome: str) -> None:
    ns = wl1_namespace
    await wl1.create(PDBS, {"metadata": {"name": "guard", "namespace": ns},
                            "spec": {"minAvailable": 1,
                                     "selector": {"matchLabels": {"app": "guarded"}}}}, ns)
    args = ["--drain-timeout", "2", "--drain-timeout-action", outcome]
    async with sim(agent_args=args) as node:
        await make_pod(wl1, ns, node.name, "guarded", labels={"app": "guarded"})
        await make_pod(wl1, ns, node.name, "free")
        plan = await node.request(releases.releases[NEW])
        sig = await node.wait_for(plan, TERMINAL, timeout=60)
        assert sig.status is not None
        assert await pod_names(wl1, node.name) == {"guarded"}  # the free pod was evicted
        if outcome == "fail":
            assert sig.status.status is SignalState.FAILED_DRAIN
            assert "did not finish within 2s" in sig.status.reason
            assert f"{ns}/guarded" in sig.status.reason
            assert sha256_file(node.binary) == releases.releases[OLD].sha256
            assert node.restarts == 0
        else:
            assert sig.status.status is SignalState.COMPLETED, sig.status.reason
            applying = [t for t in node.history if t.plan_id == plan
                        and t.state == "ApplyingUpdate"]
            assert "proceeding" in applying[0].reason and f"{ns}/guarded" in applying[0].reason
            assert await node.running_version() == NEW
        await node.wait_until(uncordoned)


async def test_request_policy_overrides_the_agents_drain_settings(
        sim: Any, releases: ReleaseServer, wl1: KubeClient, wl1_namespace: str) -> None:
    """The agent runs with outcome `fail`; a request whose policy says `proceed` (and a
    shorter drain timeout) completes despite the blocking budget, and the next request
    without a policy is back to the agent's own settings."""
    ns = wl1_namespace
    await wl1.create(PDBS, {"metadata": {"name": "guard", "namespace": ns},
                            "spec": {"minAvailable": 1,
                                     "selector": {"matchLabels": {"app": "guarded"}}}}, ns)
    args = ["--drain-timeout", "2", "--drain-timeout-action", "fail"]
    async with sim(agent_args=args) as node:
        await make_pod(wl1, ns, node.name, "guarded", labels={"app": "guarded"})
        plan = await node.request(releases.releases[NEW], policy=NodePolicy(
            drainTimeoutSeconds=1.0, drainTimeoutAction=DrainTimeoutAction.PROCEED))
        sig = await node.wait_for(plan, TERMINAL, timeout=30)
        assert sig.status is not None
        assert sig.status.status is SignalState.COMPLETED, sig.status.reason
        applying = [t for t in node.history if t.plan_id == plan
                    and t.state == "ApplyingUpdate"]
        assert "did not finish within 1s" in applying[0].reason
        assert "proceeding" in applying[0].reason and f"{ns}/guarded" in applying[0].reason
        assert await node.running_version() == NEW
        await node.wait_until(uncordoned)

        plan = await node.request(releases.releases[OLD])  # no policy: the agent's own
        sig = await node.wait_for(plan, TERMINAL, timeout=30)
        assert sig.status is not None
        assert sig.status.status is SignalState.FAILED_DRAIN, sig.status.reason
        assert "did not finish within 2s" in sig.status.reason
        assert await node.running_version() == NEW
        await node.wait_until(uncordoned)


async def test_cordon_made_by_someone_else_is_left_alone(sim: Any, wl1: KubeClient,
                                                        releases: ReleaseServer) -> None:
    async with sim() as node:
        await wl1.patch(NODES, node.name, {"spec": {"unschedulable": True}})
        plan = await node.request(releases.releases[NEW])
        sig = await node.wait_for(plan, TERMINAL, timeout=60)
        assert sig.status is not None and sig.status.status is SignalState.COMPLETED
        obj = await wl1.get(NODES, node.name)
        assert obj["spec"].get("unschedulable") is True


# -- requests that change under the agent ------------------------------------------------------
async def test_replaced_request_is_abandoned(sim: Any, releases: ReleaseServer) -> None:
    async with sim(agent_args=["--download-stall-timeout", "30"]) as node:
        first = await node.request(releases.releases[STALLS])
        await node.wait_for(first, {SignalState.DOWNLOADING}, timeout=30)
        second = await node.request(releases.releases[NEW])
        sig = await node.wait_for(second, TERMINAL, timeout=60)
        assert sig.status is not None and sig.status.status is SignalState.COMPLETED
        assert node.states(first) == ["Downloading"]  # never written to again
        assert node.states(second) == [str(s) for s in HAPPY_PATH]
        assert node.restarts == 1
        await wait_clean(node)


async def test_conflict_storm(sim: Any, wl1: KubeClient, releases: ReleaseServer,
                             tmp_path: Path) -> None:
    """Another writer patches each Node every 20-50 ms; no transition is lost.

    Three nodes upgrade at once, each under its own storm. An agent's write conflicts
    only when a storm write lands between its watch cache's last event and its patch (a
    few milliseconds on a quiet machine), so one round of three upgrades (about thirty
    agent writes) provokes none now and then (the fresh-clone CI once saw 0 in 70 storm
    writes). Rounds are repeated, each checked in full, until the storms have made the
    agents conflict; five rounds without one fail the test."""
    rounds: list[tuple[int, int]] = []  # per round: storm writes, agent conflicts

    async def one(round_: int, i: int,
                  results: list[tuple[str, list[str], int, int, str]]) -> None:
        writes = 0
        async with sim(agent_args=["--log-level", "DEBUG"],
                       root=tmp_path / f"r{round_}n{i}") as node:
            async def storm() -> None:
                nonlocal writes
                while True:
                    await wl1.patch(NODES, node.name, {"metadata": {"annotations": {
                        "example.com/heartbeat": str(writes)}}})
                    writes += 1
                    await anyio.sleep(random.uniform(0.02, 0.05))

            async with anyio.create_task_group() as tg:
                tg.start_soon(storm)
                with anyio.fail_after(20):
                    while writes < 10:
                        await anyio.sleep(0.05)
                plan = await node.request(releases.releases[NEW])
                sig = await node.wait_for(plan, TERMINAL, timeout=90)
                tg.cancel_scope.cancel()
            assert sig.status is not None
            results.append((str(sig.status.status), node.states(plan), node.restarts, writes,
                            node.log_text()))

    for round_ in range(5):
        results: list[tuple[str, list[str], int, int, str]] = []
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(one, round_, i, results)
        conflicts = 0
        for state, states, restarts, _, log in results:
            assert state == "Completed"
            assert states == [str(s) for s in HAPPY_PATH]  # every transition, once, in order
            assert restarts == 1
            conflicts += log.count("conflict patching")
        rounds.append((sum(r[3] for r in results), conflicts))
        if conflicts:
            break
    record_timing(f"agent_conflict_storm nodes=3 rounds={len(rounds)} "
                  f"storm_writes={sum(w for w, _ in rounds)} "
                  f"agent_conflicts={sum(c for _, c in rounds)}")
    assert rounds[-1][1] > 0, (
        f"the storms never made an agent conflict in {len(rounds)} rounds (storm writes, "
        f"conflicts: {rounds}): the test proves nothing")


# -- malformed and hostile requests ----------------------------------------------------------
def request_json(**update: Any) -> str:
    return json.dumps({"planId": unique("bad"), "created": "2026-11-30T10:00:00Z",
                       "command": {"id": 0, "k0supdate": update}})


GOOD = {"version": NEW, "sha256": "e" * 64}
REJECTED: list[tuple[str, str]] = [
    ("{not json", "not JSON"),
    (json.dumps([1, 2, 3]), "invalid"),
    (json.dumps({"planId": "x"}), "created"),
    (request_json(url="https://r.example/k0s", version="latest", sha256="e" * 64),
     "not a k0s version"),
    (request_json(url="javascript:alert(1)", **GOOD), "scheme"),
    (request_json(url="ftp://r.example/k0s", **GOOD), "scheme"),
    (request_json(url="https://r.example/k0s\r\nX-Evil: 1", **GOOD), "control characters"),
    (request_json(url="file://evil.example/k0s", **GOOD), "must not name a host"),
    (request_json(url="https://r.example/k0s", version=NEW, sha256="abc"), "64 hex"),
]
REFUSED: list[tuple[str, str]] = [
    (request_json(url="file:///etc/shadow", **GOOD), "outside the directories"),
    (request_json(url="file:///srv/releases/../../etc/shadow", **GOOD), "'..'"),
    (request_json(url="https://r.example/k0s", version=NEW), "no sha256"),
    (request_json(url="https://r.example/k0s", version=NEW, allowunverified=True),
     "refuses unverified"),
    (request_json(url="https://r.example/k0s", **GOOD), "not under any prefix"),
]


async def test_malformed_and_hostile_requests(sim: Any, wl1: KubeClient,
                                              releases: ReleaseServer) -> None:
    """Each gets one clear answer; the agent never crashes, loops or touches the binary."""
    async with sim(agent_args=["--file-url-root", "/srv/releases"]) as node:
        before = sha256_file(node.binary)
        for raw, needle in REJECTED:
            await node.request(raw=raw)
            await node.wait_until(lambda o, raw=raw: _rejected(o, raw), timeout=20)
            assert needle in json.loads(_ann(node.latest)[
                SIGNAL_REJECTED_KEY])["reason"]
        await wl1.patch(NODES, node.name, {"metadata": {"annotations": {
            SIGNAL_VERSION_KEY: "v9", SIGNAL_DATA_KEY: request_json(url="https://x/k0s",
                                                                    **GOOD)}}})
        await node.wait_until(lambda o: "unsupported" in _ann(o).get(
            SIGNAL_REJECTED_KEY, ""), timeout=20)
        for raw, needle in REFUSED:
            plan = json.loads(raw)["planId"]
            await node.request(raw=raw)
            sig = await node.wait_for(plan, TERMINAL, timeout=20)
            assert sig.status is not None
            assert sig.status.status is SignalState.INVALID_REQUEST
            assert needle in sig.status.reason
            assert node.states(plan) == ["InvalidRequest"]
        # still the same healthy process, and it still upgrades
        assert node.agent is not None and node.agent.returncode is None
        assert node.agent_runs == 1
        assert "Traceback" not in node.log_text()
        assert sha256_file(node.binary) == before and node.restarts == 0
        plan = await node.request(releases.releases[NEW])
        sig = await node.wait_for(plan, TERMINAL, timeout=60)
        assert sig.status is not None and sig.status.status is SignalState.COMPLETED


def _ann(obj: KubeObject | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("annotations") or {})


def _rejected(obj: KubeObject, raw: str) -> bool:
    ann = _ann(obj)
    if ann.get(SIGNAL_DATA_KEY) != raw or SIGNAL_REJECTED_KEY not in ann:
        return False
    return bool(json.loads(ann[SIGNAL_REJECTED_KEY])["digest"] == signal_digest(raw))


async def test_urls_outside_the_allowed_prefixes_are_refused_untouched(
        sim: Any, releases: ReleaseServer) -> None:
    """The agent accepts only URLs under the prefixes it was installed with (SimNode: the
    release server's /k0s/). The same bytes by another name, a path outside the prefix, or
    user information that moves the host: refused before any download, binary untouched;
    the request the controller would show says why. The release URL itself works."""
    new = releases.releases[NEW]
    base = releases.base_url  # http://127.0.0.1:<port>
    port = base.rsplit(":", 1)[1]
    outside = [
        new.url.replace("127.0.0.1", "localhost"),  # the same server, another host name
        f"{base}/k0s-mirror/{NEW}",
        f"{base}/k0s/../k0s/{NEW}",
        f"http://127.0.0.1:{port}@localhost:{port}/k0s/{NEW}",
        new.url.replace("http://", "https://"),
    ]
    async with sim() as node:
        before = sha256_file(node.binary)
        fetched = releases.requests[NEW]
        for url in outside:
            plan = await node.request(new, url=url)
            sig = await node.wait_for(plan, TERMINAL, timeout=30)
            assert sig.status is not None
            assert sig.status.status is SignalState.INVALID_REQUEST, (url, sig.status)
            assert "not under any prefix" in sig.status.reason and url in sig.status.reason
            assert node.states(plan) == ["InvalidRequest"]
        assert releases.requests[NEW] == fetched  # nothing was downloaded
        assert sha256_file(node.binary) == before and node.restarts == 0
        assert not list(node.binary.parent.glob(".k0s.fleet-*"))
        plan = await node.request(new)
        sig = await node.wait_for(plan, TERMINAL, timeout=60)
        assert sig.status is not None and sig.status.status is SignalState.COMPLETED, \
            sig.status.reason
