"""NodePlan: naming and shape of the durable record of one node's upgrade.

Shared by the standalone controller and the CAPI runtime extension: both create the
same object for the same (Machine, version), so whichever comes second gets
AlreadyExists and adopts it instead of dispatching twice.
"""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum
from typing import Any

from fleet.contract.signal import DOMAIN, NodePolicy
from fleet.contract.versions import K0sVersion
from fleet.kube.resources import MACHINES, NODE_PLANS

LABEL_CLUSTER = "cluster.x-k8s.io/cluster-name"
LABEL_MACHINE = f"{DOMAIN}/machine"
LABEL_VERSION = f"{DOMAIN}/version"
LABEL_OWNER = f"{DOMAIN}/owner"
TRACEPARENT_ANNOTATION = "tracing.k8s.io/traceparent"

_MAX_NAME = 253
_UNSAFE = re.compile(r"[^a-z0-9.-]+")


class NodePlanPhase(StrEnum):
    """NodePlan.status.phase: Pending until the node answers, then the node's own state."""

    PENDING = "Pending"
    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    FAILED = "Failed"


def version_slug(version: str) -> str:
    """DNS-safe spelling of a version: v1.31.3+k0s.0 -> v1.31.3-k0s.0."""
    return _UNSAFE.sub("-", str(K0sVersion.parse(version)).lower())


def nodeplan_name(machine: str, version: str) -> str:
    """Deterministic NodePlan name for (machine, target version)."""
    base = f"{machine}-{version_slug(version)}"
    if len(base) <= _MAX_NAME:
        return base
    digest = hashlib.sha256(base.encode()).hexdigest()[:10]
    # Cut where it may be: a DNS-1123 subdomain's dot-separated labels start and end
    # alphanumeric, so no "." or "-" may remain before the "-<digest>" suffix.
    return f"{base[: _MAX_NAME - 11].rstrip('.-')}-{digest}"


def label_value(value: str) -> str:
    """A label value (<=63 chars, alnum ends) that still identifies ``value``."""
    v = _UNSAFE.sub("-", value.lower()).strip("-.")
    if len(v) <= 63:
        return v
    return f"{v[:52].rstrip('-.')}-{hashlib.sha256(value.encode()).hexdigest()[:10]}"


def build_nodeplan(
    *,
    machine: dict[str, Any],
    node_name: str,
    role: str,
    version: str,
    url: str,
    sha256: str | None,
    allow_unverified: bool = False,
    executor: str = "agent",
    source: str = "controller",
    owner_kind: str = "",
    owner_name: str = "",
    traceparent: str | None = None,
    node_policy: NodePolicy | None = None,
) -> dict[str, Any]:
    """The NodePlan object for a Machine (owner reference = the Machine).

    ``node_policy`` (executor ``agent`` only) is the fleet's drain/verify policy, kept
    in ``spec.nodePolicy`` so every (re)signal of this plan carries the same values."""
    meta = machine["metadata"]
    cluster = machine["spec"]["clusterName"]
    v = str(K0sVersion.parse(version))
    annotations = {TRACEPARENT_ANNOTATION: traceparent} if traceparent else {}
    return {
        "apiVersion": NODE_PLANS.api_version,
        "kind": NODE_PLANS.kind,
        "metadata": {
            "name": nodeplan_name(meta["name"], v),
            "namespace": meta["namespace"],
            "labels": {
                LABEL_CLUSTER: label_value(cluster),
                LABEL_MACHINE: label_value(meta["name"]),
                LABEL_VERSION: version_slug(v),
                **({LABEL_OWNER: label_value(f"{owner_kind}.{owner_name}")} if owner_kind else {}),
            },
            "annotations": annotations,
            "ownerReferences": [{
                "apiVersion": MACHINES.api_version,
                "kind": MACHINES.kind,
                "name": meta["name"],
                "uid": meta["uid"],
                "controller": False,
                "blockOwnerDeletion": False,
            }],
        },
        "spec": {
            "clusterName": cluster,
            "machineName": meta["name"],
            "nodeName": node_name,
            "role": role,
            "ownerKind": owner_kind,
            "ownerName": owner_name,
            "version": v,
            "url": url,
            "sha256": sha256 or "",
            "allowUnverified": allow_unverified,
            "forceUpdate": False,
            "executor": executor,
            "source": source,
            **({"nodePolicy": node_policy.model_dump(mode="json", exclude_none=True)}
               if node_policy is not None else {}),
        },
    }
