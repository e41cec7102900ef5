"""The rollout policy as the UpdateMachine hook applies it (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fleet.config.models import FleetConfig
from fleet.rollout.gate import FleetControls
from fleet.rollout.hookgate import HookSubject, hook_hold
from fleet.rollout.state import RolloutState, Transition

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)  # a Monday, noon UTC
ADMITTED = RolloutState(admitted={"ns/c1": "fp"})
V1, V2, V3 = "v1.31.2+k0s.0", "v1.31.3+k0s.0", "v1.32.0+k0s.0"
WRITTEN = {"fleet.k0s-fleet.io/version": V2}
SUBJECT = HookSubject("ns", "c1", owner_kind="MachineDeployment", owner_name="md",
                      owner_annotations=WRITTEN, owner_version=V2)


def cfg(**rollout: object) -> FleetConfig:
    return FleetConfig.model_validate({"rollout": rollout})


def test_an_admitted_cluster_in_its_window_goes() -> None:
    assert hook_hold(cfg(), FleetControls(), ADMITTED, SUBJECT, NOW) is None


@pytest.mark.parametrize(("version", "annotations"), [
    (V1, {"fleet.k0s-fleet.io/version": V1}),  # k0s-fleet writes it after the MD's
    (V2, {"fleet.k0s-fleet.io/version": V1}),  # what k0s-fleet would write: adopted
    (V3, {}),  # never recorded (out of step, or shared): left alone
    (None, {}),  # no version in it
])
def test_a_worker_template_k0s_fleet_did_not_see_changed_by_others_does_not_hold(
        version: str | None, annotations: dict[str, str]) -> None:
    subject = HookSubject("ns", "c1", owner_kind="MachineDeployment", owner_name="md",
                          owner_annotations=WRITTEN, owner_version=V2, template_name="md-w",
                          template_version=version, template_annotations=annotations)
    assert hook_hold(cfg(), FleetControls(), ADMITTED, subject, NOW) is None


@pytest.mark.parametrize(("config", "controls", "state", "subject", "expect"), [
    (cfg(emergencyStop=True), FleetControls(), ADMITTED, SUBJECT, "emergency stop"),
    (cfg(), FleetControls(emergency_stop="bad"), ADMITTED, SUBJECT, "emergency stop"),
    (cfg(paused=True), FleetControls(), ADMITTED, SUBJECT, "rollout paused"),
    (cfg(), FleetControls(paused="freeze"), ADMITTED, SUBJECT, "freeze"),
    (cfg(), FleetControls(), RolloutState(admitted={"ns/c1": "x"},
                                          halted=Transition(NOW, "wave w: 2 failed")),
     SUBJECT, "halted"),
    (cfg(), FleetControls(), ADMITTED,
     HookSubject("ns", "c1", cluster_annotations={"fleet.k0s-fleet.io/paused": "incident"}),
     "incident"),
    (cfg(), FleetControls(), ADMITTED, HookSubject("ns", "c1", cluster_spec_paused=True),
     "spec.paused"),
    (cfg(), FleetControls(), ADMITTED,
     HookSubject("ns", "c1", owner_kind="MachineDeployment",
                 owner_annotations={"fleet.k0s-fleet.io/paused": "true", **WRITTEN},
                 owner_version=V2),
     "MachineDeployment paused"),
    # the one writer: a version someone else wrote, or an MD not adopted yet
    (cfg(), FleetControls(), ADMITTED,
     HookSubject("ns", "c1", owner_kind="MachineDeployment", owner_name="md",
                 owner_annotations={"fleet.k0s-fleet.io/version": V1}, owner_version=V2),
     "changed to v1.31.3+k0s.0 by someone else (k0s-fleet wrote v1.31.2+k0s.0)"),
    # ... or into the worker bootstrap template k0s-fleet keeps in step with the MD
    (cfg(), FleetControls(), ADMITTED,
     HookSubject("ns", "c1", owner_kind="MachineDeployment", owner_name="md",
                 owner_annotations=WRITTEN, owner_version=V2, template_name="md-w",
                 template_version=V3, template_annotations=WRITTEN),
     "K0sWorkerConfigTemplate md-w: spec.template.spec.version was changed to "
     "v1.32.0+k0s.0 by someone else (k0s-fleet wrote v1.31.3+k0s.0)"),
    (cfg(), FleetControls(), ADMITTED,
     HookSubject("ns", "c1", owner_kind="MachineDeployment", owner_name="md",
                 owner_version=V2), "not adopted"),
    (cfg(maintenanceWindows=[{"schedule": "0 22 * * *", "duration": "4h"}]), FleetControls(),
     ADMITTED, SUBJECT, "maintenance window"),
    (cfg(), FleetControls(), RolloutState(), SUBJECT, "has not admitted"),
])
def test_the_policy_holds_the_hook(config: FleetConfig, controls: FleetControls,
                                   state: RolloutState, subject: HookSubject,
                                   expect: str) -> None:
    why = hook_hold(config, controls, state, subject, NOW)
    assert why is not None and expect in why
