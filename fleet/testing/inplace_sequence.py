"""Moving a MachineDeployment's version in place without CAPI's in-place updates: the
sequence as the proof applies it (the controller's own implementation is the paused MD
executor in fleet/planner/core.py, ``_finish_paused_deployment`` and fleet/planner/writer.py).

Cluster API (v1.12-v1.14, default feature gates) replaces every Machine when a
MachineDeployment's ``spec.template.spec.version`` changes: it finds no MachineSet whose
template is up to date and creates one. The sequence below avoids that; it is proven
against the real CAPI manager at both pinned versions (tests/integration/
test_capi_rollouts.py, docs/capi.md). Nothing here runs in production:

1. ``pause``: set ``cluster.x-k8s.io/paused`` on the MachineDeployment (value
   ``k0s-fleet``, so a restarted controller knows the pause is its own), then write the
   target version into its template. The MD controller skips a paused MD.
2. the nodes are upgraded in place (NodePlans, not this module);
3. ``finish``: pause the MachineSet too, write the target into its template and every
   Machine's ``spec.version``, then lift both pauses. CAPI now finds the MachineSet up
   to date: no MachineSet is created and no Machine deleted. (Without the MachineSet's
   pause, a MachineSet reconcile already running with its cached Machines re-applies the
   old ``spec.version``: CAPI v1.12 was seen doing so; the Machines are written once CAPI
   reports the MachineSet ``Paused``, i.e. no reconcile begun before the pause runs.)

:func:`plan_version_move` is the pure decision (or the reason to refuse);
:func:`apply_version_move` does one step's writes, each safe to repeat.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from fleet.kube import KubeClient, patch_with_retry
from fleet.kube.resources import MACHINE_DEPLOYMENTS, MACHINE_SETS, MACHINES, Resource

PAUSED_ANNOTATION = "cluster.x-k8s.io/paused"
PAUSED_BY_US = "k0s-fleet"
# What must be equal between the MD's and the MachineSet's template besides the version.
_TEMPLATE_KEYS = ("bootstrap", "infrastructureRef", "failureDomain", "clusterName")


@dataclass(frozen=True, slots=True)
class InPlaceVersionMove:
    namespace: str
    machine_deployment: str
    machine_set: str
    machines: tuple[str, ...]
    target: str


@dataclass(frozen=True, slots=True)
class VersionMoveRefused:
    reason: str


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _owned_by(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    uid = _meta(owner).get("uid")
    return any(r.get("uid") == uid for r in _meta(obj).get("ownerReferences") or [])


def _template_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}


def plan_version_move(md: Mapping[str, Any], machine_sets: Sequence[Mapping[str, Any]],
                      machines: Sequence[Mapping[str, Any]], target: str
                      ) -> InPlaceVersionMove | VersionMoveRefused:
    """The move of ``md`` to ``target`` in place, or why CAPI would not keep its Machines."""
    name = _meta(md).get("name", "")
    paused = (_meta(md).get("annotations") or {}).get(PAUSED_ANNOTATION)
    if paused is not None and paused != PAUSED_BY_US:
        return VersionMoveRefused(f"MachineDeployment {name} is paused by someone else "
                                  f"({PAUSED_ANNOTATION}={paused!r})")
    own = [s for s in machine_sets if _owned_by(s, md) and not _meta(s).get("deletionTimestamp")]
    if len(own) != 1:
        names = ", ".join(sorted(_meta(s).get("name", "") for s in own)) or "none"
        return VersionMoveRefused(
            f"MachineDeployment {name} has {len(own)} MachineSets ({names}): Cluster API is "
            "rolling it out (or has not created its MachineSet); in place needs exactly one")
    ms = own[0]
    md_spec, ms_spec = _template_spec(md), _template_spec(ms)
    drift = [k for k in _TEMPLATE_KEYS if md_spec.get(k) != ms_spec.get(k)]
    if drift:
        return VersionMoveRefused(
            f"MachineSet {_meta(ms).get('name')} differs from MachineDeployment {name} in "
            f"{', '.join(drift)}: Cluster API replaces its Machines whatever k0s-fleet does")
    mine = [m for m in machines if _owned_by(m, ms)]
    deleting = sorted(_meta(m).get("name", "") for m in mine if _meta(m).get("deletionTimestamp"))
    if deleting:
        return VersionMoveRefused(f"Machines being deleted: {', '.join(deleting)}")
    return InPlaceVersionMove(
        namespace=_meta(md).get("namespace", ""), machine_deployment=name,
        machine_set=_meta(ms).get("name", ""),
        machines=tuple(sorted(_meta(m).get("name", "") for m in mine)), target=target)


def _version_patch(current: Mapping[str, Any], target: str, *, template: bool) -> Any:
    spec = _template_spec(current) if template else (current.get("spec") or {})
    if spec.get("version") == target:
        return None
    body: dict[str, Any] = {"version": target}
    return {"spec": {"template": {"spec": body}}} if template else {"spec": body}


async def apply_version_move(client: KubeClient, move: InPlaceVersionMove, *,
                             step: Literal["pause", "finish"]) -> None:
    """Do one step's writes (each a no-op when already done)."""
    ns, md = move.namespace, move.machine_deployment
    if step == "pause":
        await _pause(client, MACHINE_DEPLOYMENTS, md, ns)
        await patch_with_retry(client, MACHINE_DEPLOYMENTS, md, lambda o: _version_patch(
            o, move.target, template=True), ns)
        return
    # The MachineSet controller re-applies each Machine's spec.version from its cache
    # (server-side apply, forced): a reconcile in flight with the old version would undo
    # the writes below. Paused, it does not run; the pause is lifted once they are done.
    # A reconcile that began before the pause still runs to its end (CAPI v1.12.1 wrote
    # the old version 0.8 s after the pause in an audit log), so the writes wait until
    # CAPI reports the MachineSet Paused: the reconcile that wrote that began after the
    # pause, and controller-runtime runs one reconcile of an object at a time.
    await _pause(client, MACHINE_SETS, move.machine_set, ns)
    await _paused_observed(client, MACHINE_SETS, move.machine_set, ns)
    await patch_with_retry(client, MACHINE_SETS, move.machine_set, lambda o: _version_patch(
        o, move.target, template=True), ns)
    for machine in move.machines:
        await patch_with_retry(client, MACHINES, machine, lambda o: _version_patch(
            o, move.target, template=False), ns)
    await _unpause(client, MACHINE_SETS, move.machine_set, ns)
    await _unpause(client, MACHINE_DEPLOYMENTS, md, ns)


async def _pause(client: KubeClient, res: Resource, name: str, namespace: str) -> None:
    def pause(o: Mapping[str, Any]) -> Any:
        value = (_meta(o).get("annotations") or {}).get(PAUSED_ANNOTATION)
        return None if value is not None else {
            "metadata": {"annotations": {PAUSED_ANNOTATION: PAUSED_BY_US}}}

    await patch_with_retry(client, res, name, pause, namespace)


async def _paused_observed(client: KubeClient, res: Resource, name: str, namespace: str,
                           *, timeout: float = 180.0) -> None:
    """Wait until Cluster API's controller sets the object's ``Paused`` condition True."""
    with anyio.move_on_after(timeout):
        while True:
            obj = await client.get(res, name, namespace)
            if any(c.get("type") == "Paused" and c.get("status") == "True"
                   for c in (obj.get("status") or {}).get("conditions") or []):
                return
            await anyio.sleep(0.2)
    raise TimeoutError(f"{res.kind} {namespace}/{name}: Cluster API did not report it "
                       f"Paused within {timeout:.0f}s")


async def _unpause(client: KubeClient, res: Resource, name: str, namespace: str) -> None:
    def unpause(o: Mapping[str, Any]) -> Any:
        value = (_meta(o).get("annotations") or {}).get(PAUSED_ANNOTATION)
        return {"metadata": {"annotations": {PAUSED_ANNOTATION: None}}} \
            if value == PAUSED_BY_US else None

    await patch_with_retry(client, res, name, unpause, namespace)
