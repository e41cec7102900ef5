"""k0s's version skew policy on the FleetUpgrade path, on real API servers: a version two
minors ahead is climbed one minor at a time (the ladder), and one that cannot be climbed
(a missing rung) or is a downgrade is refused before anything is written, with a condition,
a per-cluster status, a Warning Event and a non-zero `k0s-fleet upgrade` exit. An
independent watcher checks the skew rules at every Machine event."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from fleet.cli.common import Exit
from fleet.cli.upgrade import apply_upgrade, follow
from fleet.config import FleetConfig
from fleet.events import list_events
from fleet.kube import KubeClient
from fleet.kube.resources import (
    FLEET_UPGRADES,
    K0S_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINES,
    NODE_PLANS,
)
from fleet.model import ANN_WRITTEN_VERSION
from fleet.testing.capi import ensure_infra_crd
from fleet.testing.k0smotron import K0smotronStandIn
from fleet.testing.responder import NodeResponder
from fleet.testing.world import World
from tests.helpers.capienv import wait_for
from tests.helpers.controller import intent_config, policy_controller, small_cluster

V1 = "v1.31.2+k0s.0"
pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
async def infra_crd(mgmt: KubeClient) -> None:
    await ensure_infra_crd(mgmt)


class _Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, s: str) -> None:
        self.lines.append(s)

    def flush(self) -> None:
        pass


def _minor(v: str) -> int:
    return int(v.removeprefix("v").split(".")[1])


class SkewWatcher:
    """Watches every Machine of one cluster and records each moment the skew rules are
    broken: control planes more than one minor apart, a worker newer than the oldest
    control plane or more than one minor older, a Machine moving down or by two minors."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self.versions: dict[str, tuple[str, str]] = {}  # name -> (role, version)
        self.violations: list[str] = []
        self.events = 0

    def observe(self, m: dict[str, Any]) -> None:
        spec = m.get("spec") or {}
        if spec.get("clusterName") != self.cluster or not spec.get("version"):
            return
        self.events += 1
        labels = (m.get("metadata") or {}).get("labels") or {}
        role = "cp" if "cluster.x-k8s.io/control-plane" in labels else "worker"
        name, version = m["metadata"]["name"], spec["version"]
        before = self.versions.get(name)
        if before is not None and (_minor(version) < _minor(before[1])
                                   or _minor(version) - _minor(before[1]) > 1):
            self.violations.append(f"{name}: {before[1]} -> {version}")
        self.versions[name] = (role, version)
        cps = [_minor(v) for r, v in self.versions.values() if r == "cp"]
        ws = [_minor(v) for r, v in self.versions.values() if r == "worker"]
        if cps and max(cps) - min(cps) > 1:
            self.violations.append(f"control planes apart: {sorted(self.versions.items())}")
        if cps and ws and (max(ws) > min(cps) or min(cps) - min(ws) > 1):
            self.violations.append(f"worker skew: {sorted(self.versions.items())}")

    async def run(self, mgmt: KubeClient, namespace: str, *,
                  task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        started = False
        while True:
            for m in (await mgmt.list(MACHINES, namespace)).items:
                self.observe(m)
            if not started:
                task_status.started()
                started = True
            await anyio.sleep(0.05)


@pytest.mark.parametrize(("version", "rule"), [("v1.33.0+k0s.0", "MissingRung"),
                                               ("v1.30.9+k0s.0", "NoDowngrade")])
async def test_an_upgrade_k0s_does_not_support_is_refused_before_any_write(  # noqa: PLR0917
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None, namespace: str,
        version: str, rule: str) -> None:
    fc = await small_cluster(mgmt, wl1, world, namespace, prefix="skew", control_planes=1,
                             workers=1)
    assert fc.kcp is not None and fc.md is not None
    name = f"to-{rule.lower()}"
    obj = await apply_upgrade(mgmt, namespace=namespace, name=name, version=version,
                              selector=None)
    async with policy_controller(mgmt, intent_config(namespace)):
        out = _Lines()
        with anyio.fail_after(60):
            rc = await follow(mgmt, namespace=namespace, name=name,
                              generation=obj["metadata"]["generation"], out=out, poll=0.1)
        assert rc == Exit.FAILED
        assert rule in out.lines[-1] and "version skew" in out.lines[-1], out.lines

        async def event() -> bool:
            return any(e.get("reason") == rule and e.get("type") == "Warning"
                       and (e.get("regarding") or {}).get("name") == name
                       for e in await list_events(mgmt, namespace))

        await wait_for("the Warning Event", event, 30, 0.05)
    st = (await mgmt.get(FLEET_UPGRADES, name, namespace))["status"]
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Refused"]["status"] == "True" and conds["Refused"]["reason"] == rule
    [entry] = st["clusters"]
    assert entry["phase"] == "Refused" and entry["refusedBy"] == rule
    # Nothing was written: no NodePlan, the versions as they were.
    assert (await mgmt.list(NODE_PLANS, namespace)).items == []
    kcp = await mgmt.get(K0S_CONTROL_PLANES, fc.kcp, namespace)
    md = await mgmt.get(MACHINE_DEPLOYMENTS, fc.md, namespace)
    assert kcp["spec"]["version"] == V1
    assert md["spec"]["template"]["spec"]["version"] == V1
    for o in (kcp, md):
        assert (o["metadata"].get("annotations") or {}).get(ANN_WRITTEN_VERSION) in (None, V1)


async def test_a_fleet_upgrade_two_minors_ahead_climbs_one_minor_at_a_time(
        world: World, mgmt: KubeClient, wl1: KubeClient, infra_crd: None,
        namespace: str) -> None:
    fc = await small_cluster(mgmt, wl1, world, namespace, prefix="ladder", control_planes=1,
                             workers=2)
    base = intent_config(namespace).model_dump(mode="json", by_alias=True)
    base["download"]["releases"] = ["v1.32.0+k0s.0", "v1.32.5+k0s.0", "v1.34.0+k0s.0"]
    cfg = FleetConfig.model_validate(base)
    target = "v1.33.1+k0s.0"
    watcher = SkewWatcher(fc.name)
    standin = K0smotronStandIn(mgmt, namespace)
    responder = NodeResponder(wl1, step_seconds=0.1, only=lambda n: n in fc.machines)
    obj = await apply_upgrade(mgmt, namespace=namespace, name="ladder", version=target,
                              selector=None)
    rungs_seen: set[str] = set()
    async with anyio.create_task_group() as tg:
        await tg.start(watcher.run, mgmt, namespace)
        await tg.start(standin.run)
        await tg.start(responder.run)
        async with policy_controller(mgmt, cfg):
            async def on_the_rung() -> bool:
                st = (await mgmt.get(FLEET_UPGRADES, "ladder", namespace)).get("status") or {}
                for c in st.get("clusters") or []:
                    if c.get("rung"):
                        rungs_seen.add(c["rung"])
                return "v1.32.5+k0s.0" in rungs_seen

            await wait_for("the first rung in the status", on_the_rung, 60, 0.05)
            out = _Lines()
            with anyio.fail_after(240):
                rc = await follow(mgmt, namespace=namespace, name="ladder",
                                  generation=obj["metadata"]["generation"], out=out, poll=0.2)
            assert rc == Exit.OK, out.lines
        tg.cancel_scope.cancel()
    for m in (await mgmt.list(MACHINES, namespace)).items:
        watcher.observe(m)
    assert watcher.violations == [], watcher.violations[:5]
    assert {v for _, v in watcher.versions.values()} == {target}
    plans = [p for p in (await mgmt.list(NODE_PLANS, namespace)).items
             if p["spec"]["clusterName"] == fc.name]
    # every node went through the rung, then the target: two NodePlans each
    assert sorted(p["spec"]["version"] for p in plans) == sorted(
        ["v1.32.5+k0s.0"] * len(fc.machines) + [target] * len(fc.machines))
