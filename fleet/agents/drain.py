"""Cordon and drain this node through the Eviction API (PodDisruptionBudgets apply).

Cordoning marks the Node with CORDONED_BY_KEY so that only a cordon the agent made is
ever undone by it. Draining evicts every pod bound to the node except DaemonSet and
mirror pods, retries evictions a PodDisruptionBudget refuses (429), waits until the
evicted pods are gone, and gives up at a deadline, reporting which pods blocked.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import anyio

from fleet.agents.state import cordon_patch, cordoned_by_agent, eviction_exempt, uncordon_patch
from fleet.kube import KubeClient, KubeObject, patch_with_retry
from fleet.kube.backoff import Backoff
from fleet.kube.errors import KubeError, NotFoundError, TooManyRequestsError
from fleet.kube.resources import NODES, PODS

log = logging.getLogger(__name__)


async def cordon(client: KubeClient, node: str, owner: str, *,
                 current: KubeObject | None = None) -> bool:
    """Cordon ``node`` unless it already is; True when the cordon is ours to undo."""
    ours = False

    def mutate(obj: KubeObject) -> dict[str, Any] | None:
        nonlocal ours
        ours = cordoned_by_agent(obj)
        return cordon_patch(obj, owner)

    patched = await patch_with_retry(client, NODES, node, mutate, current=current)
    return ours or patched is not None


async def uncordon(client: KubeClient, node: str, *, current: KubeObject | None = None) -> bool:
    """Undo our cordon, if there is one; True when something was undone."""
    patched = await patch_with_retry(client, NODES, node, uncordon_patch, current=current)
    return patched is not None


@dataclass
class DrainResult:
    evicted: set[str] = field(default_factory=set)
    exempt: dict[str, str] = field(default_factory=dict)
    blocked: dict[str, str] = field(default_factory=dict)  # pod -> last refusal
    remaining: list[str] = field(default_factory=list)
    timed_out: bool = False
    seconds: float = 0.0

    def summary(self) -> str:
        parts = [f"{len(self.evicted)} evicted"]
        if self.exempt:
            parts.append(f"{len(self.exempt)} exempt (DaemonSet/mirror)")
        if self.remaining:
            shown = ", ".join(
                f"{p} ({self.blocked[p]})" if p in self.blocked else p
                for p in self.remaining[:5]
            )
            more = f" and {len(self.remaining) - 5} more" if len(self.remaining) > 5 else ""
            parts.append(f"still on the node: {shown}{more}")
        return "; ".join(parts)


def _pod_id(pod: KubeObject) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


async def drain(client: KubeClient, node: str, *, timeout: float,
                backoff: Backoff | None = None) -> DrainResult:
    """Evict what can be evicted until nothing evictable is left or ``timeout`` passes."""
    backoff = backoff or Backoff(initial=0.2, maximum=5.0)
    result = DrainResult()
    t0 = time.monotonic()
    deadline = t0 + timeout
    while True:
        pods = (await client.list(PODS, field_selector=f"spec.nodeName={node}")).items
        pending: list[KubeObject] = []
        for pod in pods:
            why = eviction_exempt(pod)
            if why:
                result.exempt[_pod_id(pod)] = why
            else:
                pending.append(pod)
        result.remaining = sorted(_pod_id(p) for p in pending)
        if not pending:
            break
        retry_after = 0.0
        for pod in pending:
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue  # evicted already; waiting for it to terminate
            wait = await _evict(client, pod, result)
            retry_after = max(retry_after, wait or 0.0)
        now = time.monotonic()
        if now >= deadline:
            result.timed_out = True
            break
        delay = max(backoff.next_delay(), min(retry_after, 5.0))
        await anyio.sleep(min(delay, deadline - now))
    result.seconds = time.monotonic() - t0
    return result


async def _evict(client: KubeClient, pod: KubeObject, result: DrainResult) -> float | None:
    meta = pod["metadata"]
    pid = _pod_id(pod)
    body = {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "deleteOptions": {"preconditions": {"uid": meta.get("uid")}}}
    try:
        await client.create_subresource(PODS, meta["name"], "eviction", body, meta["namespace"])
    except NotFoundError:
        result.evicted.add(pid)
        return None
    except TooManyRequestsError as e:
        result.blocked[pid] = f"eviction refused: {e}"
        return e.retry_after
    except KubeError as e:
        # e.g. 500 for a pod matched by several PDBs, or a changed uid (409): retry
        result.blocked[pid] = f"eviction failed: {e}"
        log.info("evicting %s: %s", pid, e)
        return None
    result.evicted.add(pid)
    result.blocked.pop(pid, None)
    log.info("evicted %s", pid)
    return None
