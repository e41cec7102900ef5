"""The controller on real API servers: management (mgmt) + workload clusters (wl1, wl2).

The node side is a scripted responder playing the agent's protocol
(fleet.testing.responder); the real agent is exercised in test_controller_e2e.py. An
independent watcher checks the invariants at every event it observes.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from typing import Any

import anyio
import anyio.abc
import pytest
import yaml
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fleet.config.models import FleetConfig
from fleet.contract.nodeplan import NodePlanPhase
from fleet.contract.signal import RUNNING_VERSION_KEY, SignalState
from fleet.events import list_events
from fleet.kube import KubeClient, KubeObject
from fleet.kube.resources import (
    CONTROL_NODES,
    K0S_CONTROL_PLANES,
    LEASES,
    MACHINE_DEPLOYMENTS,
    MACHINES,
    NODE_PLANS,
    NODES,
)
from fleet.kube.watch import Reflector, WatchEvent
from fleet.planner import conditions as C
from fleet.testing.binaries import REPO_ROOT
from fleet.testing.capi import (
    annotate,
    bump,
    create_cluster,
    ensure_infra_crd,
    set_node_ready,
)
from fleet.testing.responder import AutopilotResponder, Behaviour, NodeResponder
from fleet.testing.world import World, free_port
from fleet.world.model import ANN_RETRY
from tests.helpers.controller import (
    PROVIDER,
    V1,
    V2,
    InvariantWatcher,
    fleet_config,
    fleet_config_dict,
    machine_versions,
    running_controller,
    wait_condition,
    wait_rollout,
)
from tests.helpers.names import unique


@pytest.fixture(scope="module")
async def infra_crd(mgmt: KubeClient) -> None:
    await ensure_infra_crd(mgmt)


# -- the independent invariant watcher -----------------------------------------------------



SPANS = InMemorySpanExporter()
PROVIDER.add_span_processor(SimpleSpanProcessor(SPANS))










def _node_upgrade_spans(plans: list[KubeObject]) -> list[Any]:
    """The controller's finished node-upgrade spans in these NodePlans' traces."""
    trace_ids = {p["metadata"]["annotations"]["tracing.k8s.io/traceparent"].split("-")[1]
                 for p in plans}
    return [s for s in SPANS.get_finished_spans() if s.name == "node-upgrade"
            and f"{s.context.trace_id:032x}" in trace_ids]


def cond(obj: KubeObject, ctype: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == ctype)


# -- tests -----------------------------------------------------------------------------------

@pytest.mark.anyio
@pytest.mark.parametrize(("max_unavailable", "limit"), [(2, 2), ("50%", 3)])
async def test_machine_deployment_rollout(  # noqa: PLR0917 - fixtures
        mgmt: KubeClient, wl1: KubeClient, crds_installed: World, infra_crd: None,
        namespace: str, max_unavailable: int | str, limit: int) -> None:
    name = unique("md")
    fc = await create_cluster(mgmt, wl1, crds_installed["wl1"].kubeconfig(), namespace=namespace,
                              name=name, control_planes=0, workers=6,
                              max_unavailable=max_unavailable)
    watcher = InvariantWatcher(fc, max_unavailable=limit)
    responder = NodeResponder(wl1, step_seconds=0.02, only=lambda n: n in fc.machines)
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run, mgmt, wl1)
        await tg.start(responder.run)
        async with running_controller(mgmt, fleet_config(namespace)):
            await wait_rollout(mgmt, fc, timeout=15, target=V1)  # nothing to do yet
            await bump(mgmt, fc, V2)
            await wait_condition(mgmt, MACHINE_DEPLOYMENTS, fc.md, namespace,  # type: ignore[arg-type]
                                 C.UP_TO_DATE, "False", timeout=10)
            await wait_rollout(mgmt, fc)
            # The MD can read up to date (from what the nodes report) a moment before the
            # last NodePlan's Completed write and its span: wait for those too.
            with anyio.fail_after(30):
                while len(_node_upgrade_spans(
                        (await mgmt.list(NODE_PLANS, namespace)).items)) < 6:
                    await anyio.sleep(0.1)
        tg.cancel_scope.cancel()
    assert watcher.violations == [], watcher.violations[:5]
    assert watcher.max_seen_unavailable == limit  # the budget was used, never exceeded
    assert set((await machine_versions(mgmt, fc)).values()) == {V2}
    assert all(len(r) == 1 for r in responder.requests.values())  # one request per node
    md = await mgmt.get(MACHINE_DEPLOYMENTS, fc.md, namespace)  # type: ignore[arg-type]
    assert cond(md, C.UP_TO_DATE)["message"].startswith(f"6/6 machines on {V2}")
    plans = (await mgmt.list(NODE_PLANS, namespace)).items
    assert len(plans) == 6
    assert {p["status"]["phase"] for p in plans} == {NodePlanPhase.COMPLETED}
    traceparents = {p["metadata"]["annotations"]["tracing.k8s.io/traceparent"] for p in plans}
    assert len(traceparents) == 6  # one trace per node upgrade
    done = _node_upgrade_spans(plans)
    assert len(done) == 6
    assert all((s.attributes or {}).get("k0s_fleet.outcome") == "Completed" for s in done)
    reasons = {e["reason"] for e in await list_events(mgmt, namespace)}
    # no Event per node upgrade: its NodePlan's status records its dispatch and success
    assert "NodeUpgraded" not in reasons and "NodeUpgradeDispatched" not in reasons
    assert all(p["status"].get("completedAt") and p["status"].get("startedAt")
               for p in plans)


@pytest.mark.anyio
async def test_control_planes_wait_for_a_not_ready_peer_then_go_one_by_one_before_workers(
        mgmt: KubeClient, wl2: KubeClient, crds_installed: World, infra_crd: None,
        namespace: str) -> None:
    name = unique("kcp")
    fc = await create_cluster(mgmt, wl2, crds_installed["wl2"].kubeconfig(), namespace=namespace,
                              name=name, control_planes=3, workers=2, max_unavailable=1)
    watcher = InvariantWatcher(fc, max_unavailable=1, cp_target=V2)
    responder = NodeResponder(wl2, step_seconds=0.02, only=lambda n: n in fc.machines)
    peer = fc.control_planes[2]
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run, mgmt, wl2)
        await tg.start(responder.run)
        await set_node_ready(wl2, peer, False)
        async with running_controller(mgmt, fleet_config(namespace)):
            await bump(mgmt, fc, V2)
            kcp = await wait_condition(mgmt, K0S_CONTROL_PLANES, fc.kcp, namespace,  # type: ignore[arg-type]
                                       C.UP_TO_DATE, "False", timeout=10)
            with anyio.fail_after(10):
                while f"{peer} NotReady" not in cond(kcp, C.UP_TO_DATE)["message"]:
                    kcp = await mgmt.get(K0S_CONTROL_PLANES, fc.kcp, namespace)  # type: ignore[arg-type]
                    await anyio.sleep(0.05)
            await anyio.sleep(0.5)  # give it every chance to misbehave
            assert (await mgmt.list(NODE_PLANS, namespace)).items == []
            await set_node_ready(wl2, peer, True)
            await wait_rollout(mgmt, fc)
        tg.cancel_scope.cancel()
    assert watcher.violations == [], watcher.violations[:5]
    assert watcher.max_seen_cp == 1
    order = [s.node for s in responder.steps if s.state == SignalState.DOWNLOADING]
    # Oldest first (creationTimestamp, then name: Machines created in one second tie),
    # control planes before workers.
    age = {m["metadata"]["name"]: (m["metadata"]["creationTimestamp"], m["metadata"]["name"])
           for m in (await mgmt.list(MACHINES, namespace)).items}
    assert order == [*sorted(fc.control_planes, key=age.__getitem__),
                     *sorted(fc.workers, key=age.__getitem__)]
    versions = await machine_versions(mgmt, fc)
    assert {versions[c] for c in fc.control_planes} == {V2}


@pytest.mark.anyio
async def test_non_version_change_is_left_to_cluster_api(
        mgmt: KubeClient, wl1: KubeClient, crds_installed: World, infra_crd: None,
        namespace: str) -> None:
    name = unique("niv")
    fc = await create_cluster(mgmt, wl1, crds_installed["wl1"].kubeconfig(), namespace=namespace,
                              name=name, control_planes=1, workers=2, max_unavailable=1)
    # A new infrastructure template and a new version at once: not "only the version".
    await mgmt.patch(MACHINE_DEPLOYMENTS, fc.md, {"spec": {"template": {"spec": {  # type: ignore[arg-type]
        "version": V2, "infrastructureRef": {"name": f"{name}-w-v2"}}}}}, namespace)
    await mgmt.patch(K0S_CONTROL_PLANES, fc.kcp, {"spec": {  # type: ignore[arg-type]
        "version": V2, "k0sConfigSpec": {"args": ["--debug"]}}}, namespace)
    async with running_controller(mgmt, fleet_config(namespace)):
        md = await wait_condition(mgmt, MACHINE_DEPLOYMENTS, fc.md, namespace, C.IN_PLACE,  # type: ignore[arg-type]
                                  "False")
        kcp = await wait_condition(mgmt, K0S_CONTROL_PLANES, fc.kcp, namespace, C.IN_PLACE,  # type: ignore[arg-type]
                                   "False")
        await anyio.sleep(0.5)
    assert cond(md, C.IN_PLACE)["reason"] == C.R_NOT_IN_PLACE
    assert "infrastructure template changed" in cond(md, C.IN_PLACE)["message"]
    assert "k0sConfigSpec changed (args)" in cond(kcp, C.IN_PLACE)["message"]
    assert (await mgmt.list(NODE_PLANS, namespace)).items == []
    events = await list_events(mgmt, namespace)
    assert {e["regarding"]["name"] for e in events if e["reason"] == C.R_NOT_IN_PLACE} == {
        fc.md, fc.kcp}


@pytest.mark.anyio
async def test_max_unavailable_zero_is_reported(
        mgmt: KubeClient, wl1: KubeClient, crds_installed: World, infra_crd: None,
        namespace: str) -> None:
    fc = await create_cluster(mgmt, wl1, crds_installed["wl1"].kubeconfig(), namespace=namespace,
                              name=unique("mu0"), control_planes=0, workers=2, max_unavailable=0,
                              max_surge=1)  # both 0 would mean 1, as Cluster API resolves it
    await bump(mgmt, fc, V2)
    async with running_controller(mgmt, fleet_config(namespace)):
        md = await wait_condition(mgmt, MACHINE_DEPLOYMENTS, fc.md, namespace, C.IN_PLACE,  # type: ignore[arg-type]
                                  "False")
    assert cond(md, C.IN_PLACE)["reason"] == C.R_MAX_UNAVAILABLE_ZERO
    assert (await mgmt.list(NODE_PLANS, namespace)).items == []


@pytest.mark.anyio
async def test_silent_node_fails_its_deadline_halts_and_retry_resumes(
        mgmt: KubeClient, wl2: KubeClient, crds_installed: World, infra_crd: None,
        namespace: str) -> None:
    fc = await create_cluster(mgmt, wl2, crds_installed["wl2"].kubeconfig(), namespace=namespace,
                              name=unique("dl"), control_planes=0, workers=3, max_unavailable=1)
    # Every worker is silent at first: whichever the planner starts with (oldest first;
    # Machines created in the same second tie) misses its deadline.
    responder = NodeResponder(wl2, step_seconds=0.02, only=lambda n: n in fc.machines,
                              behaviours={w: Behaviour(silent=True) for w in fc.workers})
    async with anyio.create_task_group() as tg:
        await tg.start(responder.run)
        async with running_controller(mgmt, fleet_config(namespace)):
            await bump(mgmt, fc, V2)
            md = await wait_condition(mgmt, MACHINE_DEPLOYMENTS, fc.md, namespace,  # type: ignore[arg-type]
                                      C.HALTED, timeout=20)
            [plan] = (await mgmt.list(NODE_PLANS, namespace)).items
            silent = plan["spec"]["machineName"]
            assert silent in fc.workers
            assert plan["status"]["phase"] == NodePlanPhase.FAILED
            assert "no progress in Pending" in plan["status"]["message"]
            failed = cond(plan, "Failed")
            assert (failed["status"], failed["reason"]) == ("True", C.R_DEADLINE)
            assert "failure budget" in cond(md, C.HALTED)["message"]
            await anyio.sleep(0.5)
            assert len((await mgmt.list(NODE_PLANS, namespace)).items) == 1  # halted
            # The operator fixes the node and asks for a retry on the MachineDeployment.
            for w in fc.workers:
                responder.behave(w, Behaviour())
            await annotate(mgmt, MACHINE_DEPLOYMENTS, fc.md, namespace, {ANN_RETRY: "1"})  # type: ignore[arg-type]
            await wait_rollout(mgmt, fc)
        tg.cancel_scope.cancel()
    plans = {p["spec"]["machineName"]: p for p in (await mgmt.list(NODE_PLANS, namespace)).items}
    assert plans[silent]["status"]["attempts"] == 2
    assert plans[silent]["status"]["phase"] == NodePlanPhase.COMPLETED
    md = await mgmt.get(MACHINE_DEPLOYMENTS, fc.md, namespace)  # type: ignore[arg-type]
    assert ANN_RETRY not in (md["metadata"].get("annotations") or {})
    reasons = [e["reason"] for e in await list_events(mgmt, namespace)]
    assert "NodeUpgradeFailed" in reasons and "RolloutHalted" in reasons


@pytest.mark.anyio
async def test_deleting_a_nodeplan_never_leaves_its_node_cordoned(
        mgmt: KubeClient, wl1: KubeClient, crds_installed: World, infra_crd: None,
        namespace: str) -> None:
    """Delete a NodePlan whose node is cordoned mid-upgrade (the node side is stuck): the
    request is taken off the node and the node uncordoned before the NodePlan goes; the
    Machine, still out of date, is then dispatched afresh and completes."""
    fc = await create_cluster(mgmt, wl1, crds_installed["wl1"].kubeconfig(), namespace=namespace,
                              name=unique("del"), control_planes=0, workers=1, max_unavailable=1)
    node = fc.workers[0]
    responder = NodeResponder(wl1, step_seconds=0.02, only=lambda n: n in fc.machines,
                              behaviours={node: Behaviour(stall_at=SignalState.APPLYING_UPDATE)})
    seen: list[tuple[bool, str | None]] = []  # every version of the Node: (cordoned, plan)

    async def record(ev: WatchEvent) -> None:
        ann = ev.object["metadata"].get("annotations") or {}
        raw = ann.get("fleet.k0s-fleet.io/signal-data")
        seen.append((bool(ev.object["spec"].get("unschedulable")),
                     json.loads(raw)["planId"] if raw else None))

    nodes = Reflector(wl1, NODES, field_selector=f"metadata.name={node}", listener=record)
    async with anyio.create_task_group() as tg:
        tg.start_soon(nodes.run)
        await tg.start(responder.run)
        async with running_controller(mgmt, fleet_config(namespace)):
            await bump(mgmt, fc, V2)
            with anyio.fail_after(10):
                while not (await wl1.get(NODES, node))["spec"].get("unschedulable"):
                    await anyio.sleep(0.02)
            [plan] = (await mgmt.list(NODE_PLANS, namespace)).items
            responder.behave(node, Behaviour())  # the next request will be answered
            mark = len(seen)
            await mgmt.delete(NODE_PLANS, plan["metadata"]["name"], namespace)
            await wait_rollout(mgmt, fc)
            # The MD reads up to date from what the node reports, which can come a moment
            # before the new NodePlan's Completed write: wait for that write too.
            with anyio.fail_after(30):
                while not any(p["metadata"]["uid"] != plan["metadata"]["uid"]
                              and (p.get("status") or {}).get("phase") == NodePlanPhase.COMPLETED
                              for p in (await mgmt.list(NODE_PLANS, namespace)).items):
                    await anyio.sleep(0.1)
        tg.cancel_scope.cancel()
    after = seen[mark:]
    # Request taken off, then the node uncordoned, before any new request arrives: the
    # Node passes through "no request, not cordoned".
    first_clear = next(i for i, (_c, plan_id) in enumerate(after) if plan_id is None)
    assert (False, None) in after[first_clear:], after
    free = after.index((False, None), first_clear)
    assert all(p is None for _c, p in after[first_clear:free]), after
    assert not after[-1][0]
    [new_plan] = (await mgmt.list(NODE_PLANS, namespace)).items
    assert new_plan["metadata"]["uid"] != plan["metadata"]["uid"]
    assert new_plan["status"]["phase"] == NodePlanPhase.COMPLETED


# The README's suite runs one seed; `make stress-restarts` runs 40 x 5 restarts. Before
# fleet.controllers.trigger.Trigger's wait became a checkpoint, a cancelled controller could
# plan on instead of stopping: such a run hung in 3 of 4 tries.
_RESTART_SEEDS = [int(s) for s in os.environ.get("K0S_FLEET_RESTART_SEEDS", "4").split(",")]
_RESTART_CYCLES = int(os.environ.get("K0S_FLEET_RESTART_CYCLES", "3"))


@pytest.mark.anyio
@pytest.mark.parametrize("seed", _RESTART_SEEDS)
async def test_controller_killed_and_restarted_mid_rollout(  # noqa: PLR0917 - fixtures
        mgmt: KubeClient, wl2: KubeClient, crds_installed: World, infra_crd: None,
        namespace: str, seed: int) -> None:
    """Cancel the controller task at random moments mid-rollout and start a fresh one
    (new caches, new everything); the watcher checks the rules at every event. Each
    cancelled controller must stop: ``running_controller`` waits for it."""
    fc = await create_cluster(mgmt, wl2, crds_installed["wl2"].kubeconfig(), namespace=namespace,
                              name=unique("rs"), control_planes=3, workers=6, max_unavailable=2)
    watcher = InvariantWatcher(fc, max_unavailable=2, cp_target=V2)
    responder = NodeResponder(wl2, step_seconds=0.03, only=lambda n: n in fc.machines)
    config = fleet_config(namespace)
    rnd = random.Random(seed)
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run, mgmt, wl2)
        await tg.start(responder.run)
        await bump(mgmt, fc, V2)
        for _ in range(_RESTART_CYCLES):
            async with running_controller(mgmt, config):
                await anyio.sleep(rnd.uniform(0.3, 1.2))
            # killed: a moment with no controller at all
            await anyio.sleep(rnd.uniform(0.0, 0.3))
        async with running_controller(mgmt, config):
            await wait_rollout(mgmt, fc, timeout=120)
        tg.cancel_scope.cancel()
    assert watcher.violations == [], watcher.violations[:5]
    assert set((await machine_versions(mgmt, fc)).values()) == {V2}
    # no node was ever asked twice: one request per node, one NodePlan per machine
    assert {n: len(r) for n, r in watcher.requests.items()} == dict.fromkeys(fc.machines, 1)
    assert all(len(u) == 1 for u in watcher.plan_uids.values())
    assert len(watcher.plan_uids) == len(fc.machines)


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, default=str)


@pytest.mark.anyio
async def test_controller_process_killed_and_replaced_mid_rollout(  # noqa: PLR0917 - fixtures
        mgmt: KubeClient, wl1: KubeClient, crds_installed: World, infra_crd: None,
        namespace: str, tmp_path: Any) -> None:
    """`k0s-fleet controller` processes with leader election: SIGKILL the leader mid-rollout;
    a second instance waits out the Lease, takes over and finishes, breaking no rule."""
    fc = await create_cluster(mgmt, wl1, crds_installed["wl1"].kubeconfig(), namespace=namespace,
                              name=unique("pk"), control_planes=1, workers=5, max_unavailable=2)
    watcher = InvariantWatcher(fc, max_unavailable=2, cp_target=V2)
    responder = NodeResponder(wl1, step_seconds=0.15, only=lambda n: n in fc.machines)
    config = tmp_path / "fleet.yaml"
    # its own status port: the default 8080 is taken by any other controller on the machine
    config.write_text(yaml.safe_dump({**fleet_config_dict(namespace),
                                      "status": {"port": free_port()}}))
    kubeconfig = crds_installed["mgmt"].write_kubeconfig(tmp_path / "mgmt.yaml")

    async def controller(identity: str) -> anyio.abc.Process:
        with (tmp_path / f"{identity}.log").open("wb") as log:
            return await anyio.open_process(
                [sys.executable, "-m", "fleet.cli", "controller", "--config", str(config),
                 "--kubeconfig", str(kubeconfig), "--identity", identity,
                 # Each renewal is cut off at 2/3 of the lease: 2 s leases (1.3 s per
                 # GET+PUT) are lost on this loaded 2-core machine; 6 s are not.
                 "--lease-seconds", "6", "--log-level", "DEBUG"],
                stdout=subprocess.DEVNULL, stderr=log, cwd=str(REPO_ROOT),
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})

    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run, mgmt, wl1)
        await tg.start(responder.run)
        first = await controller("first")
        try:
            await bump(mgmt, fc, V2)
            with anyio.fail_after(60):  # mid-rollout: workers are being upgraded
                while not any(responder.requests.get(w) for w in fc.workers):
                    assert first.returncode is None, (tmp_path / "first.log").read_text()[-3000:]
                    await anyio.sleep(0.02)
            first.kill()  # SIGKILL: no release of the Lease, nothing cleaned up
            await first.wait()
            second = await controller("second")
            try:
                try:
                    await wait_rollout(mgmt, fc, timeout=120)
                except TimeoutError:
                    plans = [(p["metadata"]["name"], p.get("status"))
                             for p in (await mgmt.list(NODE_PLANS, namespace)).items]
                    raise AssertionError(
                        f"rollout not finished; NodePlans: {_dump(plans)[-4000:]}\n"
                        f"second.log: {(tmp_path / 'second.log').read_text()[-4000:]}"
                    ) from None
            finally:
                second.terminate()
                with anyio.fail_after(20):
                    assert await second.wait() == 0  # a clean stop on SIGTERM
        finally:
            if first.returncode is None:
                first.kill()
        tg.cancel_scope.cancel()
    assert watcher.violations == [], watcher.violations[:5]
    assert {n: len(r) for n, r in watcher.requests.items()} == dict.fromkeys(fc.machines, 1), (
        watcher.requests, (tmp_path / "first.log").read_text()[-3000:],
        (tmp_path / "second.log").read_text()[:3000])
    assert all(len(u) == 1 for u in watcher.plan_uids.values())
    lease = await mgmt.get(LEASES, "k0s-fleet-controller", namespace)
    assert lease["spec"].get("holderIdentity") in (None, "")  # released on SIGTERM
    assert lease["spec"]["leaseTransitions"] >= 1


@pytest.mark.anyio
async def test_pure_controller_is_signalled_on_its_control_node(
        mgmt: KubeClient, wl1: KubeClient, crds_installed: World, infra_crd: None,
        namespace: str) -> None:
    """A k0s controller without a kubelet has no Node: its request goes on its autopilot
    ControlNode (named after the Machine, AUTOPILOT_HOSTNAME)."""
    fc = await create_cluster(mgmt, wl1, crds_installed["wl1"].kubeconfig(), namespace=namespace,
                              name=unique("pc"), control_planes=1, workers=0,
                              create_nodes=False)
    [cp] = fc.control_planes
    await wl1.create(CONTROL_NODES, {"metadata": {"name": cp, "annotations": {
        RUNNING_VERSION_KEY: V1}}})
    responder = NodeResponder(wl1, step_seconds=0.02, resource=CONTROL_NODES,
                              only=lambda n: n == cp)
    async with anyio.create_task_group() as tg:
        await tg.start(responder.run)
        async with running_controller(mgmt, fleet_config(namespace)):
            await bump(mgmt, fc, V2)
            await wait_rollout(mgmt, fc)
        tg.cancel_scope.cancel()
    assert (await machine_versions(mgmt, fc))[cp] == V2
    assert [s.state for s in responder.steps][-1] == SignalState.COMPLETED
    control_node = await wl1.get(CONTROL_NODES, cp)
    assert "fleet.k0s-fleet.io/signal-data" in control_node["metadata"]["annotations"]
    await wl1.delete(CONTROL_NODES, cp)


@pytest.mark.anyio
async def test_autopilot_executor_drives_stock_k0s_nodes(
        mgmt: KubeClient, wl2: KubeClient, crds_installed: World, infra_crd: None,
        namespace: str) -> None:
    """Executor `autopilot`: autopilot's own signal keys, states read back as they come."""
    name = unique("ap")
    fc = await create_cluster(mgmt, wl2, crds_installed["wl2"].kubeconfig(), namespace=namespace,
                              name=name, control_planes=0, workers=2, max_unavailable=1)
    config = FleetConfig.model_validate({**fleet_config_dict(namespace), "clusters": {
        "namespaces": [namespace],
        "entries": [{"name": name, "namespace": namespace, "executor": "autopilot"}]}})
    responder = AutopilotResponder(wl2, step_seconds=0.02, only=lambda n: n in fc.machines)
    async with anyio.create_task_group() as tg:
        await tg.start(responder.run)
        async with running_controller(mgmt, config):
            await bump(mgmt, fc, V2)
            await wait_rollout(mgmt, fc)
        tg.cancel_scope.cancel()
    for w in fc.workers:
        ann = (await wl2.get(NODES, w))["metadata"]["annotations"]
        assert "fleet.k0s-fleet.io/signal-data" not in ann  # stock autopilot keys only
        data = json.loads(ann["k0sproject.io/autopilot-signal-data"])
        assert data["status"]["status"] == "Completed"
        assert data["command"]["k0supdate"]["version"] == V2
    plans = (await mgmt.list(NODE_PLANS, namespace)).items
    assert {p["spec"]["executor"] for p in plans} == {"autopilot"}
    assert {p["status"]["phase"] for p in plans} == {NodePlanPhase.COMPLETED}
    downloads = [s.node for s in responder.steps if s.state == "Downloading"]
    assert downloads == fc.workers  # one at a time (maxUnavailable 1), oldest first
