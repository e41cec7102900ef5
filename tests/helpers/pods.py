"""Pods as a drain sees them."""

from __future__ import annotations

from typing import Any

REPLICASET_UID = "00000000-0000-0000-0000-00000000f1ee"


def controlled(name: str = "rs") -> list[dict[str, Any]]:
    """ownerReferences naming a (stand-in) ReplicaSet as the pod's controller: such a pod
    is evicted by a default drain (no garbage collector runs in the test world, so the
    owner need not exist). A pod without a controller refuses the drain unless the
    node policy says ``force`` (as ``kubectl drain`` without ``--force``)."""
    return [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name,
             "uid": REPLICASET_UID, "controller": True}]
