"""Cordon and drain this node through the Eviction API (PodDisruptionBudgets apply).

Cordoning marks the Node with CORDONED_BY_KEY so that only a cordon the agent made is
ever undone by it. Draining evicts every pod bound to the node except DaemonSet and
mirror pods and pods labelled ``cluster.x-k8s.io/drain: skip`` (Cluster API's label),
retries evictions a PodDisruptionBudget refuses (429), waits until the evicted pods are
gone, and gives up at a deadline, reporting which pods blocked.

Like ``kubectl drain`` without ``--force``/``--delete-emptydir-data``, a pod with no
controller (nothing would recreate it) or with emptyDir volumes (its data is lost) is
not evicted silently: the drain is refused, naming the pods, unless the node policy
allows it (``force``, ``deleteEmptyDirData``). See :func:`select`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from fleet.agents.state import cordon_patch, cordoned_by_agent, eviction_exempt, uncordon_patch
from fleet.kube import KubeClient, KubeObject, patch_with_retry
from fleet.kube.backoff import Backoff
from fleet.kube.errors import KubeError, NotFoundError, TooManyRequestsError
from fleet.kube.resources import NODES, PODS
from fleet.selectors import selector_matches

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


# Cluster API's pod label: a pod carrying it with value "skip" is never drained.
CAPI_DRAIN_LABEL = "cluster.x-k8s.io/drain"
CAPI_DRAIN_SKIP = "skip"

Verdict = Literal["evict", "skip", "refuse"]


def judge(pod: KubeObject, *, force: bool = False, delete_emptydir_data: bool = False,
          skip_pods: Sequence[Mapping[str, Any]] = ()) -> tuple[Verdict, str]:
    """Whether one pod bound to the node being drained is evicted, skipped (left running)
    or refuses the drain, and why (pure: the pod object and the node policy only)."""
    why = eviction_exempt(pod)
    if why:
        return "skip", why
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get(CAPI_DRAIN_LABEL) == CAPI_DRAIN_SKIP:
        return "skip", f"labelled {CAPI_DRAIN_LABEL}: {CAPI_DRAIN_SKIP}"
    labels = meta.get("labels") or {}
    for i, sel in enumerate(skip_pods):
        # an empty selector selects every pod (as in a MachineDrainRule)
        if selector_matches(sel, labels):
            return "skip", f"matches the node policy's skipPods[{i}]"
    problems: list[str] = []
    if not force and not any(
            ref.get("controller") is True for ref in meta.get("ownerReferences") or []):
        problems.append("no controller (would not be recreated; allow with force)")
    if not delete_emptydir_data:
        dirs = [str(v.get("name")) for v in (pod.get("spec") or {}).get("volumes") or []
                if isinstance(v, dict) and "emptyDir" in v]
        if dirs:
            problems.append(f"emptyDir data would be lost ({', '.join(dirs)}; allow with "
                            "deleteEmptyDirData)")
    if problems:
        return "refuse", "; ".join(problems)
    return "evict", ""


@dataclass
class Selection:
    evict: list[KubeObject] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # pod -> why it stays
    refused: dict[str, str] = field(default_factory=dict)  # pod -> why the drain is refused


def select(pods: list[KubeObject], *, force: bool = False,
           delete_emptydir_data: bool = False,
           skip_pods: Sequence[Mapping[str, Any]] = ()) -> Selection:
    """Sort the pods bound to a node into those to evict, those left running and those
    that refuse the drain (pods that terminated already are neither evicted nor asked
    about: Succeeded/Failed pods hold nothing)."""
    sel = Selection()
    for pod in pods:
        phase = (pod.get("status") or {}).get("phase")
        verdict, why = judge(pod, force=force, delete_emptydir_data=delete_emptydir_data,
                             skip_pods=skip_pods)
        if verdict == "skip":
            sel.skipped[_pod_id(pod)] = why
        elif verdict == "refuse" and phase not in ("Succeeded", "Failed") \
                and not (pod.get("metadata") or {}).get("deletionTimestamp"):
            sel.refused[_pod_id(pod)] = why
        else:
            sel.evict.append(pod)
    return sel


@dataclass
class DrainResult:
    evicted: set[str] = field(default_factory=set)
    exempt: dict[str, str] = field(default_factory=dict)
    blocked: dict[str, str] = field(default_factory=dict)  # pod -> last refusal
    refused: dict[str, str] = field(default_factory=dict)  # pod -> why it refuses the drain
    remaining: list[str] = field(default_factory=list)
    timed_out: bool = False
    seconds: float = 0.0

    def refusal(self) -> str:
        """The drain refused by the node policy, naming each pod and why."""
        shown = "; ".join(f"{p}: {why}" for p, why in sorted(self.refused.items()))
        return f"drain refused, pods not evicted without the node policy's consent: {shown}"

    def summary(self) -> str:
        parts = [f"{len(self.evicted)} evicted"]
        if self.exempt:
            parts.append(f"{len(self.exempt)} left running (" + ", ".join(
                sorted(set(self.exempt.values()))) + ")")
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
                backoff: Backoff | None = None, force: bool = False,
                delete_emptydir_data: bool = False,
                skip_pods: Sequence[Mapping[str, Any]] = ()) -> DrainResult:
    """Evict what can be evicted until nothing evictable is left or ``timeout`` passes.

    A pod that refuses the drain (see :func:`judge`) stops it before anything more is
    evicted: ``result.refused`` names them (as ``kubectl drain`` checks before evicting)."""
    backoff = backoff or Backoff(initial=0.2, maximum=5.0)
    result = DrainResult()
    t0 = time.monotonic()
    deadline = t0 + timeout
    while True:
        pods = (await client.list(PODS, field_selector=f"spec.nodeName={node}")).items
        sel = select(pods, force=force, delete_emptydir_data=delete_emptydir_data,
                     skip_pods=skip_pods)
        result.exempt.update(sel.skipped)
        pending = sel.evict
        result.remaining = sorted([*(_pod_id(p) for p in pending), *sel.refused])
        if sel.refused:
            result.refused = sel.refused
            break
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
