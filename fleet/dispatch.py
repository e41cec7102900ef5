"""The unit of dispatch, shared by the controller's dispatcher and the runtime extension.

A NodePlan's name is a function of (Machine, version), so every dispatcher, on any
replica, concurrent or not, names the same object: creating it dispatches the node;
AlreadyExists means someone already did, and that NodePlan is adopted whatever its
source. Whichever path creates it, the body is the same: the finalizer the NodePlan
reconciler needs (it takes the request off the node before the plan goes away), and the
fleet's node policy only for executor ``agent`` (autopilot has no such field).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fleet.artifacts import Artifact
from fleet.contract.nodeplan import build_nodeplan
from fleet.contract.signal import NodePolicy
from fleet.kube import AlreadyExistsError, KubeClient, KubeObject
from fleet.kube.resources import NODE_PLANS
from fleet.world.executors import executor as executor_named
from fleet.world.model import ANN_DISPATCH_REASON, ANN_REQUESTED_AT, NODEPLAN_FINALIZER, format_time


def nodeplan_to_dispatch(*, machine: dict[str, Any], node_name: str, role: str, version: str,
                         artifact: Artifact, executor: str, owner_kind: str, owner_name: str,
                         traceparent: str | None, node_policy: NodePolicy | None,
                         source: str = "controller") -> KubeObject:
    """The NodePlan body every dispatch path creates."""
    body = build_nodeplan(
        machine=machine, node_name=node_name, role=role, version=version, url=artifact.url,
        sha256=artifact.sha256, allow_unverified=artifact.allow_unverified,
        executor=executor, source=source, owner_kind=owner_kind, owner_name=owner_name,
        traceparent=traceparent,
        node_policy=node_policy if executor_named(executor).carries_policy else None)
    body["metadata"]["finalizers"] = [NODEPLAN_FINALIZER]
    return body


def created_started(body: KubeObject, *, at: datetime, reason: str) -> KubeObject:
    """``body`` to be created started: the first request's identity (attempt 1, its
    ``created`` = ``at``) and why it was dispatched in its annotations, so the node can be
    signalled without a status write first (``fleet.world.model.nodeplan_from`` reads them;
    the CRD defaults ``status.phase`` to Pending until the first status write)."""
    meta = body["metadata"]
    return {**body, "metadata": {**meta, "annotations": {
        **(meta.get("annotations") or {}),
        ANN_REQUESTED_AT: format_time(at), ANN_DISPATCH_REASON: reason}}}


@dataclass(frozen=True, slots=True)
class Dispatched:
    """The NodePlan after a dispatch: ``created`` by this call, or adopted. ``plan`` is
    None only when an existing one vanished before it could be read (attempts spent)."""

    plan: KubeObject | None
    created: bool


async def create_or_adopt_nodeplan(mgmt: KubeClient, body: KubeObject, *,
                                   attempts: int = 1) -> Dispatched:
    """Create ``body``; on AlreadyExists read and adopt the existing NodePlan.

    A NodePlan deleted between our create and our read is tried again, up to
    ``attempts`` creates in all. Other API errors propagate (the caller decides whether
    a create that got no answer may have landed).
    """
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    for _ in range(attempts):
        try:
            return Dispatched(await mgmt.create(NODE_PLANS, body, namespace), created=True)
        except AlreadyExistsError:
            existing = await mgmt.get_or_none(NODE_PLANS, name, namespace)
            if existing is not None:
                return Dispatched(existing, created=False)
    return Dispatched(None, created=False)
