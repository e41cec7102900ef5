"""Cluster API's MachineDrainRules: which apply to a Machine (fleet.world.drainrules, the
controller's side: pure, the rule objects and labels only) and what the agent's drain
does with them (fleet.agents.drain.select: groups by order, Skip, WaitCompleted, first
rule by name wins), as Cluster API's own drain does."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from fleet.agents.drain import DrainResult, judge, select
from fleet.contract.signal import (
    MAX_DRAIN_OUTCOMES,
    MORE_PODS,
    DrainRule,
    NodePolicy,
    SignalStatus,
    drain_outcomes,
    replace_status,
)
from fleet.world.drainrules import DrainRuleError, rules_for_machine

RS = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u1",
       "controller": True}]


def rule(name: str, behavior: str = "Drain", *, order: int | None = None,
         machines: list[dict[str, Any]] | None = None,
         pods: list[dict[str, Any]] | None = None, namespace: str = "ns"
         ) -> dict[str, Any]:
    drain: dict[str, Any] = {"behavior": behavior}
    if order is not None:
        drain["order"] = order
    spec: dict[str, Any] = {"drain": drain}
    if machines is not None:
        spec["machines"] = machines
    if pods is not None:
        spec["pods"] = pods
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def pod(name: str, labels: dict[str, str] | None = None, *, ns: str = "app",
        phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels or {},
                         "ownerReferences": RS},
            "spec": {"nodeName": "n1"}, "status": {"phase": phase}}


# -- the controller: which rules a Machine's request carries -------------------------------
def test_rules_apply_by_machine_and_cluster_labels_in_name_order() -> None:
    rules = [
        rule("z-all"),  # no machines: every Machine of the namespace
        rule("b-linux", "Skip", machines=[{"selector": {"matchLabels": {"os": "linux"}}}]),
        rule("a-prod-cp", "WaitCompleted", machines=[{
            "selector": {"matchExpressions": [{"key": "cluster.x-k8s.io/control-plane",
                                               "operator": "Exists"}]},
            "clusterSelector": {"matchLabels": {"stage": "prod"}}}]),
        rule("c-other-ns", namespace="elsewhere"),
    ]
    worker = rules_for_machine(rules, namespace="ns", machine_labels={"os": "linux"},
                               cluster_labels={"stage": "prod"})
    assert [r.name for r in worker] == ["b-linux", "z-all"]
    cp = rules_for_machine(rules, namespace="ns", machine_labels={
        "cluster.x-k8s.io/control-plane": ""}, cluster_labels={"stage": "prod"})
    assert [r.name for r in cp] == ["a-prod-cp", "z-all"]
    cp_dev = rules_for_machine(rules, namespace="ns", machine_labels={
        "cluster.x-k8s.io/control-plane": ""}, cluster_labels={"stage": "dev"})
    assert [r.name for r in cp_dev] == ["z-all"]
    assert NodePolicy(drainRules=worker).drainRules == worker  # what a request carries


@pytest.mark.parametrize(("bad", "named"), [
    (rule("r", "Evict"), "MachineDrainRule r: spec.drain.behavior"),
    (rule("r", "Skip", order=5), "MachineDrainRule r: spec.drain.order"),
    (rule("r", machines=[{"selector": {"matchExpressions": [
        {"key": "a", "operator": "Near"}]}}]), "spec.machines[0].selector"),
    (rule("r", pods=[{"selector": {"matchLabels": {"a": 1}}}]), "MachineDrainRule r: spec.pods"),
])
def test_a_rule_that_cannot_be_carried_out_is_an_error_naming_it(
        bad: dict[str, Any], named: str) -> None:
    with pytest.raises(DrainRuleError, match=named.replace("[", r"\[").replace("]", r"\]")):
        rules_for_machine([bad], namespace="ns", machine_labels={}, cluster_labels={})


def test_a_request_refuses_rules_out_of_name_order() -> None:
    a, b = DrainRule(name="a", behavior="Skip"), DrainRule(name="b", behavior="Drain")
    with pytest.raises(ValidationError, match="name order"):
        NodePolicy(drainRules=(b, a))


# -- the agent: what a drain does with them ------------------------------------------------
def test_the_first_matching_rule_by_name_decides() -> None:
    rules = (DrainRule(name="a", behavior="Skip",
                       pods=[{"selector": {"matchLabels": {"app": "logs"}}}]),
             DrainRule(name="b", behavior="Drain", order=10))
    assert judge(pod("l", {"app": "logs"}), rules=rules).verdict == "skip"
    j = judge(pod("w", {"app": "web"}), rules=rules)
    assert (j.verdict, j.order) == ("evict", 10)
    # the pod label comes before any rule, as in Cluster API
    assert judge(pod("w", {"cluster.x-k8s.io/drain": "wait-completed"}),
                 rules=rules).verdict == "wait"


def test_namespace_selectors_match_the_namespace_labels() -> None:
    rules = (DrainRule(name="mon", behavior="Skip", pods=[{
        "namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]),)
    labels = {"mon": {"team": "monitoring"}, "app": {}}
    assert judge(pod("p", ns="mon"), rules=rules, namespace_labels=labels).verdict == "skip"
    assert judge(pod("p", ns="app"), rules=rules, namespace_labels=labels).verdict == "evict"


def test_groups_drain_by_increasing_order_and_wait_for_wait_completed() -> None:
    rules = (DrainRule(name="db-last", behavior="Drain", order=100,
                       pods=[{"selector": {"matchLabels": {"app": "db"}}}]),
             DrainRule(name="jobs", behavior="WaitCompleted",
                       pods=[{"selector": {"matchLabels": {"app": "job"}}}]))
    pods = [pod("web"), pod("job", {"app": "job"}), pod("db", {"app": "db"})]
    first = select(pods, rules=rules)
    assert first.order == 0
    assert [p["metadata"]["name"] for p in first.evict] == ["web"]
    assert list(first.waiting) == ["app/job"]
    assert [p["metadata"]["name"] for p in first.later] == ["db"]
    # web gone, the job still running: db still waits for its group
    second = select(pods[1:], rules=rules)
    assert second.order == 0 and second.evict == [] and list(second.waiting) == ["app/job"]
    # the job completed: db's group is next
    third = select([pod("job", {"app": "job"}, phase="Succeeded"), pods[2]], rules=rules)
    assert third.order == 100 and [p["metadata"]["name"] for p in third.evict] == ["db"]
    assert select([], rules=rules).order is None


def test_outcomes_name_every_pod_and_stay_small() -> None:
    r = DrainResult(evicted={"a/web"}, exempt={"a/logs": "MachineDrainRule a: Skip"},
                    waited={"a/job": "MachineDrainRule jobs: WaitCompleted"},
                    remaining=["a/db"], blocked={"a/db": "eviction refused: 429"})
    assert r.outcomes() == {
        "a/web": "evicted", "a/logs": "left running: MachineDrainRule a: Skip",
        "a/job": "waited for until completed: MachineDrainRule jobs: WaitCompleted",
        "a/db": "still on the node (eviction refused: 429)"}
    many = drain_outcomes({f"ns/p{i:03d}": "evicted" for i in range(120)})
    assert len(many) == MAX_DRAIN_OUTCOMES + 1
    assert many[0] == "ns/p000: evicted"
    assert many[-1] == f"{MORE_PODS} 70 more pods not listed"
    # a status carrying them is still one flat object, as the signal policy requires
    status = SignalStatus(status="ApplyingUpdate", drain=many)
    raw = replace_status('{"planId":"ns/p","created":"2026-12-06T00:00:00Z"}', status)
    assert json.loads(raw)["status"]["drain"] == list(many)
    assert re.search(r',"status":\{[^{}]*\}\}$', raw)


@given(st.lists(st.tuples(st.sampled_from(["Drain", "Skip", "WaitCompleted"]),
                          st.integers(-3, 3), st.sampled_from(["a", "b", "c"])),
                min_size=0, max_size=5),
       st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=0, max_size=8))
def test_a_group_is_only_evicted_once_every_lower_group_is_gone(
        specs: list[tuple[str, int, str]], apps: list[str]) -> None:
    rules = tuple(DrainRule(name=f"r{i}", behavior=b, order=o if b == "Drain" else 0,
                            pods=[{"selector": {"matchLabels": {"app": app}}}])
                  for i, (b, o, app) in enumerate(specs))
    pods = [pod(f"p{i}", {"app": a}) for i, a in enumerate(apps)]
    sel = select(pods, rules=rules)
    orders = {p["metadata"]["name"]: judge(p, rules=rules) for p in pods}
    pending = [j.order for j in orders.values() if j.verdict in ("evict", "wait")]
    assert sel.order == (min(pending) if pending else None)
    for p in sel.evict:
        assert orders[p["metadata"]["name"]].order == sel.order
    for p in sel.later:
        assert orders[p["metadata"]["name"]].order > (sel.order or 0)
    assert set(sel.skipped) == {f"app/{n}" for n, j in orders.items() if j.verdict == "skip"}
