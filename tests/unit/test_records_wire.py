"""Decoding straight into the records' subset (fleet.kube.wire with fleet.world.records'
node_subset / plan_subset) makes the same record, or names the same problem, as
json.loads followed by node_record / plan_record, for any Node-, ControlNode- or
Plan-shaped object; watch lines and list pages frame it without changing anything else."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.contract.signal import AUTOPILOT_SIGNAL_VERSION_KEY, SIGNAL_DATA_KEY, SIGNAL_VERSION_KEY
from fleet.kube.cache import Remembered
from fleet.kube.wire import (
    LINE_KEY_BYTES,
    ObjectDecoder,
    SharedObject,
    decode_list_page,
    decode_object,
    decode_watch_line,
)
from fleet.world.clusters import node_cache
from fleet.world.model import KIND_CONTROL_NODE, KIND_NODE
from fleet.world.records import (
    ARCH_LABEL,
    NodeRecord,
    PlanRecord,
    RecordError,
    _node_subset,
    _NodeWire,
    node_record,
    node_subset,
    plan_record,
    plan_subset,
)
from tests.unit.test_records import realistic_node

# -- strategies: Node-shaped objects, mostly right, sometimes of the wrong types ---------

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12),
                    st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)


def maybe(value: st.SearchStrategy[Any], odd: float = 0.15) -> st.SearchStrategy[Any]:
    """``value`` mostly, about ``odd`` of the time any JSON value at all (a wrong type)."""
    return st.integers(0, 999).flatmap(lambda i: json_values if i < odd * 1000 else value)


annotation_keys = st.one_of(
    st.sampled_from([SIGNAL_VERSION_KEY, SIGNAL_DATA_KEY, AUTOPILOT_SIGNAL_VERSION_KEY,
                     "fleet.k0s-fleet.io/other", "node.alpha.kubernetes.io/ttl",
                     "example.com/x"]), st.text(max_size=10))
texts = st.one_of(st.none(), st.just(""), st.text(max_size=20))
conditions = st.lists(maybe(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["Ready", "MemoryPressure", "DiskPressure"]),
         "status": st.sampled_from(["True", "False", "Unknown"])},
        optional={"reason": st.text(max_size=5), "lastHeartbeatTime": st.text(max_size=5)}),
    0.1), max_size=4)
metadata = st.fixed_dictionaries({}, optional={
    "name": maybe(st.text(min_size=0, max_size=12)),
    "namespace": maybe(texts),
    "uid": maybe(texts),
    "resourceVersion": maybe(st.one_of(st.integers(0, 10**9), st.text("0123456789",
                                                                       max_size=6))),
    "annotations": maybe(st.dictionaries(annotation_keys, maybe(st.text(max_size=20)),
                                         max_size=5)),
    "labels": maybe(st.dictionaries(st.one_of(st.just(ARCH_LABEL), st.text(max_size=8)),
                                    maybe(texts), max_size=4)),
    "managedFields": st.lists(json_values, max_size=2),
    "deletionTimestamp": maybe(texts),
})
node_objects = st.fixed_dictionaries({}, optional={
    "apiVersion": st.just("v1"),
    "kind": st.just("Node"),
    "metadata": maybe(metadata, 0.05),
    "spec": maybe(st.fixed_dictionaries({}, optional={
        "unschedulable": maybe(st.booleans()), "podCIDR": st.text(max_size=5)})),
    "status": maybe(st.fixed_dictionaries({}, optional={
        "conditions": maybe(conditions),
        "nodeInfo": maybe(st.fixed_dictionaries({}, optional={
            "architecture": maybe(texts), "kubeletVersion": maybe(texts),
            "osImage": st.text(max_size=5)})),
        "k0sVersion": maybe(texts),
        "images": st.lists(json_values, max_size=2)})),
})
plan_objects = st.fixed_dictionaries({}, optional={
    "metadata": maybe(metadata, 0.05),
    "status": maybe(st.fixed_dictionaries({}, optional={"state": maybe(texts),
                                                        "commands": json_values})),
})
anything = st.one_of(json_values, node_objects)


def outcome(make: Any, obj: Any) -> tuple[str, Any]:
    """The record with its uncompared fields, or the error's message."""
    try:
        record = make(obj)
    except RecordError as e:
        return ("error", str(e))
    return ("record", (record, record.uid, record.resource_version))


def both_ways(raw: bytes, subset: Any, make: Any) -> tuple[tuple[str, Any], tuple[str, Any]]:
    whole = outcome(make, json.loads(raw))
    fast = outcome(make, decode_object(raw, subset))
    return whole, fast


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=st.one_of(node_objects, anything), kind=st.sampled_from([KIND_NODE,
                                                                    KIND_CONTROL_NODE]))
def test_node_subset_makes_the_same_record_or_the_same_error(obj: Any, kind: str) -> None:
    raw = json.dumps(obj).encode()
    whole, fast = both_ways(raw, node_subset, lambda o: node_record(o, kind))
    assert fast == whole


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=st.one_of(plan_objects, json_values))
def test_plan_subset_makes_the_same_record_or_the_same_error(obj: Any) -> None:
    raw = json.dumps(obj).encode()
    whole, fast = both_ways(raw, plan_subset, plan_record)
    assert fast == whole


def test_a_realistic_node_keeps_only_what_the_record_reads() -> None:
    node = realistic_node()
    raw = json.dumps(node).encode()
    subset = node_subset(raw)
    assert node_record(subset) == node_record(node)
    assert isinstance(node_record(subset), NodeRecord)
    # no images, managedFields, other annotations or labels, other conditions
    assert "managedFields" not in subset["metadata"]
    assert set(subset["metadata"]["labels"]) == {ARCH_LABEL}
    assert all(k.startswith("fleet.k0s-fleet.io/") or k.startswith("k0sproject.io/")
               for k in subset["metadata"]["annotations"])
    assert set(subset["status"]) <= {"conditions", "nodeInfo", "k0sVersion"}
    assert len(json.dumps(subset)) < len(raw) / 4


def test_wrong_container_types_are_read_whole_and_named() -> None:
    node = realistic_node()
    node["status"]["conditions"] = "Ready"
    raw = json.dumps(node).encode()
    with pytest.raises(msgspec.ValidationError):
        node_subset(raw)  # the Struct refuses it ...
    obj = decode_object(raw, node_subset)
    assert obj == node  # ... and the object comes whole
    with pytest.raises(RecordError, match=r"status\.conditions is a str, not a list"):
        node_record(obj)


def test_watch_lines_frame_the_subset() -> None:
    node = realistic_node(rv="7")
    for etype in ("ADDED", "MODIFIED", "DELETED"):
        line = json.dumps({"type": etype, "object": node}).encode() + b"\n"
        got = decode_watch_line(line, node_subset)
        assert got["type"] == etype
        assert got["object"] == node_subset(json.dumps(node).encode())
    bookmark = {"type": "BOOKMARK", "object": {"kind": "Node", "metadata": {
        "resourceVersion": "9", "annotations": {"k8s.io/initial-events-end": "true"}}}}
    assert decode_watch_line(json.dumps(bookmark).encode(), node_subset) == bookmark
    error = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    assert decode_watch_line(json.dumps(error).encode(), node_subset) == error
    odd = {"type": 5, "object": [1, 2]}
    assert decode_watch_line(json.dumps(odd).encode(), node_subset) == odd
    assert decode_watch_line(b'{"type":"ADDED"}', node_subset) == {"type": "ADDED"}
    assert decode_watch_line(b"[1]", node_subset) == [1]
    for garbage in (b"{not json", b'{"type":"ADDED","object":{"metadata":', b"\xff\xfe"):
        with pytest.raises(ValueError):
            decode_watch_line(garbage, node_subset)


@given(items=st.lists(st.one_of(node_objects, json_values), max_size=5),
       rv=st.one_of(st.none(), st.text("0123456789", min_size=1, max_size=5)),
       cont=st.one_of(st.none(), st.text(max_size=5)))
@settings(max_examples=100, deadline=None)
def test_list_pages_decode_each_item(items: list[Any], rv: str | None,
                                     cont: str | None) -> None:
    meta: dict[str, Any] = {}
    if rv is not None:
        meta["resourceVersion"] = rv
    if cont is not None:
        meta["continue"] = cont
    data = json.dumps({"kind": "NodeList", "apiVersion": "v1", "metadata": meta,
                       "items": items}).encode()
    page = decode_list_page(data, node_subset)
    assert page["metadata"] == meta
    assert len(page["items"]) == len(items)
    for got, item in zip(page["items"], items, strict=True):
        assert outcome(node_record, got) == outcome(node_record, item)


def test_odd_list_answers_are_read_as_json_loads_reads_them() -> None:
    for body in ({"items": "x"}, {"metadata": [1]}, [1, 2], {"items": [1], "metadata": 5}):
        data = json.dumps(body).encode()
        assert decode_list_page(data, node_subset) == json.loads(data)
    with pytest.raises(ValueError):
        decode_list_page(b"<html>", node_subset)


def test_plan_subset_keeps_state_and_deletion() -> None:
    plan = {"apiVersion": "autopilot.k0sproject.io/v1beta2", "kind": "Plan",
            "metadata": {"name": "autopilot", "uid": "u", "resourceVersion": "3",
                         "deletionTimestamp": "2026-01-01T00:00:00Z",
                         "managedFields": [{"x": 1}]},
            "spec": {"commands": [{"k0supdate": {"version": "v1"}}]},
            "status": {"state": "SchedulableWait", "commands": [{"id": 0}]}}
    raw = json.dumps(plan).encode()
    record = plan_record(decode_object(raw, plan_subset))
    assert isinstance(record, PlanRecord)
    assert (record, record.uid, record.resource_version) == \
        (plan_record(plan), "u", "3")
    assert record.deleting


def test_watches_reading_the_same_line_share_its_decode_and_record() -> None:
    """A thousand clusters sharing Nodes read the same line on a thousand connections:
    the first is decoded and made into a record, the others are handed both."""
    node = realistic_node(rv="11")
    line = json.dumps({"type": "MODIFIED", "object": node}).encode()
    caches = [node_cache() for _ in range(3)]
    events = [decode_watch_line(bytes(bytearray(line)), node_subset) for _ in caches]
    assert events[0] is events[1] is events[2]
    assert isinstance(events[0]["object"], SharedObject)
    for cache, event in zip(caches, events, strict=True):
        cache.observe(event["object"])
    records = [c.get(node["metadata"]["name"]) for c in caches]
    assert records[0] is records[1] is records[2]
    assert records[0] == node_record(node)
    # another version is decoded again
    node["metadata"]["resourceVersion"] = "12"
    again = decode_watch_line(json.dumps({"type": "MODIFIED", "object": node}).encode(),
                              node_subset)
    assert again is not events[0]
    assert again["object"]["metadata"]["resourceVersion"] == "12"


def test_lines_alike_in_their_first_bytes_are_not_taken_for_one_another() -> None:
    """Remembered lines are found by their first bytes, then compared whole: a line
    that starts as a remembered one but ends otherwise is decoded for itself."""
    node = realistic_node(rv="21")
    first = json.dumps({"type": "MODIFIED", "object": node}).encode()
    node["status"]["nodeInfo"]["kubeletVersion"] = "v1.32.0+k0s"  # near the line's end
    second = json.dumps({"type": "MODIFIED", "object": node}).encode()
    assert first[:LINE_KEY_BYTES] == second[:LINE_KEY_BYTES] and first != second
    a = decode_watch_line(first, node_subset)
    b = decode_watch_line(second, node_subset)
    assert node_record(b["object"]).info.kubelet_version != \
        node_record(a["object"]).info.kubelet_version
    assert decode_watch_line(bytes(bytearray(second)), node_subset) is b  # the newer one
    c = decode_watch_line(bytes(bytearray(first)), node_subset)  # decoded again, not b
    assert c is not b and node_record(c["object"]) == node_record(a["object"])


def test_plain_objects_are_converted_every_time() -> None:
    """Only decoded (shared, unchanged) objects are remembered: a dict that is changed
    and observed again (a write's answer, a test's object) is converted again."""
    calls: list[str] = []

    def convert(obj: dict[str, Any]) -> NodeRecord:
        calls.append(obj["metadata"]["resourceVersion"])
        return node_record(obj)

    remembered = Remembered(convert)
    node = realistic_node(rv="1")
    first = remembered(node)
    node["metadata"]["annotations"][SIGNAL_VERSION_KEY] = "v9"
    node["metadata"]["resourceVersion"] = "2"
    second = remembered(node)
    assert calls == ["1", "2"]
    assert second.annotation(SIGNAL_VERSION_KEY) == "v9" != first.annotation(
        SIGNAL_VERSION_KEY)
    shared = SharedObject(node_subset(json.dumps(node).encode()))
    assert remembered(shared) is remembered(shared)
    assert calls == ["1", "2", "2"]
    assert remembered.hits == 1


def test_the_remembered_lines_are_bounded() -> None:
    decoder = ObjectDecoder(_NodeWire, _node_subset, remember=4)
    node = realistic_node()
    for rv in range(10):
        node["metadata"]["resourceVersion"] = str(rv)
        decode_watch_line(json.dumps({"type": "ADDED", "object": node}).encode(), decoder)
    assert len(decoder._recent) == 4
