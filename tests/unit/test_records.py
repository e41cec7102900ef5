"""Workload records made on ingest: what is kept, what is dropped, bad input, and the
RecordCache rules (same facts at a newer resourceVersion are no change)."""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

import pytest

from fleet.contract.signal import (
    AUTOPILOT_SIGNAL_DATA_KEY,
    CORDONED_BY_KEY,
    RUNNING_VERSION_KEY,
    SIGNAL_DATA_KEY,
    SIGNAL_VERSION_KEY,
)
from fleet.kube.watch import WatchEvent
from fleet.world.clusters import control_node_cache, node_cache, plan_cache
from fleet.world.model import KIND_CONTROL_NODE, KIND_NODE, node_from
from fleet.world.records import (
    NodeRecord,
    RecordError,
    live_autopilot_plan,
    node_record,
    node_records,
    plan_record,
)

SIGNAL = json.dumps({"planId": "ns/plan-a", "created": "2026-01-01T00:00:00Z",
                     "command": {"id": 1, "k0supdate": {
                         "version": "v1.31.3+k0s.0", "url": "https://example.com/k0s",
                         "sha256": "a" * 64}}})


def realistic_node(name: str = "w-1", rv: str = "100", **over: Any) -> dict[str, Any]:
    """A Node as a kubelet publishes it: images, managedFields, many labels/annotations."""
    node: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "uid": f"uid-{name}", "resourceVersion": rv,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"kubernetes.io/arch": "arm64", "kubernetes.io/os": "linux",
                       "kubernetes.io/hostname": name, "node.k0sproject.io/role": "worker",
                       **{f"example.com/l{i}": "x" * 20 for i in range(10)}},
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                SIGNAL_VERSION_KEY: "v2", SIGNAL_DATA_KEY: SIGNAL,
                RUNNING_VERSION_KEY: "v1.31.2+k0s.0", CORDONED_BY_KEY: "ns/plan-a",
                "fleet.k0s-fleet.io/signal-rejected": "{}"},
            "managedFields": [{"manager": f"kubelet-{i}", "operation": "Update",
                               "apiVersion": "v1", "time": "2026-01-01T00:00:00Z",
                               "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:status": {f"f:k{j}": {} for j in range(20)}}}
                              for i in range(4)]},
        "spec": {"podCIDR": "10.244.1.0/24", "unschedulable": True,
                 "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "15Gi", "pods": "110"},
            "conditions": [
                {"type": t, "status": "False", "reason": "KubeletHasSufficient" + t,
                 "message": "kubelet has sufficient " + t,
                 "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}
                for t in ("MemoryPressure", "DiskPressure", "PIDPressure")] + [
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                          {"type": "Hostname", "address": name}],
            "nodeInfo": {"architecture": "arm64", "kubeletVersion": "v1.31.2+k0s",
                         "kernelVersion": "6.1.0", "osImage": "Debian GNU/Linux 12",
                         "containerRuntimeVersion": "containerd://1.7.20",
                         "machineID": "m" * 32, "systemUUID": "u" * 36, "bootID": "b" * 36,
                         "kubeProxyVersion": "v1.31.2+k0s", "operatingSystem": "linux"},
            "images": [{"names": [f"registry.example.com/team/image-{i}@sha256:{'0' * 64}",
                                  f"registry.example.com/team/image-{i}:v{i}.0.0"],
                        "sizeBytes": 100_000_000 + i} for i in range(40)],
        },
    }
    node.update(over)
    return node


def deep_size(obj: Any, seen: set[int] | None = None) -> int:
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, list | tuple | set | frozenset):
        size += sum(deep_size(v, seen) for v in obj)
    elif hasattr(obj, "__slots__"):
        size += sum(deep_size(getattr(obj, s), seen) for s in obj.__slots__ if hasattr(obj, s))
    elif hasattr(obj, "__dict__"):
        size += deep_size(vars(obj), seen)
    return size


def test_a_node_keeps_what_the_decisions_read() -> None:
    full = realistic_node()
    rec = node_record(full)
    assert rec.info == node_from(full)  # nothing the decisions read was dropped
    assert (rec.name, rec.uid, rec.resource_version, rec.kind) == \
        ("w-1", "uid-w-1", "100", KIND_NODE)
    info = rec.info
    assert (info.ready, info.unschedulable, info.arch, info.kubelet_version) == \
        (True, True, "arm64", "v1.31.2+k0s")
    assert info.signal is not None and info.signal.planId == "ns/plan-a"
    assert (info.running_version, info.cordoned_by) == ("v1.31.2+k0s.0", "ns/plan-a")
    # k0s-fleet's own annotations and nothing else
    assert [k for k, _ in rec.annotations] == sorted(
        [SIGNAL_VERSION_KEY, SIGNAL_DATA_KEY, RUNNING_VERSION_KEY, CORDONED_BY_KEY,
         "fleet.k0s-fleet.io/signal-rejected"])
    assert rec.annotation(SIGNAL_DATA_KEY) == SIGNAL


def test_what_is_dropped_and_how_much_smaller_it_is() -> None:
    full = realistic_node()
    rendered = json.dumps(node_record(full).as_object())
    for dropped in ("managedFields", "images", "addresses", "capacity", "taints", "podCIDR",
                    "node.alpha.kubernetes.io/ttl", "example.com/l0", "MemoryPressure",
                    "machineID"):
        assert dropped not in rendered
    assert len(json.dumps(full)) > 10_000
    # the record (its parsed signal included) against the decoded JSON it replaces
    assert deep_size(node_record(full)) * 5 < deep_size(json.loads(json.dumps(full)))


def test_as_object_gives_the_same_facts_back() -> None:
    for node in (realistic_node(), realistic_node(status={}), realistic_node(spec={}),
                 {"metadata": {"name": "bare"}}):
        rec = node_record(node)
        obj = rec.as_object()
        assert node_from(obj) == rec.info
        again = node_record(obj)
        assert again == rec and again.resource_version == rec.resource_version


def test_same_facts_compare_equal_whatever_the_resource_version() -> None:
    a = node_record(realistic_node(rv="1"))
    b = node_record(realistic_node(rv="2", status={**realistic_node()["status"], "images": []}))
    assert a == b and a.resource_version != b.resource_version
    moved = realistic_node(rv="3")
    moved["metadata"]["annotations"][SIGNAL_DATA_KEY] = SIGNAL.replace("plan-a", "plan-b")
    assert node_record(moved) != a


def test_a_control_node() -> None:
    cn = {"apiVersion": "autopilot.k0sproject.io/v1beta2", "kind": "ControlNode",
          "metadata": {"name": "c-0", "resourceVersion": "7",
                       "annotations": {AUTOPILOT_SIGNAL_DATA_KEY: "{}", "other": "x"}},
          "status": {"k0sVersion": "v1.31.2+k0s.0", "addresses": [{"type": "x"}]}}
    rec = node_record(cn, KIND_CONTROL_NODE)
    assert rec.info == node_from(cn)
    assert (rec.kind, rec.info.ready, rec.info.k0s_version) == \
        (KIND_CONTROL_NODE, True, "v1.31.2+k0s.0")
    assert rec.annotations == ((AUTOPILOT_SIGNAL_DATA_KEY, "{}"),)
    assert node_from(rec.as_object()) == rec.info


def test_an_unparseable_signal_is_a_fact_not_an_error() -> None:
    node = realistic_node()
    node["metadata"]["annotations"][SIGNAL_DATA_KEY] = "{not json"
    rec = node_record(node)
    assert rec.info.signal is None and rec.info.signal_error is not None


def _broken(path: str, value: Any) -> dict[str, Any]:
    node = realistic_node()
    *parents, last = path.split(".", 2) if path.startswith("metadata.annotations.") \
        else path.split(".")
    target = node
    for p in parents:
        target = target[p]
    target[last] = value
    return node


@pytest.mark.parametrize(("node", "message"), [
    ("a string", "a Node must be a JSON object, not a str"),
    ({"metadata": {}}, "a Node without metadata.name"),
    ({"metadata": ["x"]}, "a Node: metadata is a list, not an object"),
    ({"metadata": {"name": 5}}, "a Node: metadata.name is a int, not a string"),
    (_broken("metadata.annotations", ["a"]), "Node w-1: metadata.annotations is a list"),
    (_broken(f"metadata.annotations.{SIGNAL_DATA_KEY}", {"x": 1}),
     f"Node w-1: annotation {SIGNAL_DATA_KEY} is a dict, not a string"),
    (_broken("status", "nope"), "Node w-1: status is a str, not an object"),
    (_broken("status.nodeInfo", []), "Node w-1: status.nodeInfo is a list"),
    (_broken("status.conditions", {}), "Node w-1: status.conditions is a dict, not a list"),
    (_broken("status.nodeInfo.kubeletVersion", 1),
     "Node w-1: status.nodeInfo.kubeletVersion is a int, not a string"),
    (_broken("spec.unschedulable", "yes"), "Node w-1: spec.unschedulable is a str"),
    (_broken("metadata.labels", "x"), "Node w-1: metadata.labels is a str"),
])
def test_bad_input_names_what_is_wrong(node: Any, message: str) -> None:
    with pytest.raises(RecordError) as e:
        node_record(node)
    assert message in str(e.value)


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(RecordError, match="not a node kind: 'Pod'"):
        node_record(realistic_node(), "Pod")


def test_one_shot_lists_skip_what_cannot_be_read(caplog: pytest.LogCaptureFixture) -> None:
    recs = node_records([realistic_node("a"), {"metadata": {}}, realistic_node("b")])
    assert [r.name for r in recs] == ["a", "b"]
    assert "without metadata.name" in caplog.text


def test_plans() -> None:
    live = plan_record({"metadata": {"name": "p", "resourceVersion": "3", "uid": "u",
                                     "managedFields": [{}] * 10},
                        "spec": {"commands": [{"k0supdate": {}}] * 5},
                        "status": {"state": "SchedulableWait"}})
    done = plan_record({"metadata": {"name": "q"}, "status": {"state": "Completed"}})
    going = plan_record({"metadata": {"name": "r", "deletionTimestamp": "2026-01-01T00:00:00Z"}})
    assert live_autopilot_plan([done, going, live]) == "p (SchedulableWait)"
    assert live_autopilot_plan([done, going]) is None
    assert plan_record(live.as_object()) == live
    assert plan_record(going.as_object()) == going
    with pytest.raises(RecordError, match=r"Plan p: status\.state is a int"):
        plan_record({"metadata": {"name": "p"}, "status": {"state": 3}})


# -- RecordCache ------------------------------------------------------------------------------

def test_cache_holds_records_and_wakes_only_on_changed_facts() -> None:
    changes: list[int] = []
    cache = node_cache(lambda: changes.append(1))
    cache.observe(realistic_node(rv="10"))
    assert isinstance(cache.get("w-1"), NodeRecord) and len(changes) == 1
    # a kubelet status update that changes nothing kept: newer rv, no wake-up
    heartbeat = realistic_node(rv="11")
    heartbeat["status"]["images"] = heartbeat["status"]["images"][:3]
    cache.observe(heartbeat)
    assert len(changes) == 1
    rec = cache.get("w-1")
    assert rec is not None and rec.resource_version == "11"  # a patch's precondition
    base = cache.object("w-1")
    assert base is not None and base["metadata"]["resourceVersion"] == "11"
    # a changed signal wakes the planner
    moved = realistic_node(rv="12")
    moved["metadata"]["annotations"][SIGNAL_DATA_KEY] = SIGNAL.replace("plan-a", "plan-b")
    cache.observe(moved)
    assert len(changes) == 2
    # an older event is ignored
    cache.observe(realistic_node(rv="11"))
    rec = cache.get("w-1")
    assert rec is not None and rec.resource_version == "12" and len(changes) == 2


@pytest.mark.anyio
async def test_cache_drops_what_cannot_be_read_and_remembers_deletions() -> None:
    changes: list[int] = []
    cache = node_cache(lambda: changes.append(1))
    await cache.on_event(WatchEvent("ADDED", realistic_node(rv="5")))
    assert cache.get("w-1") is not None
    # a newer version that cannot be read: no decision on the stale record
    await cache.on_event(WatchEvent("MODIFIED", _broken("status", "nope")
                                    | {"metadata": {"name": "w-1", "resourceVersion": "6"}}))
    assert cache.get("w-1") is None and len(changes) == 2
    assert "status is a str" in cache.unreadable[("", "w-1")]
    await cache.on_event(WatchEvent("MODIFIED", realistic_node(rv="7")))
    assert cache.get("w-1") is not None and not cache.unreadable
    await cache.on_event(WatchEvent("DELETED", {"metadata": {"name": "w-1",
                                                             "resourceVersion": "8"}}))
    assert cache.get("w-1") is None and len(cache) == 0
    await cache.on_event(WatchEvent("MODIFIED", realistic_node(rv="7")))  # late, stale
    assert cache.get("w-1") is None


def test_the_caches_never_hold_the_json() -> None:
    node = realistic_node()
    cache = node_cache()
    cache.observe(node)
    cn = control_node_cache()
    cn.observe({"metadata": {"name": "c"}})
    plans = plan_cache()
    plans.observe({"metadata": {"name": "p"}})
    for c in (cache, cn, plans):
        for rec in c:
            assert not isinstance(rec, dict)
    before = copy.deepcopy(node)
    base = cache.object("w-1")
    assert base is not None
    base["metadata"]["annotations"]["x"] = "y"  # a copy: mutating it changes nothing
    assert cache.object("w-1") != base and node == before


def test_object_caches_drop_managed_fields_and_last_applied() -> None:
    from fleet.kube.cache import LAST_APPLIED, ObjectCache  # noqa: PLC0415

    cache = ObjectCache("Machine")
    cache.observe({"metadata": {"name": "m", "namespace": "ns", "resourceVersion": "1",
                                "managedFields": [{"manager": "capi"}],
                                "annotations": {LAST_APPLIED: "{...}", "keep": "me"}},
                   "spec": {"version": "v1.31.2+k0s.0"}})
    m = cache.get("m", "ns")
    assert m is not None and "managedFields" not in m["metadata"]
    assert m["metadata"]["annotations"] == {"keep": "me"}
    assert m["spec"] == {"version": "v1.31.2+k0s.0"}
