"""Cordon and drain this node through the Eviction API (PodDisruptionBudgets apply).

Cordoning marks the Node with CORDONED_BY_KEY so that only a cordon the agent made is
ever undone by it. Draining follows Cluster API's drain: DaemonSet and mirror pods stay;
a pod labelled ``cluster.x-k8s.io/drain: skip`` stays, ``wait-completed`` is waited for;
otherwise the first MachineDrainRule (carried in the request, in name order) that applies
decides (Skip, WaitCompleted, or Drain in groups by increasing order); every other pod
is evicted in group 0. Evictions a PodDisruptionBudget refuses (429) are retried; each
group is gone before the next starts; the drain gives up at a deadline, reporting which
pods blocked and what it did with each pod.

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
from typing import Any, Literal, NamedTuple

import anyio

from fleet.agents.state import cordon_patch, cordoned_by_agent, eviction_exempt, uncordon_patch
from fleet.contract.selectors import selector_matches
from fleet.contract.signal import DrainBehavior, DrainRule
from fleet.kube import KubeClient, KubeObject, patch_with_retry
from fleet.kube.backoff import Backoff
from fleet.kube.errors import KubeError, NotFoundError, TooManyRequestsError
from fleet.kube.resources import NAMESPACES, NODES, PODS

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


# Cluster API's pod label: "skip" leaves the pod running, "wait-completed" never evicts it
# but waits until it has completed (as a MachineDrainRule's Skip / WaitCompleted).
CAPI_DRAIN_LABEL = "cluster.x-k8s.io/drain"
CAPI_DRAIN_SKIP = "skip"
CAPI_DRAIN_WAIT_COMPLETED = "wait-completed"

Verdict = Literal["evict", "skip", "wait", "refuse"]


class Judgement(NamedTuple):
    """What the drain does with one pod, why, and in which group (``order``: pods are
    drained group by group, by increasing order, as Cluster API does)."""

    verdict: Verdict
    why: str = ""
    order: int = 0


def _rule_applies(rule: DrainRule, pod: KubeObject,
                  namespace_labels: Mapping[str, Mapping[str, str]]) -> bool:
    """A rule applies to a pod when it lists no pods, or when one of its pod selectors
    matches the pod's labels and its namespace selector the namespace's labels."""
    if not rule.pods:
        return True
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    ns_labels = namespace_labels.get(str(meta.get("namespace") or ""), {})
    return any(selector_matches(sel.selector or {}, labels)
               and selector_matches(sel.namespaceSelector or {}, ns_labels)
               for sel in rule.pods)


def judge(pod: KubeObject, *, force: bool = False, delete_emptydir_data: bool = False,
          skip_pods: Sequence[Mapping[str, Any]] = (), rules: Sequence[DrainRule] = (),
          namespace_labels: Mapping[str, Mapping[str, str]] | None = None) -> Judgement:
    """Whether one pod bound to the node being drained is evicted (in which order group),
    left running, waited for until it completes, or refuses the drain, and why (pure: the
    pod, the node policy and the namespaces' labels). As Cluster API decides: DaemonSet
    and mirror pods stay; then the pod's cluster.x-k8s.io/drain label; then the first
    MachineDrainRule (in name order) that applies; otherwise evicted in group 0."""
    why = eviction_exempt(pod)
    if why:
        return Judgement("skip", why)
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    label = labels.get(CAPI_DRAIN_LABEL)
    if label == CAPI_DRAIN_SKIP:
        return Judgement("skip", f"labelled {CAPI_DRAIN_LABEL}: {CAPI_DRAIN_SKIP}")
    if label == CAPI_DRAIN_WAIT_COMPLETED:
        return Judgement("wait", f"labelled {CAPI_DRAIN_LABEL}: {CAPI_DRAIN_WAIT_COMPLETED}")
    for i, sel in enumerate(skip_pods):
        # an empty selector selects every pod (as in a MachineDrainRule)
        if selector_matches(sel, labels):
            return Judgement("skip", f"matches the node policy's skipPods[{i}]")
    order = 0
    rule = next((r for r in rules if _rule_applies(r, pod, namespace_labels or {})), None)
    if rule is not None:
        if rule.behavior is DrainBehavior.SKIP:
            return Judgement("skip", f"MachineDrainRule {rule.name}: Skip")
        if rule.behavior is DrainBehavior.WAIT_COMPLETED:
            return Judgement("wait", f"MachineDrainRule {rule.name}: WaitCompleted")
        order = rule.order
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
        return Judgement("refuse", "; ".join(problems), order)
    return Judgement("evict", f"MachineDrainRule {rule.name}: Drain, order {order}"
                     if rule is not None else "", order)


@dataclass
class Selection:
    evict: list[KubeObject] = field(default_factory=list)  # this round's group
    later: list[KubeObject] = field(default_factory=list)  # groups of a higher order
    waiting: dict[str, str] = field(default_factory=dict)  # pod -> why the drain waits
    skipped: dict[str, str] = field(default_factory=dict)  # pod -> why it stays
    refused: dict[str, str] = field(default_factory=dict)  # pod -> why the drain is refused
    order: int | None = None  # the group drained now


def _done(pod: KubeObject) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def select(pods: list[KubeObject], *, force: bool = False,
           delete_emptydir_data: bool = False,
           skip_pods: Sequence[Mapping[str, Any]] = (), rules: Sequence[DrainRule] = (),
           namespace_labels: Mapping[str, Mapping[str, str]] | None = None) -> Selection:
    """Sort the pods bound to a node into this round's group to evict (the lowest order
    still holding a pod to evict or to wait for), the later groups, those waited for
    (WaitCompleted, in this round's group), those left running and those that refuse the
    drain. Pods that terminated already are neither evicted nor waited for nor asked
    about: Succeeded/Failed pods hold nothing."""
    sel = Selection()
    judged: list[tuple[KubeObject, Judgement]] = []
    for pod in pods:
        j = judge(pod, force=force, delete_emptydir_data=delete_emptydir_data,
                  skip_pods=skip_pods, rules=rules, namespace_labels=namespace_labels)
        if j.verdict == "skip":
            sel.skipped[_pod_id(pod)] = j.why
        elif j.verdict == "refuse" and not _done(pod) \
                and not (pod.get("metadata") or {}).get("deletionTimestamp"):
            sel.refused[_pod_id(pod)] = j.why
        elif j.verdict == "wait" and _done(pod):
            continue
        else:
            judged.append((pod, j))
    pending = [j.order for _p, j in judged if j.verdict in ("evict", "wait", "refuse")]
    sel.order = min(pending) if pending else None
    for pod, j in judged:
        if j.verdict == "wait":
            if j.order == sel.order:
                sel.waiting[_pod_id(pod)] = j.why
            else:
                sel.later.append(pod)
        elif j.order == sel.order:
            sel.evict.append(pod)
        else:
            sel.later.append(pod)
    return sel


@dataclass
class DrainResult:
    evicted: set[str] = field(default_factory=set)
    exempt: dict[str, str] = field(default_factory=dict)
    blocked: dict[str, str] = field(default_factory=dict)  # pod -> last refusal
    refused: dict[str, str] = field(default_factory=dict)  # pod -> why it refuses the drain
    waited: dict[str, str] = field(default_factory=dict)  # pod -> why the drain waited
    remaining: list[str] = field(default_factory=list)
    timed_out: bool = False
    seconds: float = 0.0

    def refusal(self) -> str:
        """The drain refused by the node policy, naming each pod and why."""
        shown = "; ".join(f"{p}: {why}" for p, why in sorted(self.refused.items()))
        return f"drain refused, pods not evicted without the node policy's consent: {shown}"

    def outcomes(self) -> dict[str, str]:
        """What the drain did with each pod it looked at: evicted, left running (why),
        waited for until completed (why), or still on the node."""
        out = {p: "evicted" for p in self.evicted}
        out.update({p: f"left running: {why}" for p, why in self.exempt.items()})
        out.update({p: f"waited for until completed: {why}"
                    for p, why in self.waited.items() if p not in self.remaining})
        for p in self.remaining:
            out[p] = "still on the node" + (f" ({self.blocked[p]})" if p in self.blocked
                                            else f" ({self.waited[p]})" if p in self.waited
                                            else "")
        return out

    def summary(self) -> str:
        parts = [f"{len(self.evicted)} evicted"]
        if self.exempt:
            parts.append(f"{len(self.exempt)} left running (" + ", ".join(
                sorted(set(self.exempt.values()))) + ")")
        done_waiting = [p for p in self.waited if p not in self.remaining]
        if done_waiting:
            parts.append(f"{len(done_waiting)} waited for until completed")
        if self.remaining:
            shown = ", ".join(
                f"{p} ({self.blocked[p]})" if p in self.blocked
                else f"{p} ({self.waited[p]})" if p in self.waited else p
                for p in self.remaining[:5]
            )
            more = f" and {len(self.remaining) - 5} more" if len(self.remaining) > 5 else ""
            parts.append(f"still on the node: {shown}{more}")
        return "; ".join(parts)


def _pod_id(pod: KubeObject) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def needs_namespaces(rules: Sequence[DrainRule]) -> bool:
    """Whether any rule selects pods by their namespace's labels."""
    return any(sel.namespaceSelector for r in rules for sel in r.pods)


async def namespace_labels(client: KubeClient) -> dict[str, dict[str, str]]:
    return {str(ns["metadata"]["name"]): dict(ns["metadata"].get("labels") or {})
            for ns in (await client.list(NAMESPACES)).items}


async def drain(client: KubeClient, node: str, *, timeout: float,
                backoff: Backoff | None = None, force: bool = False,
                delete_emptydir_data: bool = False,
                skip_pods: Sequence[Mapping[str, Any]] = (),
                rules: Sequence[DrainRule] = ()) -> DrainResult:
    """Evict what can be evicted, group by group (Cluster API's drain order), waiting for
    WaitCompleted pods of each group to complete, until nothing is left to evict or wait
    for, or ``timeout`` passes.

    A pod that refuses the drain (see :func:`judge`) stops it before anything more is
    evicted: ``result.refused`` names them (as ``kubectl drain`` checks before evicting)."""
    backoff = backoff or Backoff(initial=0.2, maximum=5.0)
    result = DrainResult()
    t0 = time.monotonic()
    deadline = t0 + timeout
    ns_labels = await namespace_labels(client) if needs_namespaces(rules) else None
    while True:
        pods = (await client.list(PODS, field_selector=f"spec.nodeName={node}")).items
        sel = select(pods, force=force, delete_emptydir_data=delete_emptydir_data,
                     skip_pods=skip_pods, rules=rules, namespace_labels=ns_labels)
        result.exempt.update(sel.skipped)
        result.waited.update(sel.waiting)
        pending = sel.evict
        result.remaining = sorted([*(_pod_id(p) for p in (*pending, *sel.later)),
                                   *sel.waiting, *sel.refused])
        if sel.refused:
            result.refused = sel.refused
            break
        if not pending and not sel.waiting and not sel.later:
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
