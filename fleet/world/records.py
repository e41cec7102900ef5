"""What k0s-fleet keeps of a workload cluster's objects: compact records, made on ingest.

A real Node is 5-20 KB of JSON (container images, managedFields, the kubelet's
conditions and addresses) and several times that as Python objects; the decisions read a
handful of facts. The workload caches hold these records instead, converted once when an
object arrives (a list, a watch event, the answer to one of our own writes); the full
object is never kept.

- :class:`NodeRecord` (a Node, or the autopilot ControlNode of a pure controller): name,
  uid, resourceVersion, k0s-fleet's own annotations (``fleet.k0s-fleet.io/*``) and
  autopilot's signal annotations (what the dispatcher's conflict-checked patches read),
  and the :class:`~fleet.world.model.NodeInfo` the planner, gate, status and extension decide
  on (Ready, unschedulable, architecture, the kubelet's version, a ControlNode's
  ``status.k0sVersion``). Dropped: every other annotation and label, images,
  managedFields, addresses, capacity, taints, the other conditions.
- :class:`PlanRecord` (an autopilot Plan, someone else's rollout): name,
  resourceVersion, ``status.state``, whether it is being deleted.

Two versions of an object with the same facts compare equal (resourceVersion and uid are
not compared), so a cache can take the newer resourceVersion without waking the planner.
``NodeRecord.as_object()`` renders a record back as the JSON subset it keeps: the base of
a patch, sent with that resourceVersion as precondition, so the API server refuses the
patch (409) when the object moved on meanwhile and the patch is re-decided on a fresh read.

Bad input (a watch event or list item of the wrong shape) raises :class:`RecordError`
naming the object and the field.

:func:`node_decoder` and :func:`plan_decoder` read an object's raw JSON straight into
the subset of it that :func:`node_record` / :func:`plan_record` read (msgspec Structs of
those fields only: images, managedFields and the rest are skipped, never built), for the
watches and lists that feed the records (:mod:`fleet.kube.wire`). The record made of the
subset is the record made of the whole object; an object whose fields do not have the
expected types is not taken (``msgspec.ValidationError``) and is read whole, so the
checks above still name what is wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from fleet.contract.signal import AUTOPILOT_SIGNAL_DATA_KEY, AUTOPILOT_SIGNAL_VERSION_KEY, DOMAIN
from fleet.kube.wire import ObjectDecoder
from fleet.world.model import (
    AUTOPILOT_PLAN_LIVE_STATES,
    KIND_CONTROL_NODE,
    KIND_NODE,
    NodeInfo,
    node_from,
)

log = logging.getLogger(__name__)

KEPT_ANNOTATION_PREFIX = f"{DOMAIN}/"
KEPT_ANNOTATIONS = frozenset({AUTOPILOT_SIGNAL_VERSION_KEY, AUTOPILOT_SIGNAL_DATA_KEY})
ARCH_LABEL = "kubernetes.io/arch"
NODE_KINDS = frozenset({KIND_NODE, KIND_CONTROL_NODE})
KIND_PLAN = "Plan"

ObjectKey = tuple[str, str]


class RecordError(ValueError):
    """An object that cannot be made into a record; the message names what is wrong."""


def kept_annotation(key: str) -> bool:
    return key.startswith(KEPT_ANNOTATION_PREFIX) or key in KEPT_ANNOTATIONS


def _object(value: Any, what: str, where: str) -> Mapping[str, Any]:
    """``value`` as a JSON object; absent (None) reads as empty."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RecordError(f"{where}: {what} is a {type(value).__name__}, not an object")
    return value


def _text(value: Any, what: str, where: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise RecordError(f"{where}: {what} is a {type(value).__name__}, not a string")
    return value


def _identity(obj: Any, kind: str) -> tuple[str, str, str, Mapping[str, Any]]:
    """(name, uid, resourceVersion, metadata) of ``obj``; a RecordError when it has none."""
    if not isinstance(obj, Mapping):
        raise RecordError(f"a {kind} must be a JSON object, not a {type(obj).__name__}")
    meta = _object(obj.get("metadata"), "metadata", f"a {kind}")
    name = _text(meta.get("name"), "metadata.name", f"a {kind}")
    if name is None:
        raise RecordError(f"a {kind} without metadata.name")
    where = f"{kind} {name}"
    uid = _text(meta.get("uid"), "metadata.uid", where) or ""
    rv = meta.get("resourceVersion")
    rv = str(rv) if isinstance(rv, int) and not isinstance(rv, bool) else \
        _text(rv, "metadata.resourceVersion", where) or ""
    return name, uid, rv, meta


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A Node or ControlNode as far as k0s-fleet reads it."""

    name: str
    annotations: tuple[tuple[str, str], ...]  # the kept ones, sorted by key
    info: NodeInfo
    uid: str = field(default="", compare=False)
    resource_version: str = field(default="", compare=False)

    @property
    def kind(self) -> str:
        return self.info.kind

    @property
    def key(self) -> ObjectKey:
        return ("", self.name)

    def annotation(self, key: str) -> str | None:
        for k, v in self.annotations:
            if k == key:
                return v
        return None

    def as_object(self) -> dict[str, Any]:
        """The JSON subset this record keeps (``node_from`` of it gives ``info`` back)."""
        n = self.info
        meta: dict[str, Any] = {"name": self.name, "annotations": dict(self.annotations)}
        if self.uid:
            meta["uid"] = self.uid
        if self.resource_version:
            meta["resourceVersion"] = self.resource_version
        node_info: dict[str, Any] = {"architecture": n.arch}
        if n.kubelet_version:
            node_info["kubeletVersion"] = n.kubelet_version
        status: dict[str, Any] = {
            "conditions": [{"type": "Ready", "status": "True" if n.ready else "False"}],
            "nodeInfo": node_info}
        if n.k0s_version:
            status["k0sVersion"] = n.k0s_version
        return {"apiVersion": "v1" if self.kind == KIND_NODE else "autopilot.k0sproject.io/v1beta2",
                "kind": self.kind, "metadata": meta,
                "spec": {"unschedulable": True} if n.unschedulable else {}, "status": status}


def node_record(obj: Any, kind: str = KIND_NODE) -> NodeRecord:
    """The record of a Node (``kind`` Node) or autopilot ControlNode (``kind`` ControlNode)."""
    if kind not in NODE_KINDS:
        raise RecordError(f"not a node kind: {kind!r} (one of {sorted(NODE_KINDS)})")
    name, uid, rv, meta = _identity(obj, kind)
    where = f"{kind} {name}"
    annotations = _object(meta.get("annotations"), "metadata.annotations", where)
    kept: list[tuple[str, str]] = []
    for key, value in annotations.items():
        if kept_annotation(str(key)):
            if not isinstance(value, str):
                raise RecordError(f"{where}: annotation {key} is a {type(value).__name__}, "
                                  "not a string")
            kept.append((str(key), value))
    kept.sort()
    labels = _object(meta.get("labels"), "metadata.labels", where)
    spec = _object(obj.get("spec"), "spec", where)
    status = _object(obj.get("status"), "status", where)
    node_info = _object(status.get("nodeInfo"), "status.nodeInfo", where)
    conditions = status.get("conditions")
    if conditions is not None and not isinstance(conditions, list):
        raise RecordError(f"{where}: status.conditions is a {type(conditions).__name__}, "
                          "not a list")
    ready = [c for c in conditions or [] if isinstance(c, Mapping) and c.get("type") == "Ready"]
    unschedulable = spec.get("unschedulable")
    if unschedulable is not None and not isinstance(unschedulable, bool):
        raise RecordError(f"{where}: spec.unschedulable is a {type(unschedulable).__name__}, "
                          "not a boolean")
    # The facts node_from reads, and nothing else: node_from stays the one parser.
    trimmed = {
        "kind": kind,
        "metadata": {"name": name, "annotations": dict(kept),
                     "labels": {ARCH_LABEL: _text(labels.get(ARCH_LABEL), f"label {ARCH_LABEL}",
                                                  where)}},
        "spec": {"unschedulable": bool(unschedulable)},
        "status": {
            "conditions": [{"type": "Ready", "status": ready[0].get("status")}] if ready else [],
            "nodeInfo": {
                "architecture": _text(node_info.get("architecture"),
                                      "status.nodeInfo.architecture", where),
                "kubeletVersion": _text(node_info.get("kubeletVersion"),
                                        "status.nodeInfo.kubeletVersion", where)},
            "k0sVersion": _text(status.get("k0sVersion"), "status.k0sVersion", where)
            if kind == KIND_CONTROL_NODE else None,
        },
    }
    return NodeRecord(name=name, annotations=tuple(kept), info=node_from(trimmed), uid=uid,
                      resource_version=rv)


@dataclass(frozen=True, slots=True)
class PlanRecord:
    """An autopilot Plan: another driver of a cluster's k0s versions."""

    name: str
    state: str
    deleting: bool
    uid: str = field(default="", compare=False)
    resource_version: str = field(default="", compare=False)

    @property
    def key(self) -> ObjectKey:
        return ("", self.name)

    @property
    def live(self) -> bool:
        """Still driving its cluster (not Completed, not failed, not being deleted)."""
        return self.state in AUTOPILOT_PLAN_LIVE_STATES and not self.deleting

    def as_object(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name}
        if self.uid:
            meta["uid"] = self.uid
        if self.resource_version:
            meta["resourceVersion"] = self.resource_version
        if self.deleting:
            meta["deletionTimestamp"] = "1970-01-01T00:00:00Z"  # the fact, not the time
        return {"apiVersion": "autopilot.k0sproject.io/v1beta2", "kind": KIND_PLAN,
                "metadata": meta, "status": {"state": self.state} if self.state else {}}


def plan_record(obj: Any) -> PlanRecord:
    name, uid, rv, meta = _identity(obj, KIND_PLAN)
    status = _object(obj.get("status"), "status", f"{KIND_PLAN} {name}")
    state = _text(status.get("state"), "status.state", f"{KIND_PLAN} {name}") or ""
    return PlanRecord(name=name, state=state, deleting=bool(meta.get("deletionTimestamp")),
                      uid=uid, resource_version=rv)


def live_autopilot_plan(plans: Iterable[PlanRecord]) -> str | None:
    """'<name> (<state>)' of an autopilot Plan that still drives its cluster, or None."""
    for p in plans:
        if p.live:
            return f"{p.name} ({p.state or 'new'})"
    return None


def node_records(objects: Iterable[Any], kind: str = KIND_NODE) -> list[NodeRecord]:
    """Records of a one-shot list; an object that cannot be read is skipped and logged."""
    out = []
    for obj in objects:
        try:
            out.append(node_record(obj, kind))
        except RecordError as e:
            log.warning("ignoring a %s: %s", kind, e)
    return out


def plan_records(objects: Iterable[Any]) -> list[PlanRecord]:
    out = []
    for obj in objects:
        try:
            out.append(plan_record(obj))
        except RecordError as e:
            log.warning("ignoring an autopilot Plan: %s", e)
    return out


# -- decoding straight into the subset the records read ---------------------------------
# Each Struct names only the fields node_record / plan_record read; msgspec skips every
# other field of the JSON without building it. Leaf values are Any: node_record and
# plan_record check them as they check a whole object's; a container of the wrong kind
# (metadata not an object, conditions not a list of objects) is refused by the Struct
# and the object is read whole.


class _Condition(msgspec.Struct):
    type: Any = None
    status: Any = None


class _NodeInfoWire(msgspec.Struct):
    architecture: Any = None
    kubeletVersion: Any = None


class _NodeStatusWire(msgspec.Struct):
    conditions: list[_Condition] | None = None
    nodeInfo: _NodeInfoWire | None = None
    k0sVersion: Any = None  # checked by node_record (ControlNodes only)


class _NodeSpecWire(msgspec.Struct):
    unschedulable: Any = None


class _MetaWire(msgspec.Struct):
    name: Any = None
    namespace: Any = None
    uid: Any = None
    resourceVersion: Any = None
    deletionTimestamp: Any = None
    # values left as raw JSON: only the kept keys' values are decoded
    annotations: dict[str, msgspec.Raw] | None = None
    labels: dict[str, msgspec.Raw] | None = None


class _NodeWire(msgspec.Struct):
    metadata: _MetaWire | None = None
    spec: _NodeSpecWire | None = None
    status: _NodeStatusWire | None = None


class _PlanStatusWire(msgspec.Struct):
    state: Any = None


class _PlanWire(msgspec.Struct):
    metadata: _MetaWire | None = None
    status: _PlanStatusWire | None = None


_decode_value = msgspec.json.Decoder().decode


def _meta_subset(meta: _MetaWire) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (("name", meta.name), ("namespace", meta.namespace), ("uid", meta.uid),
                       ("resourceVersion", meta.resourceVersion),
                       ("deletionTimestamp", meta.deletionTimestamp)):
        if value is not None:
            out[key] = value
    return out


def _node_subset(wire: _NodeWire) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    meta = wire.metadata
    if meta is not None:
        m = _meta_subset(meta)
        if meta.annotations is not None:
            m["annotations"] = {k: _decode_value(v) for k, v in meta.annotations.items()
                                if kept_annotation(k)}
        if meta.labels is not None:
            arch = meta.labels.get(ARCH_LABEL)
            m["labels"] = {} if arch is None else {ARCH_LABEL: _decode_value(arch)}
        obj["metadata"] = m
    if wire.spec is not None:
        obj["spec"] = {} if wire.spec.unschedulable is None else \
            {"unschedulable": wire.spec.unschedulable}
    status = wire.status
    if status is not None:
        st: dict[str, Any] = {}
        if status.conditions is not None:
            st["conditions"] = [{"type": "Ready", "status": c.status}
                                for c in status.conditions if c.type == "Ready"][:1]
        if status.nodeInfo is not None:
            st["nodeInfo"] = {k: v for k, v in (
                ("architecture", status.nodeInfo.architecture),
                ("kubeletVersion", status.nodeInfo.kubeletVersion)) if v is not None}
        if status.k0sVersion is not None:
            st["k0sVersion"] = status.k0sVersion
        obj["status"] = st
    return obj


def _plan_subset(wire: _PlanWire) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    if wire.metadata is not None:
        obj["metadata"] = _meta_subset(wire.metadata)
    if wire.status is not None:
        obj["status"] = {} if wire.status.state is None else {"state": wire.status.state}
    return obj


# The JSON subset of a Node or ControlNode that node_record reads, straight from its raw
# JSON (msgspec.ValidationError: a container of another kind, read whole instead, where
# node_record names the problem); the watches and lists of the workload caches use it.
node_subset: ObjectDecoder[_NodeWire] = ObjectDecoder(_NodeWire, _node_subset)
# The JSON subset of an autopilot Plan that plan_record reads.
plan_subset: ObjectDecoder[_PlanWire] = ObjectDecoder(_PlanWire, _plan_subset)
