"""Which pods a node agent's drain evicts, leaves running, or refuses the drain over
(fleet.agents.drain.select/judge: pure, the pod objects and the node policy only)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from fleet.agents.drain import CAPI_DRAIN_LABEL, DrainResult, judge, select
from fleet.agents.settings import AgentSettings
from fleet.config.errors import ConfigError
from fleet.config.loader import load_config
from fleet.config.models import FleetConfig
from fleet.contract.signal import NodePolicy

RS = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u1",
       "controller": True}]


def pod(name: str, *, owners: list[dict[str, Any]] | None = None,
        labels: dict[str, str] | None = None, volumes: list[dict[str, Any]] | None = None,
        phase: str = "Running", annotations: dict[str, str] | None = None,
        deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "labels": labels or {},
                            "annotations": annotations or {},
                            "ownerReferences": RS if owners is None else owners}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    return {"metadata": meta,
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}],
                     "volumes": volumes or []},
            "status": {"phase": phase}}


def names(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["name"] for p in pods}


def test_capi_skip_label_leaves_the_pod_running() -> None:
    """Before: evicted (only DaemonSet and mirror pods were left)."""
    sel = select([pod("keep", labels={CAPI_DRAIN_LABEL: "skip"}), pod("web")])
    assert names(sel.evict) == {"web"}
    assert sel.skipped == {"ns/keep": "labelled cluster.x-k8s.io/drain: skip"}
    assert sel.refused == {}


@pytest.mark.parametrize("value", ["", "Skip", "drain", "true"])
def test_only_the_documented_skip_value_counts(value: str) -> None:
    assert judge(pod("p", labels={CAPI_DRAIN_LABEL: value}))[0] == "evict"


def test_skip_label_wins_over_a_refusal() -> None:
    """A skipped pod is never evicted, so it cannot refuse the drain."""
    bare = pod("bare", owners=[], labels={CAPI_DRAIN_LABEL: "skip"},
               volumes=[{"name": "scratch", "emptyDir": {}}])
    assert judge(bare)[0] == "skip"


def test_daemonset_and_mirror_pods_still_stay() -> None:
    ds = pod("ds", owners=[{"kind": "DaemonSet", "name": "d", "uid": "u",
                            "controller": True}],
             volumes=[{"name": "tmp", "emptyDir": {}}])
    mirror = pod("static", owners=[], annotations={"kubernetes.io/config.mirror": "x"})
    sel = select([ds, mirror])
    assert sel.evict == [] and sel.refused == {}
    assert sel.skipped == {"ns/ds": "DaemonSet pod", "ns/static": "mirror pod"}


@pytest.mark.parametrize("owners", [
    [],  # bare pod
    [{"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "u"}],  # owner, no controller
    [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "u",
      "controller": False}],
])
def test_a_pod_without_a_controller_refuses_the_drain(owners: list[dict[str, Any]]) -> None:
    """Before: evicted silently (kubectl drain refuses it without --force)."""
    sel = select([pod("bare", owners=owners), pod("web")])
    assert list(sel.refused) == ["ns/bare"]
    assert "no controller" in sel.refused["ns/bare"] and "force" in sel.refused["ns/bare"]
    assert names(sel.evict) == {"web"}
    assert names(select([pod("bare", owners=owners)], force=True).evict) == {"bare"}


def test_emptydir_data_refuses_the_drain() -> None:
    """Before: evicted silently (kubectl drain refuses it without --delete-emptydir-data)."""
    p = pod("cache", volumes=[{"name": "cfg", "configMap": {"name": "c"}},
                              {"name": "scratch", "emptyDir": {}},
                              {"name": "mem", "emptyDir": {"medium": "Memory"}}])
    verdict, why, _ = judge(p)
    assert verdict == "refuse"
    assert "emptyDir" in why and "scratch, mem" in why and "deleteEmptyDirData" in why
    assert "cfg" not in why
    assert judge(p, force=True)[0] == "refuse"  # force is about controllers only
    assert judge(p, delete_emptydir_data=True)[:2] == ("evict", "")


def test_both_reasons_are_named_and_both_consents_needed() -> None:
    p = pod("both", owners=[], volumes=[{"name": "v", "emptyDir": {}}])
    verdict, why, _ = judge(p)
    assert verdict == "refuse" and "no controller" in why and "emptyDir" in why
    assert judge(p, force=True)[0] == "refuse"
    assert judge(p, delete_emptydir_data=True)[0] == "refuse"
    assert judge(p, force=True, delete_emptydir_data=True)[0] == "evict"


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_pods_are_removed_without_asking(phase: str) -> None:
    """As kubectl: a finished pod holds nothing (its emptyDir is gone with it)."""
    p = pod("job", owners=[], phase=phase, volumes=[{"name": "v", "emptyDir": {}}])
    sel = select([p])
    assert names(sel.evict) == {"job"} and sel.refused == {}


def test_a_pod_already_terminating_does_not_refuse() -> None:
    sel = select([pod("going", owners=[], deleting=True)])
    assert names(sel.evict) == {"going"} and sel.refused == {}


def test_refusal_message_names_every_pod() -> None:
    sel = select([pod("b", owners=[]), pod("a", volumes=[{"name": "v", "emptyDir": {}}])])
    msg = DrainResult(refused=sel.refused).refusal()
    assert msg.startswith("drain refused")
    assert msg.index("ns/a:") < msg.index("ns/b:")  # sorted, each with its reason


def test_policy_flags_travel_with_the_request_over_the_agents_own() -> None:
    s = AgentSettings(node_name="n1", force=True)
    pol = s.policy_for(None)
    assert pol.force is True and pol.delete_empty_dir_data is False
    pol = s.policy_for(NodePolicy(force=False, deleteEmptyDirData=True))
    assert pol.force is False and pol.delete_empty_dir_data is True
    assert AgentSettings(node_name="n1").policy_for(NodePolicy()).force is False


@pytest.mark.parametrize("bad", [1, "true", "yes", "NoneType"])
def test_request_policy_flags_are_booleans_only(bad: object) -> None:
    with pytest.raises(ValueError, match="force"):
        NodePolicy.model_validate({"force": bad})


# -- the fleet YAML's agent: section ----------------------------------------------------------
def test_fleet_config_carries_the_drain_consent() -> None:
    cfg = FleetConfig.model_validate({"agent": {"deleteEmptyDirData": True, "force": True}})
    pol = cfg.agent.node_policy()
    assert pol.deleteEmptyDirData is True and pol.force is True
    default = FleetConfig().agent.node_policy()
    assert default.deleteEmptyDirData is False and default.force is False


@pytest.mark.parametrize("bad", [1, "yes", "on", None])
def test_fleet_config_drain_consent_is_true_or_false_only(bad: object) -> None:
    with pytest.raises(ValidationError, match="must be true or false"):
        FleetConfig.model_validate({"agent": {"force": bad}})
    with pytest.raises(ValidationError, match="Extra inputs"):
        FleetConfig.model_validate({"agent": {"forse": True}})


def test_fleet_config_drain_consent_from_the_environment() -> None:
    cfg = load_config(None, env={"K0S_FLEET_AGENT__FORCE": "true",
                                 "K0S_FLEET_AGENT__DELETE_EMPTY_DIR_DATA": "false"})
    assert cfg.agent.force is True and cfg.agent.delete_empty_dir_data is False
    with pytest.raises(ConfigError, match=r"agent\.force: must be true or false"):
        load_config(None, env={"K0S_FLEET_AGENT__FORCE": "1"})


# -- skipPods: label selectors carried by the request (for MachineDrainRule Skip rules) --------
def test_skip_pods_selectors_leave_matching_pods_running() -> None:
    """Before: no such policy field (ignored), every such pod evicted."""
    rules = NodePolicy.model_validate({"skipPods": [
        {"matchLabels": {"app": "db"}},
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["cache"]}]}]})
    skip = AgentSettings(node_name="n1").policy_for(rules).skip_pods
    sel = select([pod("db", labels={"app": "db"}), pod("cache", labels={"tier": "cache"}),
                  pod("web", labels={"app": "web"}),
                  pod("bare-db", owners=[], labels={"app": "db"})], skip_pods=skip)
    assert names(sel.evict) == {"web"} and sel.refused == {}
    assert sel.skipped == {"ns/db": "matches the node policy's skipPods[0]",
                           "ns/cache": "matches the node policy's skipPods[1]",
                           "ns/bare-db": "matches the node policy's skipPods[0]"}
    # an empty selector selects every pod, as in a MachineDrainRule
    assert select([pod("any")], skip_pods=({},)).evict == []
    assert AgentSettings(node_name="n1").policy_for(None).skip_pods == ()


@pytest.mark.parametrize("bad", [
    [{"matchExpressions": [{"key": "a", "operator": "Bogus"}]}],
    [{"matchLabel": {"a": "b"}}],
    ["app=db"],
])
def test_skip_pods_must_be_label_selectors(bad: object) -> None:
    with pytest.raises(ValidationError, match="skipPods"):
        NodePolicy.model_validate({"skipPods": bad})
