"""Is a Machine's k0s version the only thing out of date? (docs/controller.md)

Anything else drifting means Cluster API (or k0smotron) replaces the Machine; k0s-fleet
leaves it alone and says why. Every comparison of versions goes through fleet.contract.versions.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from fleet.contract.nodeplan import NodePlanPhase
from fleet.contract.versions import InvalidVersionError, K0sVersion
from fleet.contract.versions import same_version as _same_version
from fleet.world.model import (
    ANN_K0S_CONFIG,
    ANN_MACHINE_RUNNING_VERSION,
    ControlPlaneInfo,
    MachineDeploymentInfo,
    MachineInfo,
    MachineSetInfo,
    NodeInfo,
    NodePlanInfo,
    comparable_k0s_config,
)

# The planner compares the same few version strings thousands of times per pass.
same_version = lru_cache(maxsize=65536)(_same_version)


@lru_cache(maxsize=4096)
def _parses(value: str) -> bool:
    try:
        K0sVersion.parse(value)
    except InvalidVersionError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Eligibility:
    """``up_to_date``: nothing to do. Else ``in_place`` tells whether k0s-fleet may act."""

    up_to_date: bool
    in_place: bool
    reasons: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


UP_TO_DATE = Eligibility(up_to_date=True, in_place=False)


def _version_problem(label: str, value: str | None) -> str | None:
    if value is None or value == "":
        return f"{label} has no version"
    if not isinstance(value, str) or not _parses(value):
        return f"{label} version {value!r} is not a k0s version"
    return None


_K0S_BUILD = re.compile(r"\+k0s\.\d+$")


def kubelet_form(version: str) -> str:
    """What a k0s kubelet reports for k0s ``version``: ``v1.31.3+k0s.0`` -> ``v1.31.3+k0s``
    (the k0s build number is not visible there)."""
    return _K0S_BUILD.sub("+k0s", version.strip())


def node_reports(node: NodeInfo | None, target: str | None) -> bool | None:
    """Whether the node itself reports running ``target``; None when it says nothing.

    The agent's running-version annotation decides; a node without one (a stock k0s node)
    is judged by its kubelet version, which names the Kubernetes release only.
    """
    if node is None or target is None:
        return None
    if node.running_version:
        return same_version(node.running_version, target)
    if node.kubelet_version:
        return node.kubelet_version.strip() == kubelet_form(target)
    return None


def worker_is_up_to_date(machine: MachineInfo, target: str | None,
                         node: NodeInfo | None = None) -> bool:
    """A worker is up to date when its spec or its recorded running version is the target
    AND its node, when it says anything, reports the target.

    The Machine's ``spec.version`` alone is not enough: with CAPI's in-place updates,
    CAPI sets it when it moves the Machine to the new MachineSet, before UpdateMachine has
    run; and a node rolled back keeps its recorded version. What the node reports decides.
    """
    recorded = same_version(machine.version, target) or same_version(
        machine.running_version_annotation, target)
    return recorded and node_reports(node, target) is not False


def completion_deferred(md: MachineDeploymentInfo, version: str) -> bool:
    """k0s-fleet's paused in-place sequence of ``md`` runs for ``version``: a worker's
    completion is recorded on its Machine (the running-version annotation, in the same
    request as its ``spec.version``) at the end of that sequence, and until then its
    Completed NodePlan is the record (one Machine write per worker instead of two)."""
    return md.capi_paused and same_version(md.paused_for, version) \
        and same_version(md.object_version, version)


def as_recorded(machine: MachineInfo, md: MachineDeploymentInfo,
                plan: NodePlanInfo | None) -> MachineInfo:
    """``machine`` with its in-place completion recorded as it will be: a Completed
    NodePlan of the controller whose record waits for the end of the paused sequence
    (:func:`completion_deferred`) counts as the running-version annotation. A NodePlan
    deleted before that end takes the record with it: the node is upgraded again (a
    no-op for a node that runs the version) and recorded then."""
    if plan is None or plan.phase != NodePlanPhase.COMPLETED or plan.deleting \
            or plan.source != "controller" or plan.machine != machine.ref.name \
            or same_version(machine.running_version_annotation, plan.version) \
            or not completion_deferred(md, plan.version):
        return machine
    return dataclasses.replace(machine, annotations={
        **machine.annotations, ANN_MACHINE_RUNNING_VERSION: plan.version})


def as_recorded_control_plane(machine: MachineInfo, kcp: ControlPlaneInfo,
                              plan: NodePlanInfo | None) -> MachineInfo:
    """A control-plane ``machine`` whose Completed NodePlan (the controller's) is on
    ``kcp``'s target, with the ``spec.version`` the completion's own patch writes: the
    pass after the completion, that write may still be on its way (it is retried each
    pass until it lands), and the object's status would say "0/1" for that round trip
    only to be written again (one request per control-plane upgrade)."""
    if plan is None or plan.phase != NodePlanPhase.COMPLETED or plan.deleting \
            or plan.source != "controller" or plan.machine != machine.ref.name \
            or not same_version(plan.version, kcp.version) \
            or same_version(machine.version, plan.version):
        return machine
    return dataclasses.replace(machine, version=plan.version)


def machine_deployment_eligibility(machine: MachineInfo, md: MachineDeploymentInfo,
                                   machine_set: MachineSetInfo | None,
                                   node: NodeInfo | None = None) -> Eligibility:
    """MD rule: only spec.template.spec.version differs; template references unchanged.

    The Machine's MachineSet carries the templates it was created from; any difference from
    the MachineDeployment's current template (bootstrap config template, infrastructure
    template, failure domain) means a new MachineSet and machine replacement.
    """
    if problem := _version_problem(f"{md.ref}", md.version):
        return Eligibility(False, False, (problem,))
    if worker_is_up_to_date(machine, md.version, node):
        return UP_TO_DATE
    reasons: list[str] = []
    if problem := _version_problem(f"machine {machine.ref.name}", machine.version):
        reasons.append(problem)
    if md.strategy not in ("RollingUpdate", "OnDelete", ""):
        reasons.append(f"rollout strategy {md.strategy!r} is not supported")
    if machine.deleting:
        reasons.append("machine is being deleted")
    if machine_set is None:
        reasons.append(
            f"MachineSet {machine.machine_set or '(none)'} not found: cannot tell whether "
            "only the version changed")
    else:
        if machine_set.bootstrap != md.bootstrap:
            reasons.append(f"bootstrap template changed ({machine_set.bootstrap} -> "
                           f"{md.bootstrap})")
        if machine_set.infrastructure != md.infrastructure:
            reasons.append(f"infrastructure template changed ({machine_set.infrastructure} -> "
                           f"{md.infrastructure})")
        if (machine_set.failure_domain or None) != (md.failure_domain or None):
            reasons.append(f"failure domain changed ({machine_set.failure_domain} -> "
                           f"{md.failure_domain})")
    return Eligibility(False, not reasons, tuple(reasons))


def _machine_k0s_config(machine: MachineInfo) -> dict[str, Any] | None:
    raw = machine.annotations.get(ANN_K0S_CONFIG)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return comparable_k0s_config(value) if isinstance(value, dict) else None


def _normalised(value: Any) -> Any:
    """JSON value with empty containers and nulls dropped (Go's omitempty marshalling)."""
    if isinstance(value, Mapping):
        out = {k: _normalised(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, {}, [], "", False)}
    if isinstance(value, list):
        return [_normalised(v) for v in value]
    return value


def control_plane_eligibility(machine: MachineInfo, kcp: ControlPlaneInfo) -> Eligibility:
    """k0smotron's rule: version differs, infra Machine still cloned from the current
    template, the Machine's k0s-config annotation still equals k0sConfigSpec, and the
    K0sControlPlane asks for InPlace updates."""
    if problem := _version_problem(f"{kcp.ref}", kcp.version):
        return Eligibility(False, False, (problem,))
    if same_version(machine.version, kcp.version):
        return UP_TO_DATE
    reasons: list[str] = []
    if problem := _version_problem(f"machine {machine.ref.name}", machine.version):
        reasons.append(problem)
    if kcp.update_strategy != "InPlace":
        reasons.append(f"updateStrategy is {kcp.update_strategy}")
    if machine.deleting:
        reasons.append("machine is being deleted")
    infra = machine.infra
    want = kcp.infrastructure
    if infra is None or infra.error:
        reasons.append("infrastructure machine unreadable"
                       + (f": {infra.error}" if infra and infra.error else ""))
    elif want is None:
        reasons.append("K0sControlPlane has no machineTemplate.infrastructureRef")
    elif (infra.cloned_from_name, infra.cloned_from_group_kind) != (want.name, want.group_kind):
        reasons.append(
            f"infrastructure template changed ({infra.cloned_from_group_kind}/"
            f"{infra.cloned_from_name} -> {want})")
    config = _machine_k0s_config(machine)
    if config is None:
        reasons.append(f"machine has no readable {ANN_K0S_CONFIG} annotation")
    else:
        have, want_cfg = _normalised(config), _normalised(kcp.k0s_config)
        if have != want_cfg:
            changed = sorted(k for k in set(have) | set(want_cfg)
                             if have.get(k) != want_cfg.get(k))
            reasons.append(f"k0sConfigSpec changed ({', '.join(changed)})")
    return Eligibility(False, not reasons, tuple(reasons))
