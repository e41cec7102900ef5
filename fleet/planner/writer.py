"""One writer of versions, and never two drivers. Pure; used by the planner's pass.

*One writer.* k0s-fleet writes ``K0sControlPlane.spec.version`` and
``MachineDeployment.spec.template.spec.version`` of every cluster of the fleet itself,
when a FleetUpgrade (fleet/world/intent.py) asks for a version and the rollout policy admits the
cluster, control planes before workers. At first sight it adopts the version the object
says (annotation ``fleet.k0s-fleet.io/version``, its record); from then on, the record
(or the FleetUpgrade's version) is the target. A version that differs from the record was
written by someone else: reported (condition ``K0sFleetVersionWriter=False`` + Warning
Event) and never raced (no node starts) until it is set back, or a FleetUpgrade asks for
exactly that version (then it is adopted). This holds whether or not a FleetUpgrade covers
the cluster: a hand-edited version is never a target.

*Executor "paused in place"* (control planes, and workers without Cluster API in-place
updates): the version is written in the same patch that sets ``cluster.x-k8s.io/paused``
and k0s-fleet's record of that pause (``fleet.k0s-fleet.io/paused-for``), so neither
k0smotron nor the MachineDeployment controller ever sees the new version unpaused. Nodes
are upgraded through NodePlans; each Machine's ``spec.version`` follows as it completes
(workers: the MachineSet's template too); the pause is released only when every Machine
is on the target. A restarted controller finds the record and carries on.

*Never two drivers.* Before a node starts, nobody else may be moving the object: a
Cluster API rollout (another MachineSet of the MD with replicas, Machines being
deleted), Cluster API in-place updates driven by another extension (its annotations on
a Machine), an unpaused K0sControlPlane whose Machines are not on its version
(k0smotron's own rollout). Any of them holds the object with condition
``K0sFleetOtherDriver=True`` naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fleet.contract.skew import SkewRefusal, check_move
from fleet.contract.versions import same_version
from fleet.planner import conditions as C
from fleet.planner.actions import Action, RecordWrittenVersion, ReleasePause, WriteVersion
from fleet.world.model import (
    ControlPlaneInfo,
    MachineDeploymentInfo,
    MachineInfo,
    MachineSetInfo,
)

# Cluster API's in-place update markers on a Machine (set by the owner of the Machine
# and by the MachineSet controller while an UpdateMachine hook is pending or running).
ANN_CAPI_UPDATE_IN_PROGRESS = "in-place-updates.internal.cluster.x-k8s.io/update-in-progress"
ANN_CAPI_PENDING_HOOKS = "runtime.cluster.x-k8s.io/pending-hooks"

Owner = MachineDeploymentInfo | ControlPlaneInfo

EXTENSION_HOLD_REASON = ("Cluster API drives in-place updates of this cluster through the "
                         "runtime extension")


class ExtensionDrives(str):
    """A hold that means: Cluster API drives this cluster's worker in-place updates through
    k0s-fleet's runtime extension (fleet/extension/exclusion.py). The planner starts no
    worker itself there, but, for objects under a FleetUpgrade, still writes the
    MachineDeployment's version (unpaused: Cluster API calls the hooks, which hold each node
    while the policy does) and runs control planes with its paused executor. ``inner`` is
    the rollout policy's own answer for the object (None: admitted)."""

    inner: str | None

    def __new__(cls, reason: str, inner: str | None) -> ExtensionDrives:
        obj = super().__new__(cls, reason)
        obj.inner = inner
        return obj


@dataclass(frozen=True, slots=True)
class VersionStep:
    """What the writer decides for one object this pass."""

    actions: tuple[Action, ...] = ()
    waiting: str = ""  # non-empty: start no node of this object now, and why
    writer: tuple[str, str, str] | None = None  # (status, reason, message) of VERSION_WRITER
    conflict: bool = False


@dataclass(frozen=True, slots=True)
class OtherDriver:
    reason: str  # a condition reason (conditions.R_*)
    message: str


def enrolled(obj: Owner) -> bool:
    """k0s-fleet has recorded this object's version (it wrote or adopted it), or a
    FleetUpgrade covers its cluster. Every object of a fleet cluster is enrolled from its
    first pass on (:func:`version_step` adopts it)."""
    return obj.intent is not None or obj.written_version is not None


def version_step(obj: Owner, *, hold: str | None, write_blocked: str,
                 pause: bool = True, skew: SkewRefusal | None = None) -> VersionStep:
    """The writer's decision for one MD/KCP whose target is ``obj.version``.

    ``hold`` is the rollout policy's (not admitted, paused, window closed...) and
    ``write_blocked`` any other reason not to write now (Cluster paused, halted, control
    planes first); neither matters once the version is written. ``skew``: k0s's version
    skew rules refuse moving this object to its target now (fleet/contract/skew.py); the version
    is then not written, whoever asked for it.
    """
    spec, written, target = obj.object_version, obj.written_version, obj.version
    label = "spec.template.spec.version" if isinstance(obj, MachineDeploymentInfo) \
        else "spec.version"
    if written is None:
        # First sight: what the object says now is the baseline (k0s-fleet's record).
        if spec is None:
            return VersionStep(waiting=f"{label} is not set", writer=(
                "False", C.R_CHANGED_BY_OTHER, f"{label} is not set"))
        return VersionStep(
            actions=(RecordWrittenVersion(obj.ref, spec, obj.intent),),
            waiting=f"adopting {obj.ref.kind}: k0s-fleet writes its version from now on "
                    f"(recording {spec})",
            writer=("True", C.R_WRITTEN, f"version {spec} adopted by k0s-fleet"))
    if not same_version(spec, written):
        jump = check_move(written, spec, what=obj.ref.kind) if spec is not None else None
        if obj.intent is not None and target is not None and same_version(spec, target) \
                and jump is None:
            # The FleetUpgrade asks for exactly what was written: adopt it.
            return VersionStep(
                actions=(RecordWrittenVersion(obj.ref, spec or target, obj.intent),),
                waiting=f"adopting {label} {spec} (the FleetUpgrade asks for it)",
                writer=("True", C.R_WRITTEN, f"version {spec} adopted by k0s-fleet"))
        message = (f"{label} was changed to {spec} by someone else (k0s-fleet wrote "
                   f"{written}); k0s-fleet writes versions itself and starts no node of "
                   f"this object until it is set back to {written}"
                   + (f" or a FleetUpgrade asks for {spec}" if spec and jump is None
                      else f" ({jump})" if jump is not None else ""))
        return VersionStep(waiting=message, conflict=True,
                           writer=("False", C.R_CHANGED_BY_OTHER, message))
    ok = ("True", C.R_WRITTEN, f"version {written} written by k0s-fleet")
    if target is not None and not same_version(spec, target):
        if obj.capi_paused and obj.paused_for is None:
            return VersionStep(waiting=f"{obj.ref.kind} is paused (cluster.x-k8s.io/paused, "
                                       "not by k0s-fleet)", writer=ok)
        if hold is not None:
            return VersionStep(waiting=f"held: {hold or 'paused'}", writer=ok)
        if write_blocked:
            return VersionStep(waiting=write_blocked, writer=ok)
        if skew is not None:
            return VersionStep(waiting=f"not written: k0s's version skew policy refuses "
                                       f"it ({skew})", writer=ok)
        return VersionStep(
            actions=(WriteVersion(obj.ref, target, expected=spec, pause=pause,
                                  intent=obj.intent),),
            waiting=f"writing {label} {target}" + (" (paused for k0s-fleet)" if pause else ""),
            writer=("True", C.R_WRITTEN, f"writing version {target}"))
    return VersionStep(writer=ok)


@dataclass(frozen=True, slots=True)
class TemplateStep:
    """What the writer decides for an MD's worker bootstrap template this pass."""

    actions: tuple[Action, ...] = ()
    hold_write: str = ""  # non-empty: do not write the MD's version this pass, and why
    conflict: str = ""  # non-empty: someone else changed the template's version
    note: str = ""  # for the VERSION_WRITER message: what k0s-fleet does with the template


def template_step(md: MachineDeploymentInfo) -> TemplateStep:
    """The one writer for the MD's worker bootstrap template (K0sWorkerConfigTemplate).

    k0smotron installs the template's ``spec.template.spec.version``, when set, on every
    new worker Machine (else the Machine's version). Where a cluster keeps it in step with
    the MD (equal to the MD's version when k0s-fleet adopts them), k0s-fleet adopts it with
    the MD and writes it right after each MD version it writes; a version someone else
    writes into it is reported and holds the MD's nodes, as on the MD itself. A template
    with no version, one out of step, or one several MachineDeployments share is left
    alone (said in the note)."""
    tpl = md.worker_template
    if tpl is None or tpl.version is None:
        return TemplateStep()
    name = f"{tpl.ref.kind} {tpl.ref.name}"
    tv, trec = tpl.version, tpl.written_version
    mrec, mspec = md.written_version, md.object_version
    if tpl.users > 1:
        return TemplateStep(note=f"{name} is shared by {tpl.users} MachineDeployments: "
                                 "k0s-fleet does not write its version")
    if trec is None:
        if same_version(tv, mrec if mrec is not None else mspec):
            return TemplateStep(
                actions=(RecordWrittenVersion(tpl.ref, tv, md.intent),),
                hold_write=f"adopting {name} (version {tv}) with the MachineDeployment")
        return TemplateStep(note=f"{name} says {tv}, not the MachineDeployment's version: "
                                 "not kept in step, k0s-fleet leaves it alone")
    if not same_version(tv, trec):
        if mrec is not None and same_version(tv, mrec):
            # someone wrote exactly what k0s-fleet would have: adopt it
            return TemplateStep(actions=(RecordWrittenVersion(tpl.ref, tv, md.intent),))
        return TemplateStep(conflict=(
            f"{name}: spec.template.spec.version was changed to {tv} by someone else "
            f"(k0s-fleet wrote {trec}); k0s-fleet writes versions itself and starts no node "
            f"of this MachineDeployment until it is set back to {trec}"))
    if mrec is not None and not same_version(trec, mrec) and same_version(mspec, mrec):
        return TemplateStep(
            actions=(WriteVersion(tpl.ref, mrec, expected=tv, pause=False,
                                  intent=md.intent),),
            note=f"writing {name} version {mrec}")
    return TemplateStep(note=f"{name} kept at the MachineDeployment's version")


EXECUTOR_PAUSED_IN_PLACE = "paused-in-place"
EXECUTOR_CAPI_IN_PLACE = "capi-in-place"
EXECUTOR_ON_DELETE = "capi-on-delete"
EXECUTOR_HOSTED = "k0smotron-hosted"


def executor_of(obj: Owner, *, capi_drives: bool = False) -> tuple[str, str]:
    """How this object's nodes get upgraded, and why (shown by ``k0s-fleet plan``).
    ``capi_drives``: Cluster API drives the cluster's workers through our extension."""
    if capi_drives and isinstance(obj, MachineDeploymentInfo):
        return (EXECUTOR_CAPI_IN_PLACE,
                "Cluster API's in-place updates are active and k0s-fleet's runtime extension "
                "is registered: k0s-fleet writes the version unpaused and Cluster API calls "
                "UpdateMachine, which starts each node only while the rollout policy admits "
                "it")
    if isinstance(obj, MachineDeploymentInfo) and obj.strategy == "OnDelete":
        return (EXECUTOR_ON_DELETE,
                "rollout strategy OnDelete: k0s-fleet writes the version unpaused when the "
                "rollout policy admits the cluster and upgrades no node in place; Cluster API "
                "replaces each Machine you delete with one on the new version")
    if isinstance(obj, ControlPlaneInfo) and obj.hosted:
        return (EXECUTOR_HOSTED,
                "a hosted control plane (k0smotron runs it as pods in the management "
                "cluster): k0s-fleet writes its version when the rollout policy admits the "
                "cluster and waits for k0smotron to report it with every replica ready; the "
                "cluster's workers are held until then")
    if isinstance(obj, ControlPlaneInfo):
        return (EXECUTOR_PAUSED_IN_PLACE,
                "k0s-fleet pauses k0smotron (cluster.x-k8s.io/paused) with the version it "
                "writes, upgrades one control plane at a time through NodePlans, sets each "
                "Machine's version as it completes and unpauses when all are on it")
    return (EXECUTOR_PAUSED_IN_PLACE,
            "no Cluster API in-place update drives this MachineDeployment: k0s-fleet pauses "
            "it with the version it writes, upgrades nodes within maxUnavailable through "
            "NodePlans, moves the Machines' and MachineSet's versions to the target and "
            "unpauses (the sequence found to keep Cluster API v1.12/v1.14 from creating a "
            "MachineSet or deleting a Machine)")


def release_pause(obj: Owner, machines: Sequence[MachineInfo], *, in_flight: bool,
                  machine_sets: Iterable[MachineSetInfo] = ()) -> Action | None:
    """k0s-fleet's own pause of a finished object is released once every Machine (and,
    for an MD, every MachineSet template) says the target and nothing is in flight."""
    target = obj.version
    if (obj.paused_for is None or not obj.capi_paused or in_flight or target is None
            or not same_version(obj.object_version, target)):
        return None
    if any(not same_version(m.version, target) for m in machines if not m.deleting):
        return None
    if any(not same_version(ms.version, target) for ms in machine_sets):
        return None
    return ReleasePause(obj.ref, target)


def other_driver(obj: Owner, machines: Sequence[MachineInfo],
                 machine_sets: Sequence[MachineSetInfo] = (), *,
                 autopilot_plan: str | None = None) -> OtherDriver | None:
    """Who else moves this object right now (None: nobody)."""
    if autopilot_plan is not None:
        return OtherDriver(C.R_AUTOPILOT_PLAN,
                           f"autopilot Plan {autopilot_plan} is running in the workload "
                           "cluster (k0smotron's or someone else's rollout)")
    for m in machines:
        if ANN_CAPI_UPDATE_IN_PROGRESS in m.annotations or "UpdateMachine" in (
                m.annotations.get(ANN_CAPI_PENDING_HOOKS) or ""):
            return OtherDriver(C.R_OTHER_EXTENSION,
                               f"Machine {m.ref.name} is being updated in place by Cluster API "
                               "through another runtime extension")
    if isinstance(obj, MachineDeploymentInfo):
        live = [ms for ms in machine_sets if ms.replicas > 0]
        if len(live) > 1:
            newest = max(live, key=lambda ms: (ms.created is not None, ms.created, ms.ref.name))
            return OtherDriver(C.R_CAPI_ROLLOUT,
                               f"Cluster API rolls out the MachineDeployment: MachineSet "
                               f"{newest.ref.name} has {newest.replicas} replica(s) next to "
                               f"{len(live) - 1} other MachineSet(s) with replicas")
        deleting = sorted(m.ref.name for m in machines if m.deleting)
        if deleting:
            return OtherDriver(C.R_CAPI_ROLLOUT,
                               "Cluster API is deleting Machine(s) of the MachineDeployment: "
                               + ", ".join(deleting[:5]))
        return None
    if enrolled(obj) and not obj.capi_paused and obj.version is not None and any(
            not same_version(m.version, obj.object_version) for m in machines
            if not m.deleting):
        why = ("k0s-fleet's pause (cluster.x-k8s.io/paused) was removed by someone else"
               if obj.paused_for is not None else "the K0sControlPlane is not paused")
        return OtherDriver(C.R_PAUSE_REMOVED if obj.paused_for is not None else C.R_K0SMOTRON,
                           f"{why} while Machines are not on {obj.object_version}: "
                           "k0smotron rolls them itself")
    return None


__all__ = [
    "ANN_CAPI_PENDING_HOOKS",
    "ANN_CAPI_UPDATE_IN_PROGRESS",
    "EXTENSION_HOLD_REASON",
    "ExtensionDrives",
    "OtherDriver",
    "TemplateStep",
    "VersionStep",
    "enrolled",
    "executor_of",
    "other_driver",
    "release_pause",
    "template_step",
    "version_step",
]
