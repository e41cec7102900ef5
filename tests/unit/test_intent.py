"""The upgrade intent and the one writer of versions, in memory (SimFleet plays the world,
including a model of k0smotron's documented KCP rule: it acts on an unpaused KCP whose
Machines are not on its version)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from fleet.config.models import LabelSelector
from fleet.contract.signal import SignalState
from fleet.contract.skew import ReleaseCatalog
from fleet.contract.versions import same_version
from fleet.planner import PENDING, PlannerSettings, plan
from fleet.planner import conditions as C
from fleet.planner.actions import (
    Action,
    AnnotateWorkerVersion,
    CreateNodePlan,
    PatchMachineSetVersion,
    PatchMachineVersion,
    PauseObject,
    RecordWrittenVersion,
    ReleasePause,
    ReportOtherDriver,
    ReportVersionConflict,
    SetRolloutStatus,
    WriteVersion,
)
from fleet.planner.simulate import SimFleet, add_cluster
from fleet.planner.writer import version_step
from fleet.rollout.progress import NodeState, clusters_from_snapshot
from fleet.world.intent import (
    ClusterStanding,
    WaveStanding,
    apply_intents,
    fleet_upgrade_from,
    resolve,
    upgrade_status,
    withdrawing_status,
)
from fleet.world.model import (
    ANN_CAPI_PAUSED,
    ANN_MACHINE_RUNNING_VERSION,
    ANN_PAUSED_FOR,
    ANN_WRITTEN_VERSION,
    KIND_HOSTED_CP,
    KIND_KCP,
    KIND_MD,
    KIND_WORKER_TEMPLATE,
    ClusterInfo,
    ControlPlaneInfo,
    FleetUpgradeInfo,
    MachineSetInfo,
    ObjectRef,
    WorkerTemplateInfo,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
V1, V2, V3 = "v1.31.2+k0s.0", "v1.31.3+k0s.0", "v1.32.0+k0s.0"
SETTINGS = PlannerSettings(deadlines={PENDING: timedelta(seconds=30)},
                           default_deadline=timedelta(seconds=120), halt_at_failures=1)


def upgrade(name: str, version: str, *, selector: dict[str, object] | None = None,
            created: datetime = T0) -> FleetUpgradeInfo:
    spec: dict[str, object] = {"version": version}
    if selector is not None:
        spec["clusterSelector"] = selector
    return fleet_upgrade_from({"metadata": {"namespace": "k0s-fleet-system", "name": name,
                                            "creationTimestamp": created.isoformat()},
                               "spec": spec})


def of(actions: list[Action], kind: type) -> list:  # type: ignore[type-arg]
    return [a for a in actions if isinstance(a, kind)]


# -- resolution ---------------------------------------------------------------------------

def test_the_newest_selecting_upgrade_decides_and_bad_ones_are_not_used() -> None:
    clusters = {("ns", "a"): ClusterInfo("ns", "a", labels={"ring": "canary"}),
                ("ns", "b"): ClusterInfo("ns", "b", labels={"ring": "prod"})}
    everyone = upgrade("all", V2, created=T0)
    canary = upgrade("canary", V3, selector={"matchLabels": {"ring": "canary"}},
                     created=T0 + timedelta(minutes=1))
    bad = upgrade("bad", "latest", created=T0 + timedelta(minutes=2))
    assert bad.problem is not None and "spec.version" in bad.problem
    got = resolve([everyone, canary, bad], clusters)
    assert got[("ns", "a")].version == V3 and got[("ns", "a")].intent.name == "canary"
    assert got[("ns", "b")].version == V2 and got[("ns", "b")].intent.name == "all"
    assert resolve([canary], clusters).keys() == {("ns", "a")}


def test_a_bad_selector_is_named() -> None:
    u = upgrade("x", V2, selector={"matchExpressions": [{"key": "a", "operator": "Near"}]})
    assert u.problem is not None and "clusterSelector" in u.problem
    status = upgrade_status(u, {}, [], [])
    assert status["phase"] == "Failed"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Complete": "False", "Progressing": "False", "Failed": "True"}


def test_intents_set_targets_and_keep_what_the_object_says() -> None:
    sim = SimFleet(now=T0)
    ck = add_cluster(sim, "c1", control_planes=1, workers=1)
    snap = apply_intents(sim.snapshot(), [upgrade("u", "v1.31.3")])
    kcp = next(iter(snap.control_planes.values()))
    assert kcp.version == V2 and kcp.spec_version == V1 and kcp.object_version == V1
    assert snap.intents[ck].intent == ObjectRef("FleetUpgrade", "k0s-fleet-system", "u")


def test_status_per_wave_and_cluster() -> None:
    u = upgrade("u", V2)
    intents = resolve([u], {("ns", "a"): ClusterInfo("ns", "a"),
                            ("ns", "b"): ClusterInfo("ns", "b")})
    stand = [ClusterStanding(("ns", "a"), "canary", "Complete", 3, 3, "up to date",
                             complete=True),
             ClusterStanding(("ns", "b"), "prod", "Queued", 0, 3, "waiting for wave canary")]
    waves = [WaveStanding("canary", "Soaking", "soaking until x"),
             WaveStanding("prod", "Pending", "")]
    s = upgrade_status(u, intents, stand, waves)
    assert s["phase"] == "Progressing" and s["summary"] == "1/2"
    assert [w["name"] for w in s["waves"]] == ["canary", "prod"]
    assert s["clusters"][1]["message"] == "waiting for wave canary"
    conds = {c["type"]: c["status"] for c in s["conditions"]}
    assert conds == {"Complete": "False", "Progressing": "True", "Failed": "False"}
    done = upgrade_status(u, intents, [dataclasses.replace(x, complete=True) for x in stand],
                          waves)
    assert done["phase"] == "Complete"
    assert {c["type"]: c["status"] for c in done["conditions"]}["Complete"] == "True"


# -- the writer, end to end in memory ---------------------------------------------------------

def k0smotron_would_act(sim: SimFleet) -> list[str]:
    """k0smotron's documented rule: it skips a paused KCP, and
    otherwise rolls every Machine whose spec.version differs from the KCP's."""
    out = []
    for kcp in sim.control_planes.values():
        if ANN_CAPI_PAUSED in kcp.annotations:
            continue
        for m in sim.machines.values():
            if m.owner == kcp.ref and not same_version(m.version, kcp.version):
                out.append(f"{kcp.ref.name}: {m.ref.name} at {m.version}, KCP at {kcp.version}")
    return out


def drive(sim: SimFleet, *, passes: int = 400, hold: object = None,
          check_paused: bool = True) -> list[Action]:
    """Plan, act, let the nodes move; check the invariants after every pass."""
    everything: list[Action] = []
    for _ in range(passes):
        result = plan(sim.snapshot(), SETTINGS, hold=hold)  # type: ignore[arg-type]
        for a in result.actions:
            if isinstance(a, CreateNodePlan):
                owner = (sim.deployments if a.owner.kind == KIND_MD else sim.control_planes)[
                    (a.owner.namespace, a.owner.name)]
                assert same_version(owner.version, a.version), \
                    f"{a.machine.name} started before {a.owner.name} says {a.version}"
                assert not check_paused or ANN_CAPI_PAUSED in owner.annotations, \
                    "node started on an unpaused object"
            if isinstance(a, PatchMachineSetVersion):
                ms = sim.machine_sets[(a.machine_set.namespace, a.machine_set.name)]
                assert ANN_CAPI_PAUSED in ms.annotations, "MachineSet moved unpaused"
            if isinstance(a, PatchMachineVersion):
                m = sim.machines[(a.machine.namespace, a.machine.name)]
                if m.machine_set:
                    ms = sim.machine_sets[(a.machine.namespace, m.machine_set)]
                    assert ANN_CAPI_PAUSED in ms.annotations, "worker Machine moved unpaused"
        sim.apply_all(result.actions)
        everything += result.actions
        assert k0smotron_would_act(sim) == []
        in_flight_cps = [p for p in sim.nodeplans.values()
                         if p.role == "controller" and not p.terminal]
        assert len(in_flight_cps) <= 1
        for ckey, name in sim.active_requests():
            sim.step_node(ckey, name)
        sim.advance(1)
        if not result.actions and not sim.active_requests() and all(
                p.terminal for p in sim.nodeplans.values()):
            break
    return everything


def test_an_upgrade_intent_rolls_a_cluster_through_the_one_writer() -> None:
    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=3, workers=4, max_unavailable=2)
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    actions = drive(sim)
    kcp = sim.control_planes[("default", "c1-cp")]
    md = sim.deployments[("default", "c1-md")]
    assert kcp.version == V2 and md.version == V2
    for obj in (kcp, md):
        assert obj.annotations.get(ANN_WRITTEN_VERSION) == V2
        assert ANN_CAPI_PAUSED not in obj.annotations and ANN_PAUSED_FOR not in obj.annotations
    assert {m.version for m in sim.machines.values()} == {V2}
    ms = sim.machine_sets[("default", "c1-md-ms")]
    assert ms.version == V2 and ANN_CAPI_PAUSED not in ms.annotations
    writes = of(actions, WriteVersion)
    assert [w.owner.kind for w in writes] == [KIND_KCP, KIND_MD]  # control planes first
    assert all(w.pause for w in writes)
    # The MD's version is written only after every control plane runs the target.
    md_write = actions.index(writes[1])
    cp_plans = [a for a in actions[:md_write] if isinstance(a, CreateNodePlan)]
    assert len(cp_plans) == 3 and all(a.owner.kind == KIND_KCP for a in cp_plans)
    assert [r.owner.kind for r in of(actions, ReleasePause)] == [
        KIND_KCP, "MachineSet", KIND_MD]
    # The MachineSet's template version moves in the write that pauses it (one request),
    # its Machines a pass later (drive() asserts they move only under its pause), each
    # with its running-version record (none written per completion).
    [pause] = [p for p in of(actions, PauseObject) if p.owner.kind == "MachineSet"]
    assert pause.template_version and not of(actions, PatchMachineSetVersion)
    assert not of(actions, AnnotateWorkerVersion)
    assert {m.running_version_annotation for m in sim.machines.values()
            if m.role == "worker"} == {V2}


def test_a_machine_version_cluster_api_writes_back_after_the_release_is_moved_again() -> None:
    """Cluster API v1.12's MachineSet controller force-applies each Machine's spec.version
    from its cache: a reconcile that read a Machine before k0s-fleet moved it (in flight
    when the MachineSet was paused, or on a lagging cache after the unpause) puts the old
    version back after the release (seen once in test_capi_workers at v1.12.1). The
    executor moves it again the same way: MachineSet paused, the Machine's version, the
    pause released; a Machine whose node k0s-fleet did not upgrade is left alone."""
    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=0, workers=3, max_unavailable=1)
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    drive(sim)
    md_key, ms_key = ("default", "c1-md"), ("default", "c1-md-ms")
    assert ANN_CAPI_PAUSED not in sim.deployments[md_key].annotations
    assert {m.version for m in sim.machines.values()} == {V2}
    # what CAPI did after the release
    key = ("default", "c1-md-1")
    sim.machines[key] = dataclasses.replace(sim.machines[key], version=V1)
    actions = drive(sim)  # drive() asserts a worker Machine is moved only under a paused MS
    assert [type(a).__name__ for a in actions if isinstance(
        a, PauseObject | PatchMachineVersion | ReleasePause)] == [
        "PauseObject", "PatchMachineVersion", "ReleasePause"]
    assert [a.machine.name for a in of(actions, PatchMachineVersion)] == ["c1-md-1"]
    assert {m.version for m in sim.machines.values()} == {V2}
    ms = sim.machine_sets[ms_key]
    assert ANN_CAPI_PAUSED not in ms.annotations and ANN_PAUSED_FOR not in ms.annotations
    assert ANN_CAPI_PAUSED not in sim.deployments[md_key].annotations
    assert of(actions, WriteVersion) == [] and of(actions, CreateNodePlan) == []
    # nothing more to do
    again = plan(sim.snapshot(), SETTINGS).actions
    assert not of(again, PauseObject | PatchMachineVersion | ReleasePause), again
    # a Machine at the old version whose node k0s-fleet never upgraded is not k0s-fleet's
    sim.machines[key] = dataclasses.replace(
        sim.machines[key], version=V1,
        annotations={k: v for k, v in sim.machines[key].annotations.items()
                     if k != ANN_MACHINE_RUNNING_VERSION})
    result = plan(sim.snapshot(), SETTINGS)
    assert not of(result.actions, PauseObject) and not of(result.actions, PatchMachineVersion)


@pytest.mark.parametrize("reported", [False, None])
def test_the_machines_are_written_once_cluster_api_reports_the_machine_set_paused(
        reported: bool | None) -> None:
    """Every node upgraded, the executor pauses the MachineSet (moving its template's
    version in the same write); it writes the Machines only once Cluster API reports the
    MachineSet Paused (its
    v1beta2 Paused condition True: no reconcile begun before the pause is still running).
    A MachineSet with no Paused condition at all (nothing reconciles it, or a Cluster API
    that does not report it) is written at once, as before."""
    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=0, workers=2, max_unavailable=1)
    ms_key = ("default", "c1-md-ms")
    sim.machine_sets[ms_key] = dataclasses.replace(sim.machine_sets[ms_key],
                                                   paused_reported=reported)
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    moved: list[Action] = []
    waited = 0
    for _ in range(400):
        actions = plan(sim.snapshot(), SETTINGS).actions
        ms = sim.machine_sets[ms_key]
        writes = [a for a in actions if isinstance(a, PatchMachineVersion | PatchMachineSetVersion)]
        if writes:
            assert ms.paused_for is not None and ms.paused_reported is not False, ms
            moved += writes
        elif ms.paused_for is not None and ms.paused_reported is False:
            waited += 1
            if waited == 3:  # CAPI's reconcile after the pause comes round
                sim.machine_sets[ms_key] = dataclasses.replace(ms, paused_reported=True)
        sim.apply_all(actions)
        if of(actions, PauseObject) and reported is False:
            # the simulated CAPI reports at once: here its reconcile has not run yet
            sim.machine_sets[ms_key] = dataclasses.replace(sim.machine_sets[ms_key],
                                                           paused_reported=False)
        for ckey, name in sim.active_requests():
            sim.step_node(ckey, name)
        sim.advance(1)
        if not actions and not sim.active_requests() and all(
                p.terminal for p in sim.nodeplans.values()) and \
                sim.machine_sets[ms_key].paused_for is None:
            break
    assert waited == (3 if reported is False else 0)
    # The MachineSet's template moved in the pause's own write; the Machines after it.
    assert sorted(type(a).__name__ for a in moved) == [
        "PatchMachineVersion", "PatchMachineVersion"]
    assert {m.version for m in sim.machines.values()} == {V2}
    assert sim.machine_sets[ms_key].version == V2
    assert ANN_CAPI_PAUSED not in sim.machine_sets[ms_key].annotations


def test_nothing_is_written_while_the_policy_holds_the_cluster() -> None:
    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=1, workers=2)
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    result = plan(sim.snapshot(), SETTINGS, hold=lambda _c, _o: "outside its window")
    sim.apply_all(result.actions)  # enrolment only
    assert of(result.actions, RecordWrittenVersion)
    result = plan(sim.snapshot(), SETTINGS, hold=lambda _c, _o: "outside its window")
    assert of(result.actions, WriteVersion) == [] and of(result.actions, CreateNodePlan) == []


def _enrolled(sim: SimFleet) -> None:
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V1)
    sim.apply_all(plan(sim.snapshot(), SETTINGS).actions)
    assert all(o.annotations.get(ANN_WRITTEN_VERSION) == V1
               for o in [*sim.deployments.values(), *sim.control_planes.values()])


@pytest.mark.parametrize("kind", [KIND_MD, KIND_KCP])
def test_a_version_written_by_someone_else_is_reported_and_never_raced(kind: str) -> None:
    """The single-writer rule: an enrolled object bumped directly starts no node, says so
    (condition + a Warning Event once), and stays so until set back."""
    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=1, workers=2)
    _enrolled(sim)
    table = sim.deployments if kind == KIND_MD else sim.control_planes
    key = next(k for k, o in table.items())
    table[key] = dataclasses.replace(table[key], version=V3)  # type: ignore[assignment]
    reports = []
    for _ in range(5):
        result = plan(sim.snapshot(), SETTINGS)
        assert of(result.actions, CreateNodePlan) == []
        assert of(result.actions, WriteVersion) == []
        reports += of(result.actions, ReportVersionConflict)
        sim.apply_all(result.actions)
    assert len(reports) == 1 and "someone else" in reports[0].message
    cond = table[key].status.condition(C.VERSION_WRITER)
    assert cond is not None and cond.status == "False" and cond.reason == C.R_CHANGED_BY_OTHER
    # Set back: the writer is in charge again.
    table[key] = dataclasses.replace(table[key], version=V1)  # type: ignore[assignment]
    sim.apply_all(plan(sim.snapshot(), SETTINGS).actions)
    cond = table[key].status.condition(C.VERSION_WRITER)
    assert cond is not None and cond.status == "True"


def test_a_foreign_version_the_intent_asks_for_is_adopted() -> None:
    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=0, workers=2)
    _enrolled(sim)
    key = ("default", "c1-md")
    sim.deployments[key] = dataclasses.replace(sim.deployments[key], version=V2)
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    result = plan(sim.snapshot(), SETTINGS)
    assert [a.version for a in of(result.actions, RecordWrittenVersion)] == [V2]
    assert of(result.actions, ReportVersionConflict) == []


def test_a_kcp_paused_by_someone_else_is_not_taken_over() -> None:
    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=1, workers=0)
    _enrolled(sim)
    sim.annotate(KIND_KCP, ("default", "c1-cp"), ANN_CAPI_PAUSED, "")
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    result = plan(sim.snapshot(), SETTINGS)
    assert of(result.actions, WriteVersion) == []
    decision = next(d for d in result.decisions if d.owner.kind == KIND_KCP)
    assert "not by k0s-fleet" in decision.waiting


def test_an_unpaused_kcp_whose_machines_lag_is_k0smotrons() -> None:
    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=2, workers=0)
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    sim.apply_all(plan(sim.snapshot(), SETTINGS).actions)  # enrol
    sim.apply_all(plan(sim.snapshot(), SETTINGS).actions)  # write + pause
    key = ("default", "c1-cp")
    assert sim.control_planes[key].version == V2
    anns = dict(sim.control_planes[key].annotations)
    anns.pop(ANN_CAPI_PAUSED)  # someone removes k0s-fleet's pause
    sim.control_planes[key] = dataclasses.replace(sim.control_planes[key], annotations=anns)
    result = plan(sim.snapshot(), SETTINGS)
    assert of(result.actions, CreateNodePlan) == []
    [report] = of(result.actions, ReportOtherDriver)
    assert report.reason == C.R_PAUSE_REMOVED and "k0smotron" in report.message


def test_a_capi_rollout_of_the_md_holds_it() -> None:
    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=0, workers=3)
    sim.machine_sets[("default", "c1-md-new")] = MachineSetInfo(
        ref=ObjectRef("MachineSet", "default", "c1-md-new"), cluster="c1",
        deployment="c1-md", replicas=1, created=T0 + timedelta(hours=1), version=V2)
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    actions = []
    for _ in range(4):
        result = plan(sim.snapshot(), SETTINGS)
        sim.apply_all(result.actions)
        actions += result.actions
    assert of(actions, CreateNodePlan) == []
    [report] = of(actions, ReportOtherDriver)
    assert report.reason == C.R_CAPI_ROLLOUT and "c1-md-new" in report.message
    status = [a for a in actions if isinstance(a, SetRolloutStatus)][-1]
    other = next(c for c in status.conditions if c.type == C.OTHER_DRIVER)
    assert other.status == "True"


@pytest.mark.parametrize("with_upgrade", [False, True])
def test_a_fresh_object_gets_one_status_write_after_its_adoption(with_upgrade: bool) -> None:
    """A fresh fleet (nothing adopted yet): the pass that adopts an object's version
    writes no status for it (it would say "adopting", then be written again once the
    adoption landed); the next pass writes it once, as adopted. Two status writes per
    object at start-up were a quarter of a 1000-cluster fleet's start-up writes."""
    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=1, workers=2)
    if with_upgrade:
        sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V1)
    first = plan(sim.snapshot(), SETTINGS)
    assert len(of(first.actions, RecordWrittenVersion)) == 2
    assert of(first.actions, SetRolloutStatus) == []
    sim.apply_all(first.actions)
    writes: list[SetRolloutStatus] = []
    for _ in range(4):
        result = plan(sim.snapshot(), SETTINGS)
        assert of(result.actions, RecordWrittenVersion) == []
        writes += of(result.actions, SetRolloutStatus)
        sim.apply_all(result.actions)
    assert sorted(w.owner.kind for w in writes) == [KIND_KCP, KIND_MD]  # once each
    for w in writes:
        writer = next(c for c in w.conditions if c.type == C.VERSION_WRITER)
        up = next(c for c in w.conditions if c.type == C.UP_TO_DATE)
        assert (writer.status, writer.reason, up.status) == ("True", C.R_WRITTEN, "True")
        assert "adopting" not in " ".join(c.message for c in w.conditions)


@pytest.mark.parametrize("kind", [KIND_MD, KIND_KCP])
def test_without_any_fleet_upgrade_objects_are_adopted_and_a_hand_edit_is_not_a_target(
        kind: str) -> None:
    """No FleetUpgrade covers the cluster: the first pass adopts what each object says
    (its record), and a version edited by hand afterwards is reported, never a target: no
    NodePlan, no write, the target stays the record."""
    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=1, workers=2)
    first = plan(sim.snapshot(), SETTINGS)
    assert sorted((a.owner.kind, a.version, a.intent) for a in of(
        first.actions, RecordWrittenVersion)) == [(KIND_KCP, V1, None), (KIND_MD, V1, None)]
    sim.apply_all(first.actions)
    assert all(o.written_version == V1
               for o in [*sim.deployments.values(), *sim.control_planes.values()])
    table = sim.deployments if kind == KIND_MD else sim.control_planes
    key = next(iter(table))
    table[key] = dataclasses.replace(table[key], version=V2)  # type: ignore[assignment]
    reports = []
    for _ in range(5):
        snap = sim.snapshot()
        obj = (snap.deployments if kind == KIND_MD else snap.control_planes)[key]
        assert obj.version == V1 and obj.object_version == V2  # the record is the target
        result = plan(snap, SETTINGS)
        assert of(result.actions, CreateNodePlan) == []
        assert of(result.actions, WriteVersion) == []
        reports += of(result.actions, ReportVersionConflict)
        sim.apply_all(result.actions)
    assert len(reports) == 1 and "someone else" in reports[0].message
    cond = table[key].status.condition(C.VERSION_WRITER)
    assert cond is not None and cond.reason == C.R_CHANGED_BY_OTHER
    # Set back, and asked for through a FleetUpgrade: the writer rolls the cluster.
    table[key] = dataclasses.replace(table[key], version=V1)  # type: ignore[assignment]
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    drive(sim)
    assert all(same_version(m.version, V2) for m in sim.machines.values())


def test_selector_type_is_the_fleet_configs() -> None:
    u = upgrade("x", V2, selector={"matchLabels": {"a": "b"}})
    assert isinstance(u.selector, LabelSelector) and u.selector.matches({"a": "b"})


def test_plan_replays_the_intent_with_its_version_writes_and_names_the_executor() -> None:
    from fleet.rollout.observe import Observation  # noqa: PLC0415
    from fleet.rollout.plan import dry_run, plan_document, render_plan  # noqa: PLC0415
    from tests.helpers.gate import waves_config  # noqa: PLC0415

    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", namespace="fleet", control_planes=1, workers=2,
                      max_unavailable=2)
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    obs = Observation(snapshot=sim.snapshot())
    doc = plan_document(dry_run(obs, waves_config(), now=T0,
                                node_duration=timedelta(minutes=6)))
    assert doc["estimatedDuration"] is not None, doc["blocked"]
    assert [s["kind"] for s in doc["steps"]] == ["K0sControlPlane", "MachineDeployment"]
    objects = doc["waves"][-1]["clusters"][0]["objects"]
    assert {o["executor"] for o in objects} == {"paused-in-place"}
    assert "k0smotron" in next(o["executorReason"] for o in objects
                               if o["kind"] == "K0sControlPlane")
    assert "executor paused-in-place" in render_plan(doc)
    # the observed objects were not touched
    assert obs.snapshot.control_planes[("fleet", "c1-cp")].object_version == V1


def test_where_capi_drives_the_workers_the_md_version_is_written_unpaused() -> None:
    """Cluster API in-place updates through our extension (the exclusion's hold): control
    planes still go through the paused executor; the MD's version is written without a
    pause and no worker is started by the planner (CAPI calls the hooks)."""
    from fleet.extension.exclusion import HOLD_REASON  # noqa: PLC0415
    from fleet.planner.writer import ExtensionDrives  # noqa: PLC0415

    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=1, workers=2)
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)

    def hold(_cluster: object, _owner: object) -> str | None:
        return ExtensionDrives(HOLD_REASON, None)

    actions = drive(sim, hold=hold, check_paused=False)
    writes = of(actions, WriteVersion)
    assert [(w.owner.kind, w.pause) for w in writes] == [(KIND_KCP, True), (KIND_MD, False)]
    created = of(actions, CreateNodePlan)
    assert [a.owner.kind for a in created] == [KIND_KCP]
    md = sim.deployments[("default", "c1-md")]
    assert md.version == V2 and ANN_CAPI_PAUSED not in md.annotations
    assert ANN_CAPI_PAUSED not in sim.control_planes[("default", "c1-cp")].annotations


def test_a_running_autopilot_plan_holds_the_cluster() -> None:
    sim = SimFleet(now=T0)
    ck = add_cluster(sim, "c1", control_planes=1, workers=1)
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    sim.autopilot_plans[ck] = "autopilot (Schedulable)"
    actions: list[Action] = []
    for _ in range(4):
        result = plan(sim.snapshot(), SETTINGS)
        sim.apply_all(result.actions)
        actions += result.actions
    assert of(actions, CreateNodePlan) == []
    assert {r.reason for r in of(actions, ReportOtherDriver)} == {C.R_AUTOPILOT_PLAN}
    del sim.autopilot_plans[ck]
    assert of(drive(sim), CreateNodePlan)  # gone: k0s-fleet carries on


def test_live_autopilot_plan_states() -> None:
    from fleet.world.records import PlanRecord, live_autopilot_plan, plan_record  # noqa: PLC0415

    def p(state: str | None) -> PlanRecord:
        return plan_record({"metadata": {"name": "autopilot"},
                            "status": {} if state is None else {"state": state}})

    assert live_autopilot_plan([p(None)]) == "autopilot (new)"
    assert live_autopilot_plan([p("SchedulableWait")]) == "autopilot (SchedulableWait)"
    assert live_autopilot_plan([p("Completed"), p("IncompleteTargets")]) is None


def test_on_delete_is_read_as_cluster_api_defines_it() -> None:
    """OnDelete has no maxUnavailable in Cluster API (0): nothing goes down in place, and
    the object says why, even with a rollingUpdate.maxUnavailable left in the spec; the
    version is written (unpaused) so that Cluster API replaces what the user deletes."""
    from fleet.planner.actions import ReportNotInPlace  # noqa: PLC0415

    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=0, workers=3, max_unavailable=2)
    key = ("default", "c1-md")
    sim.deployments[key] = dataclasses.replace(sim.deployments[key], strategy="OnDelete")
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    actions: list[Action] = []
    for _ in range(3):
        result = plan(sim.snapshot(), SETTINGS)
        sim.apply_all(result.actions)
        actions += result.actions
    assert of(actions, CreateNodePlan) == []
    # The version is written unpaused: Cluster API replaces each Machine someone deletes.
    [write] = of(actions, WriteVersion)
    assert write.version == V2 and not write.pause
    assert ANN_CAPI_PAUSED not in sim.deployments[key].annotations
    [report] = of(actions, ReportNotInPlace)
    assert report.reason == C.R_MAX_UNAVAILABLE_ZERO and "OnDelete" in report.message


def test_plan_names_the_capi_in_place_executor_where_cluster_api_drives_workers() -> None:
    from fleet.rollout.observe import Observation  # noqa: PLC0415
    from fleet.rollout.plan import dry_run, plan_document  # noqa: PLC0415
    from tests.helpers.gate import waves_config  # noqa: PLC0415

    sim = SimFleet(now=T0)
    key = add_cluster(sim, "c1", namespace="fleet", control_planes=1, workers=2,
                      max_unavailable=2)
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    obs = Observation(snapshot=sim.snapshot(), extension_clusters=frozenset({key}))
    doc = plan_document(dry_run(obs, waves_config(), now=T0,
                                node_duration=timedelta(minutes=6)))
    objects = {o["kind"]: o for o in doc["waves"][-1]["clusters"][0]["objects"]}
    assert objects["MachineDeployment"]["executor"] == "capi-in-place"
    assert "UpdateMachine" in objects["MachineDeployment"]["executorReason"]
    assert objects["K0sControlPlane"]["executor"] == "paused-in-place"
    # the control plane is upgraded by k0s-fleet; the workers are Cluster API's to start
    assert [s["kind"] for s in doc["steps"]] == ["K0sControlPlane"]
    assert "Cluster API drives" in (objects["MachineDeployment"]["waiting"] or "")


# -- the worker bootstrap template (K0sWorkerConfigTemplate) ------------------------------

def _with_template(sim: SimFleet, version: str | None, *, users: int = 1,
                   key: tuple[str, str] = ("default", "c1-md")) -> ObjectRef:
    md = sim.deployments[key]
    assert md.bootstrap is not None
    ref = ObjectRef(KIND_WORKER_TEMPLATE, key[0], md.bootstrap.name)
    sim.deployments[key] = dataclasses.replace(md, worker_template=WorkerTemplateInfo(
        ref=ref, version=version, users=users))
    return ref


def _template(sim: SimFleet) -> WorkerTemplateInfo:
    tpl = sim.deployments[("default", "c1-md")].worker_template
    assert tpl is not None
    return tpl


def test_a_worker_template_kept_in_step_is_adopted_and_written_after_the_md() -> None:
    """k0smotron installs the template's version on every new worker Machine: where it
    says the MD's version, k0s-fleet adopts it with the MD and writes each new version
    into it right after the MD's."""
    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=1, workers=2)
    ref = _with_template(sim, V1)
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    actions = drive(sim)
    adopted = [a for a in of(actions, RecordWrittenVersion) if a.owner == ref]
    assert [a.version for a in adopted] == [V1]
    writes = of(actions, WriteVersion)
    assert [(w.owner.kind, w.version) for w in writes] == [
        (KIND_KCP, V2), (KIND_MD, V2), (KIND_WORKER_TEMPLATE, V2)]
    assert not writes[2].pause and writes[2].expected == V1
    tpl = _template(sim)
    assert tpl.version == V2 and tpl.written_version == V2
    assert {m.version for m in sim.machines.values()} == {V2}
    md = sim.deployments[("default", "c1-md")]
    cond = md.status.condition(C.VERSION_WRITER)
    assert cond is not None and cond.status == "True" and "kept at" in cond.message


def test_a_worker_template_edited_by_someone_else_is_reported_and_holds_the_md() -> None:
    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=0, workers=2)
    _with_template(sim, V1)
    _enrolled(sim)
    sim.apply_all(plan(sim.snapshot(), SETTINGS).actions)
    assert _template(sim).written_version == V1
    key = ("default", "c1-md")
    md = sim.deployments[key]
    sim.deployments[key] = dataclasses.replace(md, worker_template=dataclasses.replace(
        _template(sim), version=V3))  # by hand
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    reports = []
    for _ in range(5):
        result = plan(sim.snapshot(), SETTINGS)
        assert of(result.actions, CreateNodePlan) == []
        reports += of(result.actions, ReportVersionConflict)
        sim.apply_all(result.actions)
    assert len(reports) == 1 and "K0sWorkerConfigTemplate" in reports[0].message
    cond = sim.deployments[key].status.condition(C.VERSION_WRITER)
    assert cond is not None and cond.status == "False" and cond.reason == C.R_CHANGED_BY_OTHER
    assert _template(sim).version == V3  # never raced
    # Set back: the rollout goes on, the template follows the MD.
    sim.deployments[key] = dataclasses.replace(
        sim.deployments[key],
        worker_template=dataclasses.replace(_template(sim), version=V1))
    drive(sim)
    assert _template(sim).version == V2
    assert {m.version for m in sim.machines.values()} == {V2}


@pytest.mark.parametrize(("version", "users", "why"), [
    (V3, 1, "not kept in step"), (V1, 2, "shared by 2"), (None, 1, "")])
def test_a_worker_template_out_of_step_shared_or_without_version_is_left_alone(
        version: str | None, users: int, why: str) -> None:
    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=0, workers=2)
    _with_template(sim, version, users=users)
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    actions = drive(sim)
    assert [a for a in [*of(actions, WriteVersion), *of(actions, RecordWrittenVersion)]
            if a.owner.kind == KIND_WORKER_TEMPLATE] == []
    assert _template(sim).version == version
    assert {m.version for m in sim.machines.values()} == {V2}  # the MD rolled all the same
    cond = sim.deployments[("default", "c1-md")].status.condition(C.VERSION_WRITER)
    assert cond is not None and cond.status == "True" and why in cond.message


# -- k0s's version skew rules on the FleetUpgrade path (fleet/contract/skew.py) ----------------

def _minor(v: str | None) -> int:
    assert v is not None
    return int(v.split(".")[1])


def skew_watcher(sim: SimFleet) -> None:
    """The skew rules, checked over what the Machines of every cluster say."""
    for ckey in sim.clusters:
        ms = [m for m in sim.machines.values() if (m.ref.namespace, m.cluster) == ckey]
        cps = [_minor(m.version) for m in ms if m.role == "controller"]
        ws = [_minor(m.version) for m in ms if m.role != "controller"]
        if cps:
            assert max(cps) - min(cps) <= 1, f"control planes apart: {cps}"
        if cps and ws:
            assert max(ws) <= min(cps), f"a worker newer than a control plane: {ws} {cps}"
            assert min(cps) - min(ws) <= 1, f"workers too old: {ws} {cps}"


def test_a_fleet_upgrade_two_minors_ahead_climbs_the_ladder_rung_by_rung() -> None:
    sim = SimFleet(now=T0)
    sim.catalog = ReleaseCatalog.of(["v1.32.0+k0s.0", "v1.32.4+k0s.0"], [],
                                    rungs_need_digest=False)
    add_cluster(sim, "c1", control_planes=3, workers=2, max_unavailable=1)
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", "v1.33.1+k0s.0")
    snap = sim.snapshot()
    t = snap.intents[("default", "c1")]
    assert t.rung == "v1.32.4+k0s.0" and t.ladder == ("v1.33.1+k0s.0",)
    writes: list[WriteVersion] = []
    for _ in range(800):
        snap = sim.snapshot()
        if all(m.version != "v1.33.1+k0s.0" for m in sim.machines.values()):
            # mid-ladder the cluster is never complete (the gate would free its slot and
            # let the next wave start; `k0s-fleet upgrade` would exit 0)
            [progress] = clusters_from_snapshot(snap)
            assert not progress.complete
            assert progress.targets() == [("K0sControlPlane", "c1-cp", "v1.33.1+k0s.0"),
                                          ("MachineDeployment", "c1-md", "v1.33.1+k0s.0")]
        result = plan(snap, SETTINGS)
        writes += of(result.actions, WriteVersion)
        sim.apply_all(result.actions)
        skew_watcher(sim)
        for ckey, name in sim.active_requests():
            sim.step_node(ckey, name)
        sim.advance(1)
        if {m.version for m in sim.machines.values()} == {"v1.33.1+k0s.0"} and not \
                result.actions and not sim.active_requests():
            break
    assert {m.version for m in sim.machines.values()} == {"v1.33.1+k0s.0"}
    assert [(w.owner.kind, w.version) for w in writes] == [
        (KIND_KCP, "v1.32.4+k0s.0"), (KIND_MD, "v1.32.4+k0s.0"),
        (KIND_KCP, "v1.33.1+k0s.0"), (KIND_MD, "v1.33.1+k0s.0")]


def test_a_skip_without_a_rung_and_a_downgrade_are_refused_and_nothing_is_written() -> None:
    for version, rule in (("v1.33.1+k0s.0", "MissingRung"), ("v1.30.9+k0s.0", "NoDowngrade")):
        sim = SimFleet(now=T0)
        add_cluster(sim, "c1", control_planes=1, workers=1)
        u = upgrade("u", version)
        sim.upgrades[("k0s-fleet-system", "u")] = u
        actions = drive(sim, passes=20)
        assert not of(actions, WriteVersion) and not of(actions, CreateNodePlan)
        assert {m.version for m in sim.machines.values()} == {V1}
        snap = sim.snapshot()
        t = snap.intents[("default", "c1")]
        assert t.refusal is not None and t.refusal[0] == rule
        stand = [ClusterStanding(("default", "c1"), "default", "Complete", 2, 2, "up to date",
                                 complete=True)]
        s = upgrade_status(u, snap.intents, stand, [])
        assert s["phase"] == "Failed", s
        conds = {c["type"]: (c["status"], c["reason"]) for c in s["conditions"]}
        assert conds["Refused"] == ("True", rule) and conds["Failed"][0] == "True"
        assert s["clusters"][0]["phase"] == "Refused" and s["clusters"][0]["refusedBy"] == rule
        assert rule in s["message"]
        assert version in s["message"] or rule == "MissingRung"


def test_a_hand_edit_two_minors_ahead_is_not_adopted_even_when_a_fleet_upgrade_asks() -> None:
    sim = SimFleet(now=T0)
    add_cluster(sim, "c1", control_planes=1, workers=0)
    drive(sim, passes=3)  # adopt
    key = ("default", "c1-cp")
    kcp = sim.control_planes[key]
    assert kcp.annotations.get(ANN_WRITTEN_VERSION) == V1
    sim.control_planes[key] = dataclasses.replace(kcp, version="v1.33.0+k0s.0")
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", "v1.33.0+k0s.0")
    snap = sim.snapshot()
    obj = snap.control_planes[key]
    step = version_step(obj, hold=None, write_blocked="")
    assert step.conflict and not of(list(step.actions), RecordWrittenVersion)
    assert "OneMinorAtATime" in step.waiting


def test_a_nodeplan_failed_by_its_deadline_keeps_its_cluster_slot_while_the_node_works() -> None:
    """Issue #30: a NodePlan failed by a deadline while its node's request is still live
    used to free its cluster's slot (the node counted as failed), so with a wave failure
    budget of 1 a further cluster was admitted while that node was mid-upgrade."""
    sim = SimFleet(now=T0)
    ck = add_cluster(sim, "c1", control_planes=1, workers=0)
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V2)
    for _ in range(10):  # write the version, dispatch the one control plane
        sim.apply_all(plan(sim.snapshot(), SETTINGS).actions)
        sim.advance(1)
        if sim.active_requests():
            break
    [(_, node)] = sim.active_requests()
    sim.step_node(ck, node)  # the node starts (Downloading...) and then goes quiet
    failed = False
    for _ in range(400):  # past every deadline without the node moving
        actions = plan(sim.snapshot(), SETTINGS).actions
        sim.apply_all(actions)
        failed = failed or any(type(a).__name__ == "MarkNodePlanFailed" for a in actions)
        sim.advance(5)
        if failed:
            break
    assert failed
    [c] = clusters_from_snapshot(sim.snapshot())
    states = [n.state for o in c.objects for n in o.nodes]
    assert sim.active_requests() == [(ck, node)]  # the node still works on it
    assert states == [NodeState.UPGRADING], c
    assert c.in_flight == 1
    sim.step_node(ck, node, fail=SignalState.FAILED_DOWNLOAD)
    [c] = clusters_from_snapshot(sim.snapshot())
    assert [n.state for o in c.objects for n in o.nodes] == [NodeState.FAILED]


def test_a_cluster_done_with_a_lower_rung_is_not_complete_in_the_status() -> None:
    u = upgrade("u", "v1.33.1+k0s.0")
    intents = {k: dataclasses.replace(t, rung="v1.32.4+k0s.0", ladder=("v1.33.1+k0s.0",))
               for k, t in resolve([u], {("ns", "a"): ClusterInfo("ns", "a")}).items()}
    stand = [ClusterStanding(("ns", "a"), "default", "Complete", 3, 3, "up to date",
                             complete=True)]
    s = upgrade_status(u, intents, stand, [])
    assert s["phase"] == "Progressing" and s["clustersComplete"] == 0
    [c] = s["clusters"]
    assert c["rung"] == "v1.32.4+k0s.0" and c["ladder"] == ["v1.33.1+k0s.0"]
    assert "next v1.33.1+k0s.0" in c["message"]


# -- hosted control planes (k0smotron's K0smotronControlPlane) --------------------------------

def test_a_hosted_control_plane_is_written_first_and_holds_the_workers_until_k0smotron_is_done(
        ) -> None:
    """Issue #30: the hosted control plane's version is the cluster's control-plane step
    (written unpaused: k0smotron rolls its pods), and the workers wait until k0smotron
    reports the target with every replica ready; then they are upgraded in place."""
    sim = SimFleet(now=T0)
    ck = add_cluster(sim, "h1", control_planes=0, workers=2, max_unavailable=1)
    key = ("default", "h1-cp")
    sim.control_planes[key] = ControlPlaneInfo(
        ref=ObjectRef(KIND_HOSTED_CP, "default", "h1-cp"), cluster="h1", replicas=3,
        version=V1, hosted=True, status_version=V1, ready_replicas=3,
        status_replicas=3)
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V3)
    writes: list[WriteVersion] = []
    held: list[str] = []
    for _ in range(40):
        snap = sim.snapshot()
        result = plan(snap, SETTINGS)
        writes += of(result.actions, WriteVersion)
        held += [d.waiting for d in result.decisions if d.owner.kind == KIND_MD and d.waiting]
        assert not [a for a in of(result.actions, CreateNodePlan) if a.owner.kind == KIND_MD
                    and not sim.control_planes[key].hosted_on(V3)], "a worker before k0smotron"
        sim.apply_all(result.actions)
        for c, name in sim.active_requests():
            sim.step_node(c, name)
        sim.advance(1)
    # k0s-fleet wrote the hosted version unpaused, and nothing of the workers yet
    assert [(w.owner.kind, w.version, w.pause) for w in writes] == [(KIND_HOSTED_CP, V3, False)]
    hcp = sim.control_planes[key]
    assert hcp.version == V3 and ANN_CAPI_PAUSED not in hcp.annotations
    assert any("waiting for k0smotron to run hosted control plane h1-cp on "
               f"{V3}" in h for h in held), held[-3:]
    [progress] = clusters_from_snapshot(sim.snapshot())
    assert not progress.complete
    # k0smotron rolls its pods and reports the target with every replica ready
    sim.control_planes[key] = dataclasses.replace(hcp, status_version=V3, ready_replicas=3)
    drive(sim, check_paused=False)
    assert {m.version for m in sim.machines.values()} == {V3}
    assert [w.owner.kind for w in of(drive(sim, passes=3), WriteVersion)] == []
    [progress] = clusters_from_snapshot(sim.snapshot())
    assert progress.complete, progress
    assert ck in sim.snapshot().intents


def test_workers_are_not_moved_past_a_hosted_control_plane_k0smotron_reports_older() -> None:
    sim = SimFleet(now=T0)
    add_cluster(sim, "h2", control_planes=0, workers=1)
    sim.control_planes[("default", "h2-cp")] = ControlPlaneInfo(
        ref=ObjectRef(KIND_HOSTED_CP, "default", "h2-cp"), cluster="h2", replicas=1,
        version=V3, hosted=True, status_version=V1, ready_replicas=1,
        status_replicas=1, annotations={ANN_WRITTEN_VERSION: V3})
    md = sim.deployments[("default", "h2-md")]
    sim.deployments[("default", "h2-md")] = dataclasses.replace(
        md, annotations={**md.annotations, ANN_WRITTEN_VERSION: V1})
    sim.upgrades[("k0s-fleet-system", "u")] = upgrade("u", V3)
    result = plan(sim.snapshot(), SETTINGS)
    assert not of(result.actions, WriteVersion)
    [d] = [d for d in result.decisions if d.owner.kind == KIND_MD]
    assert "it reports v1.31.2+k0s.0, 1/1 ready" in d.waiting


def test_a_withdrawn_fleet_upgrade_keeps_only_the_clusters_it_had_written_into() -> None:
    sim = SimFleet(now=T0)
    started = add_cluster(sim, "s1", control_planes=1, workers=1)
    untouched = add_cluster(sim, "s2", control_planes=1, workers=1)
    drive(sim, passes=3)  # adopt every object at V1
    kcp = sim.control_planes[("default", "s1-cp")]
    sim.control_planes[("default", "s1-cp")] = dataclasses.replace(
        kcp, version=V2, annotations={**kcp.annotations, ANN_WRITTEN_VERSION: V2})
    u = dataclasses.replace(upgrade("u", V2), deleting=True,
                            finalizers=("fleet.k0s-fleet.io/withdraw",))
    snap = apply_intents(sim.snapshot(), [u])
    assert set(snap.intents) == {started}
    assert snap.deployments[("default", "s1-md")].version == V2  # its workers finish too
    assert snap.deployments[("default", "s2-md")].version == V1
    assert untouched not in snap.intents
    # without k0s-fleet's finalizer (released, or never added): nothing is held
    assert apply_intents(sim.snapshot(), [dataclasses.replace(u, finalizers=())]).intents == {}
    stand = [ClusterStanding(started, "default", "Upgrading", 1, 2, "upgrading")]
    st = withdrawing_status(u, stand)
    assert st["phase"] == "Withdrawing" and [c["name"] for c in st["clusters"]] == ["s1"]
    assert "no new cluster is admitted" in st["message"]
