"""May UpdateMachine act on this request? Pure checks over what the API server says.

An UpdateMachine request is a hint, not an order: anyone who reaches the extension's port
can send one, and its body is whatever the sender wrote. So before anything is written the
hook reads the live objects (the Machine, its MachineDeployment or K0sControlPlane, the
cluster's Machines, the Node) and acts only when every check here passes:

- ``ExtensionPath``: the cluster's in-place updates are driven through this extension
  (:func:`fleet.extension.activation.extension_active`, the rule the controller's
  sequencer uses to stand aside);
- ``InPlaceUpdateInProgress``: Cluster API is updating this Machine in place right now:
  the live Machine carries ``in-place-updates.internal.cluster.x-k8s.io/update-in-progress``
  and ``runtime.cluster.x-k8s.io/pending-hooks`` lists ``UpdateMachine`` (CAPI v1.12-v1.14
  ``machine_controller_inplace_update.go`` calls the hook only then);
- ``LiveSpecVersion``: the requested version is the live Machine's ``spec.version``;
- ``FleetTarget``: it is the version k0s-fleet wrote (or adopted) on the Machine's
  MachineDeployment / K0sControlPlane (the ``fleet.k0s-fleet.io/version`` record, the one
  the controller keeps as each object's target);
- k0s's skew rules (:mod:`fleet.contract.skew`): not older than what the node runs
  (``NoDowngrade``),
  at most one minor ahead of it (``OneMinorAtATime``), a worker never on a newer minor than
  the cluster's oldest control plane (``WorkersNotNewerThanControlPlanes``), a control plane
  never more than one minor ahead of the oldest worker
  (``WorkersAtMostOneMinorOlder``).

Every failed check is reported, each naming itself, in one message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet.contract.skew import (
    SkewRefusal,
    check_control_plane_move,
    check_worker_move,
)
from fleet.contract.versions import K0sVersion, parse_or_none, same_version

UPDATE_IN_PROGRESS_ANNOTATION = "in-place-updates.internal.cluster.x-k8s.io/update-in-progress"
PENDING_HOOKS_ANNOTATION = "runtime.cluster.x-k8s.io/pending-hooks"
UPDATE_MACHINE_HOOK = "UpdateMachine"

CHECK_EXTENSION_PATH = "ExtensionPath"
CHECK_IN_PLACE = "InPlaceUpdateInProgress"
CHECK_LIVE_VERSION = "LiveSpecVersion"
CHECK_FLEET_TARGET = "FleetTarget"

CHECKS = (CHECK_EXTENSION_PATH, CHECK_IN_PLACE, CHECK_LIVE_VERSION, CHECK_FLEET_TARGET)


@dataclass(frozen=True, slots=True)
class Refusal:
    """One failed check: its name (a check above or a :mod:`fleet.contract.skew` rule) and why."""

    check: str
    message: str

    def __str__(self) -> str:
        return f"{self.check}: {self.message}"


def pending_hooks(annotations: Mapping[str, Any]) -> list[str]:
    """The hooks CAPI's ``runtime.cluster.x-k8s.io/pending-hooks`` annotation lists
    (comma-separated, as ``internal/hooks`` writes it)."""
    raw = annotations.get(PENDING_HOOKS_ANNOTATION)
    if not isinstance(raw, str):
        return []
    return [h.strip() for h in raw.split(",") if h.strip()]


def in_place_update_in_progress(machine: Mapping[str, Any]) -> bool:
    """Cluster API is updating this (live) Machine in place and waits for UpdateMachine."""
    annotations = (machine.get("metadata") or {}).get("annotations") or {}
    return UPDATE_IN_PROGRESS_ANNOTATION in annotations \
        and UPDATE_MACHINE_HOOK in pending_hooks(annotations)


def _version(value: Any) -> K0sVersion | None:
    return parse_or_none(value)


@dataclass(frozen=True, slots=True)
class UpdateSubject:
    """What the hook read before deciding (all from the API servers, except ``requested``).

    ``owner_kind``/``owner_name``: the MachineDeployment or K0sControlPlane the Machine
    belongs to ("" when it belongs to neither); ``owner_found``: that object exists;
    ``owner_target``: k0s-fleet's version record on it (None: none). ``node_version``: what
    the node runs (its running-version annotation; None: not known). ``control_planes`` /
    ``workers``: what the cluster's other nodes run, as far as known.
    """

    requested: str
    machine: Mapping[str, Any]
    role: str  # "controller" | "worker"
    drives: bool
    owner_kind: str = ""
    owner_name: str = ""
    owner_found: bool = False
    owner_target: str | None = None
    node_version: str | None = None
    control_planes: tuple[str, ...] = field(default_factory=tuple)
    workers: tuple[str, ...] = field(default_factory=tuple)

    @property
    def what(self) -> str:
        meta = self.machine.get("metadata") or {}
        return f"Machine {meta.get('namespace', '')}/{meta.get('name', '')}"


def _skew(s: UpdateSubject) -> SkewRefusal | None:
    current = [s.node_version] if s.node_version else []
    node = f"node of {s.what}"
    if s.role == "controller":
        return check_control_plane_move(current, s.workers, s.requested, what=node)
    return check_worker_move(current, s.control_planes, s.requested, what=node)


def check_update_machine(s: UpdateSubject) -> list[Refusal]:
    """Every check that fails for this request (empty: UpdateMachine may act)."""
    out: list[Refusal] = []
    cluster = str((s.machine.get("spec") or {}).get("clusterName") or "")
    namespace = str((s.machine.get("metadata") or {}).get("namespace") or "")
    if not s.drives:
        out.append(Refusal(CHECK_EXTENSION_PATH,
                           f"cluster {namespace}/{cluster} is not on the runtime-extension "
                           f"path (extension.mode, or no ExtensionConfig of ours selects it); "
                           f"k0s-fleet's own sequencer upgrades it"))
    if not in_place_update_in_progress(s.machine):
        out.append(Refusal(CHECK_IN_PLACE,
                           f"Cluster API is not updating {s.what} in place (no "
                           f"{UPDATE_IN_PROGRESS_ANNOTATION} annotation with UpdateMachine "
                           f"pending in {PENDING_HOOKS_ANNOTATION})"))
    live = (s.machine.get("spec") or {}).get("version")
    if not same_version(str(live) if live else None, s.requested):
        out.append(Refusal(CHECK_LIVE_VERSION,
                           f"the request asks for {s.requested} but {s.what} has spec.version "
                           f"{live or '(none)'}"))
    if not s.owner_kind:
        out.append(Refusal(CHECK_FLEET_TARGET,
                           f"{s.what} belongs to no MachineDeployment or K0sControlPlane, so "
                           f"the fleet has no target for it"))
    elif not s.owner_found:
        out.append(Refusal(CHECK_FLEET_TARGET,
                           f"{s.owner_kind} {s.owner_name} of {s.what} not found"))
    elif not s.owner_target:
        out.append(Refusal(CHECK_FLEET_TARGET,
                           f"k0s-fleet has no version record on {s.owner_kind} {s.owner_name} "
                           f"(not adopted yet)"))
    elif not same_version(s.owner_target, s.requested):
        out.append(Refusal(CHECK_FLEET_TARGET,
                           f"the fleet's target for {s.owner_kind} {s.owner_name} is "
                           f"{s.owner_target}, not {s.requested}"))
    if _version(s.requested) is not None:
        refusal = _skew(s)
        if refusal is not None:
            out.append(Refusal(refusal.rule, refusal.message))
    return out


def check_cluster_skew(role: str, desired: str, control_planes: Iterable[str],
                       workers: Iterable[str], *, what: str) -> SkewRefusal | None:
    """CanUpdate*'s view of the cluster: a worker version newer than the oldest control
    plane's minor, or a control-plane version leaving a worker more than one minor
    behind, is not done in place (the move itself is :func:`fleet.contract.skew.check_move`'s)."""
    if role == "controller":
        return check_control_plane_move((), workers, desired, what=what)
    return check_worker_move((), control_planes, desired, what=what)


def refusal_message(what: str, refusals: Iterable[Refusal]) -> str:
    """One line for CAPI's log and the Machine's condition, naming every failed check."""
    return f"{what}: refused by k0s-fleet: " + "; ".join(str(r) for r in refusals)


__all__ = [
    "CHECKS",
    "CHECK_EXTENSION_PATH",
    "CHECK_FLEET_TARGET",
    "CHECK_IN_PLACE",
    "CHECK_LIVE_VERSION",
    "PENDING_HOOKS_ANNOTATION",
    "UPDATE_IN_PROGRESS_ANNOTATION",
    "Refusal",
    "UpdateSubject",
    "check_cluster_skew",
    "check_update_machine",
    "in_place_update_in_progress",
    "pending_hooks",
    "refusal_message",
]
