"""The rollout policy as Cluster API's UpdateMachine hook sees it. Pure.

When Cluster API drives a MachineDeployment's in-place update through k0s-fleet's runtime
extension, the hook is asked to start a node: it answers "not yet" (``retryAfterSeconds``)
while the fleet's policy holds that cluster or object, exactly as the standalone sequencer
would not start one: emergency stop, fleet pause, a halted rollout, the cluster paused
(annotation, fleet config entry, ``spec.paused``), the MachineDeployment paused, a closed
maintenance window, or a wave that has not admitted the cluster (the admission the
controller recorded in the rollout ConfigMap before its first start). And the one-writer
rule (fleet/planner/writer.py): no node starts while the MachineDeployment's version is not
the one k0s-fleet wrote or adopted (someone else edited it, or the controller has not
adopted the object yet).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from fleet.config.models import FleetConfig
from fleet.config.schedule import window_open
from fleet.contract.versions import same_version
from fleet.rollout.annotations import ANN_PAUSED, ROLLOUT_CONFIGMAP, switch
from fleet.rollout.gate import FleetControls
from fleet.rollout.state import RolloutState
from fleet.world.model import ANN_WRITTEN_VERSION, KIND_MD

HELD_RETRY_SECONDS = 30


@dataclass(frozen=True, slots=True)
class HookSubject:
    """What the hook knows of the Machine's cluster and owner."""

    namespace: str
    cluster: str
    cluster_labels: Mapping[str, str] = field(default_factory=dict)
    cluster_annotations: Mapping[str, str] = field(default_factory=dict)
    cluster_spec_paused: bool = False
    owner_kind: str = ""
    owner_name: str = ""
    owner_annotations: Mapping[str, str] = field(default_factory=dict)
    # the MachineDeployment's spec.template.spec.version (None: the MD was not read)
    owner_version: str | None = None
    # its worker bootstrap template (K0sWorkerConfigTemplate): name, version and
    # annotations (version None: no such template, none set, or not read)
    template_name: str = ""
    template_version: str | None = None
    template_annotations: Mapping[str, str] = field(default_factory=dict)


def hook_hold(config: FleetConfig, controls: FleetControls, state: RolloutState,
              subject: HookSubject, now: datetime) -> str | None:
    """Why no node of ``subject`` may start now (None: go)."""
    rollout = config.rollout
    if rollout.emergency_stop:
        return "emergency stop (rollout.emergencyStop in the fleet config)"
    if controls.emergency_stop is not None:
        return f"emergency stop (annotation on ConfigMap {ROLLOUT_CONFIGMAP}" + (
            f": {controls.emergency_stop})" if controls.emergency_stop else ")")
    if state.halted is not None:
        return f"rollout halted: {state.halted.reason}"
    if rollout.paused:
        return "rollout paused (rollout.paused in the fleet config)"
    if controls.paused is not None:
        return f"rollout paused (annotation on ConfigMap {ROLLOUT_CONFIGMAP}" + (
            f": {controls.paused})" if controls.paused else ")")
    settings = config.for_cluster(subject.namespace, subject.cluster, subject.cluster_labels)
    if (reason := switch(subject.cluster_annotations, ANN_PAUSED)) is not None:
        return f"cluster paused by annotation {ANN_PAUSED}" + (f": {reason}" if reason else "")
    if settings.paused:
        return "cluster paused in the fleet config"
    if subject.cluster_spec_paused:
        return "Cluster is paused (spec.paused)"
    if (reason := switch(subject.owner_annotations, ANN_PAUSED)) is not None:
        return f"{subject.owner_kind or 'object'} paused by annotation {ANN_PAUSED}" + (
            f": {reason}" if reason else "")
    if (writer := _writer_hold(subject)) is not None:
        return writer
    if not window_open(settings.maintenance_windows, now):
        return "outside the cluster's maintenance window"
    if f"{subject.namespace}/{subject.cluster}" not in state.admitted:
        return f"wave {settings.wave.name} has not admitted the cluster yet"
    return None


def _writer_hold(subject: HookSubject) -> str | None:
    if subject.owner_kind != KIND_MD or subject.owner_version is None:
        return None
    written = subject.owner_annotations.get(ANN_WRITTEN_VERSION)
    if not written:
        return (f"k0s-fleet has not adopted MachineDeployment {subject.owner_name} yet (no "
                f"{ANN_WRITTEN_VERSION} record)")
    if not same_version(subject.owner_version, written):
        return (f"MachineDeployment {subject.owner_name}: spec.template.spec.version was "
                f"changed to {subject.owner_version} by someone else (k0s-fleet wrote "
                f"{written}); k0s-fleet writes versions itself")
    # The template k0s-fleet keeps in step with the MD (it recorded a version there): a
    # version someone else wrote into it holds the MD's nodes, as the controller does
    # (what k0s-fleet would have written itself, the MD's version, is no conflict).
    tv = subject.template_version
    t_written = subject.template_annotations.get(ANN_WRITTEN_VERSION)
    if tv is not None and t_written and not same_version(tv, t_written) \
            and not same_version(tv, written):
        return (f"K0sWorkerConfigTemplate {subject.template_name}: spec.template.spec.version "
                f"was changed to {tv} by someone else (k0s-fleet wrote {t_written}); "
                f"k0s-fleet writes versions itself")
    return None


__all__ = ["HELD_RETRY_SECONDS", "HookSubject", "hook_hold"]
