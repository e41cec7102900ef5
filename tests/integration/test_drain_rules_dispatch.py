"""Cluster API's MachineDrainRules travel with each node's request (issue #31, drain): the
controller reads them from the management cluster (the real CRD of the pinned Cluster
API), keeps those whose spec.machines select the Machine (its labels and its Cluster's)
and sends them, in name order, in the NodePlan's nodePolicy and so in the node's signal.
A rule that cannot be carried out as written holds the node's dispatch with a Warning
Event naming the rule. The agent's side: tests/integration/test_agent_drain_policy.py."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from fleet.cli.upgrade import apply_upgrade
from fleet.events import list_events
from fleet.kube import KubeClient
from fleet.kube.resources import CLUSTERS, MACHINE_DRAIN_RULES, NODE_PLANS
from fleet.testing.capi import ensure_infra_crd
from fleet.testing.responder import NodeResponder
from fleet.testing.world import World
from tests.helpers.capienv import wait_for
from tests.helpers.controller import intent_config, policy_controller, small_cluster

pytestmark = pytest.mark.anyio
V2 = "v1.31.3+k0s.0"


def drain_rule(name: str, namespace: str, behavior: str, *,
               machines: list[dict[str, Any]] | None = None,
               pods: list[dict[str, Any]] | None = None, order: int | None = None
               ) -> dict[str, Any]:
    drain: dict[str, Any] = {"behavior": behavior}
    if order is not None:
        drain["order"] = order
    spec: dict[str, Any] = {"drain": drain}
    if machines:
        spec["machines"] = machines
    if pods:
        spec["pods"] = pods
    return {"apiVersion": MACHINE_DRAIN_RULES.api_version, "kind": MACHINE_DRAIN_RULES.kind,
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


async def test_the_rules_that_select_a_machine_travel_with_its_request(
        world: World, mgmt: KubeClient, wl1: KubeClient, namespace: str) -> None:
    await ensure_infra_crd(mgmt)
    fc = await small_cluster(mgmt, wl1, world, namespace, prefix="mdr", control_planes=1,
                             workers=1)
    await mgmt.patch(CLUSTERS, fc.name, {"metadata": {"labels": {"stage": "prod"}}},
                     namespace)
    cp_only = [{"selector": {"matchExpressions": [
        {"key": "cluster.x-k8s.io/control-plane", "operator": "Exists"}]}}]
    for r in (
        drain_rule("z-logs", namespace, "Skip",
                   pods=[{"selector": {"matchLabels": {"app": "logs"}}}]),
        drain_rule("a-cp-jobs", namespace, "WaitCompleted", machines=cp_only,
                   pods=[{"selector": {"matchLabels": {"app": "job"}}}]),
        drain_rule("m-prod-db", namespace, "Drain", order=10, machines=[{
            "clusterSelector": {"matchLabels": {"stage": "prod"}}}],
            pods=[{"selector": {"matchLabels": {"app": "db"}},
                   "namespaceSelector": {"matchLabels": {"tier": "data"}}}]),
        drain_rule("n-dev-only", namespace, "Skip", machines=[{
            "clusterSelector": {"matchLabels": {"stage": "dev"}}}]),
    ):
        await mgmt.create(MACHINE_DRAIN_RULES, r, namespace)
    responder = NodeResponder(wl1, step_seconds=0.05, only=lambda n: n in fc.machines)
    await apply_upgrade(mgmt, namespace=namespace, name="to-v2", version=V2, selector=None)
    async with policy_controller(mgmt, intent_config(namespace)), \
            anyio.create_task_group() as tg:
        await tg.start(responder.run)

        async def both_dispatched() -> dict[str, Any] | None:
            plans = {p["spec"]["machineName"]: p
                     for p in (await mgmt.list(NODE_PLANS, namespace)).items
                     if p["spec"]["clusterName"] == fc.name}
            return plans if set(plans) == set(fc.machines) else None

        plans = await wait_for("a NodePlan for each Machine", both_dispatched, 120, 0.1)
        tg.cancel_scope.cancel()
    rules = {m: [r["name"] for r in p["spec"]["nodePolicy"].get("drainRules") or []]
             for m, p in plans.items()}
    [cp], [worker] = fc.control_planes, fc.workers
    assert rules == {cp: ["a-cp-jobs", "m-prod-db", "z-logs"],
                     worker: ["m-prod-db", "z-logs"]}, rules
    db = plans[worker]["spec"]["nodePolicy"]["drainRules"][0]
    assert db == {"name": "m-prod-db", "behavior": "Drain", "order": 10, "pods": [
        {"selector": {"matchLabels": {"app": "db"}},
         "namespaceSelector": {"matchLabels": {"tier": "data"}}}]}


async def test_a_rule_that_cannot_be_carried_out_holds_the_dispatch_naming_it(
        world: World, mgmt: KubeClient, wl1: KubeClient, namespace: str) -> None:
    """Cluster API's webhook would refuse such a rule; a rule written past it (no webhook,
    an older schema) must not make the drain ignore what it says."""
    await ensure_infra_crd(mgmt)
    fc = await small_cluster(mgmt, wl1, world, namespace, prefix="mdrbad", control_planes=0,
                             workers=1)
    await mgmt.create(MACHINE_DRAIN_RULES, drain_rule(
        "broken", namespace, "Skip", pods=[{"selector": {"matchExpressions": [
            {"key": "app", "operator": "Near", "values": ["x"]}]}}]), namespace)
    await apply_upgrade(mgmt, namespace=namespace, name="to-v2", version=V2, selector=None)
    async with policy_controller(mgmt, intent_config(namespace)):
        async def said() -> bool:
            return any(e.get("reason") == "DrainRuleInvalid"
                       and "MachineDrainRule broken" in (e.get("note") or "")
                       for e in await list_events(mgmt, namespace))

        await wait_for("the DrainRuleInvalid Event", said, 60, 0.1)
        assert [p for p in (await mgmt.list(NODE_PLANS, namespace)).items
                if p["spec"]["clusterName"] == fc.name] == []
