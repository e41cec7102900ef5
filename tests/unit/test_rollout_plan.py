"""The dry run (k0s-fleet plan) on in-memory fleets: real gate + real planner."""

from __future__ import annotations

import dataclasses
import random
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.cli.plan import refusals, refusals_text
from fleet.config.models import FleetConfig
from fleet.config.schedule import parse_duration
from fleet.planner import PlannerSettings, plan
from fleet.planner.simulate import SimFleet, add_cluster, bump
from fleet.rollout.gate import FleetControls, FleetView, RolloutGate
from fleet.rollout.observe import Observation
from fleet.rollout.plan import dry_run, plan_document, plan_text, render_plan
from fleet.rollout.progress import clusters_from_snapshot
from fleet.rollout.state import RolloutState
from fleet.world.intent import fleet_upgrade_from
from fleet.world.model import InfraMachineInfo, TemplateRef
from tests.helpers.gate import CANARY, PROD, T0, TARGET, config, waves_config


def _label(sim: SimFleet, key: tuple[str, str], labels: dict[str, str],
           annotations: dict[str, str] | None = None) -> None:
    sim.clusters[key] = dataclasses.replace(sim.clusters[key], labels=labels,
                                            annotations=annotations or {})


def _fleet() -> SimFleet:
    sim = SimFleet(now=T0)
    for name, labels, workers in (("can", CANARY, 2), ("p1", PROD, 3), ("p2", PROD, 2)):
        key = add_cluster(sim, name, namespace="fleet", control_planes=1, workers=workers,
                          max_unavailable=2)
        bump(sim, key, TARGET)
        _label(sim, key, labels)
    return sim


def test_plan_orders_waves_control_planes_first_and_waits_out_the_soak() -> None:
    sim = _fleet()
    obs = Observation(snapshot=sim.snapshot())
    run = dry_run(obs, waves_config(), now=T0, node_duration=timedelta(minutes=6))
    doc = plan_document(run)
    clusters = [s["cluster"] for s in doc["steps"]]
    assert clusters[:2] == ["fleet/can", "fleet/can"]
    assert set(clusters[2:]) == {"fleet/p1", "fleet/p2"}
    first = doc["steps"][0]
    assert first["kind"] == "K0sControlPlane" and first["nodes"] == ["can-cp-0"]
    assert doc["steps"][1]["nodes"] == ["can-md-0", "can-md-1"]  # maxUnavailable 2
    assert all(s["unavailable"] <= s["maxUnavailable"] for s in doc["steps"])
    can_done = max(s["at"] for s in doc["steps"] if s["cluster"] == "fleet/can")
    prod_start = min(s["at"] for s in doc["steps"] if s["cluster"] != "fleet/can")
    assert prod_start > can_done
    # canary: CP 6m then workers 6m, then 30m soak, before any prod step
    assert parse_duration(doc["steps"][2]["offset"].lstrip("+")) >= timedelta(minutes=41)
    assert doc["estimatedDuration"] is not None
    p1 = doc["waves"][1]["clusters"][0]["objects"]
    md = next(o for o in p1 if o["kind"] == "MachineDeployment")
    assert md["nodeOrder"] == ["p1-md-0", "p1-md-1", "p1-md-2"]
    assert md["inPlace"] == ["p1-md-0", "p1-md-1", "p1-md-2"]
    text = render_plan(doc)
    assert "wave canary [Progressing] canary=true " in text, text
    assert "estimated duration" in text
    # Nothing was written: the observed snapshot is untouched.
    assert obs.snapshot.nodeplans == {}


def test_plan_reports_objects_left_to_cluster_api_and_blocked_clusters() -> None:
    sim = _fleet()
    key = ("fleet", "p2")
    md = sim.deployments[("fleet", "p2-md")]
    sim.deployments[("fleet", "p2-md")] = dataclasses.replace(
        md, infrastructure=TemplateRef("infrastructure.cluster.x-k8s.io", "SimMachineTemplate",
                                       "p2-w-v2"))
    _label(sim, key, PROD, {"fleet.k0s-fleet.io/paused": "maintenance"})
    obs = Observation(snapshot=sim.snapshot())
    doc = plan_document(dry_run(obs, waves_config(), now=T0))
    p2 = doc["waves"][1]["clusters"][1]
    md_doc = next(o for o in p2["objects"] if o["kind"] == "MachineDeployment")
    assert len(md_doc["clusterAPI"]) == 2
    assert "infrastructure template changed" in md_doc["clusterAPI"][0]["reason"]
    assert doc["estimatedDuration"] is None
    assert any(b["cluster"] == "fleet/p2" and "maintenance" in b["reason"]
               for b in doc["blocked"])


def test_plan_of_a_paused_fleet_starts_nothing() -> None:
    sim = _fleet()
    obs = Observation(snapshot=sim.snapshot(),
                      controls=FleetControls(paused="freeze"))
    doc = plan_document(dry_run(obs, config(), now=T0))
    assert doc["steps"] == []
    assert doc["rollout"]["paused"] is not None
    assert len(doc["blocked"]) == 3


def test_plan_waits_for_maintenance_windows() -> None:
    sim = _fleet()
    obs = Observation(snapshot=sim.snapshot())
    cfg = config(maxConcurrentClusters=3, maintenanceWindows=[
        {"schedule": "0 22 * * *", "duration": "1h"}])
    doc = plan_document(dry_run(obs, cfg, now=T0, node_duration=timedelta(minutes=6)))
    assert doc["steps"][0]["at"].startswith("2026-03-02T22:00:00")
    # A node in flight at 23:00 finishes; nothing new starts until the next night.
    late = [s for s in doc["steps"] if s["at"] >= "2026-03-02T23:00"]
    assert all(s["at"] >= "2026-03-03T22:00" for s in late)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_plan_order_matches_a_rollout_at_random_node_speeds(data: st.DataObject) -> None:
    """The dry run's per-object node order and per-wave cluster order are what a rollout
    with nodes progressing at random speeds does (same gate, same planner)."""
    sim = SimFleet(now=T0)
    n = data.draw(st.integers(1, 4))
    for i in range(n):
        labels = data.draw(st.sampled_from([CANARY, PROD, {}]))
        key = add_cluster(sim, f"c{i}", namespace="fleet",
                          control_planes=data.draw(st.integers(0, 2)),
                          workers=data.draw(st.integers(1, 4)),
                          max_unavailable=data.draw(st.integers(1, 2)))
        bump(sim, key, TARGET)
        _label(sim, key, labels)
    cfg = waves_config(maxConcurrentClusters=data.draw(st.integers(1, 2)))
    planned = plan_document(dry_run(Observation(snapshot=sim.snapshot()), cfg,
                                    now=T0))
    assert planned["estimatedDuration"] is not None

    # The "actual" rollout: gate + planner each pass, nodes advance at random.
    rnd = random.Random(data.draw(st.integers(0, 2**32)))
    gate = RolloutGate(cfg)
    state = RolloutState()
    for _ in range(3000):
        snap = sim.snapshot()
        progress = clusters_from_snapshot(snap)
        if all(c.complete for c in progress):
            break
        decision = gate.evaluate(FleetView(progress, state=state), sim.now)
        state = decision.state
        sim.apply_all(plan(snap, PlannerSettings(), hold=decision.hold).actions)
        for ckey, node in sim.active_requests():
            if rnd.random() < 0.5:
                sim.step_node(ckey, node)
        sim.advance(rnd.choice([1, 30, 120]))
        if decision.next_wakeup is not None and not sim.active_requests():
            sim.now = max(sim.now, decision.next_wakeup)
    else:
        raise AssertionError("the rollout did not finish")
    actual: dict[str, list[str]] = {}
    for a in sim.created:
        actual.setdefault(a.owner.name, []).append(a.node)
    expected: dict[str, list[str]] = {}
    for s in planned["steps"]:
        expected.setdefault(s["object"], []).extend(s["nodes"])
    assert actual == expected
    wave_of = {f"{s['cluster']}": s["wave"] for s in planned["steps"]}
    order = ["canary", "prod", "default"]
    seen = [wave_of[f"{a.cluster[0]}/{a.cluster[1]}"] for a in sim.created]
    assert seen == sorted(seen, key=order.index)


def test_plan_shows_the_ladder_and_a_refusal_before_anything_is_written() -> None:
    """Issue #30: `k0s-fleet plan` shows each cluster's ladder (one minor at a time) and
    names a refusal, from the controller's own rules and the fleet YAML's releases."""
    sim = SimFleet(now=T0)
    add_cluster(sim, "climb", namespace="fleet", control_planes=1, workers=1)
    sim.upgrades[("fleet", "u")] = fleet_upgrade_from({
        "metadata": {"namespace": "fleet", "name": "u", "creationTimestamp": T0.isoformat()},
        "spec": {"version": "v1.33.1+k0s.0"}})
    obs = Observation(snapshot=sim.snapshot())
    cfg = FleetConfig.model_validate({"download": {"allowUnverified": True,
                                                   "releases": ["v1.32.3+k0s.0"]}})
    doc = plan_document(dry_run(obs, cfg, now=T0))
    [c] = [c for w in doc["waves"] for c in w["clusters"]]
    assert c["ladder"] == ["v1.32.3+k0s.0", "v1.33.1+k0s.0"] and c["refusedBy"] is None
    assert "ladder (one minor at a time): v1.32.3+k0s.0 -> v1.33.1+k0s.0" in render_plan(doc)
    versions = [s for s in doc["steps"] if s["kind"] == "K0sControlPlane"]
    assert len(versions) == 2  # the control plane is started once per rung
    assert doc["estimatedDuration"] is not None
    # without the release of v1.32: refused, nothing planned
    bare = FleetConfig.model_validate({"download": {"allowUnverified": True}})
    doc = plan_document(dry_run(Observation(snapshot=sim.snapshot()), bare, now=T0))
    [c] = [c for w in doc["waves"] for c in w["clusters"]]
    assert c["refusedBy"] == "MissingRung" and doc["steps"] == []
    assert doc["estimatedDuration"] is None
    assert any("MissingRung" in b["reason"] for b in doc["blocked"])


def _with_infra(sim: SimFleet, machine: str, info: InfraMachineInfo) -> None:
    key = ("fleet", machine)
    sim.machines[key] = dataclasses.replace(sim.machines[key], infra=info)


def test_plan_says_why_every_cluster_that_cannot_finish_is_stuck() -> None:
    """First hour (#31): a cluster the gate admits but whose control plane the planner
    leaves to Cluster API was listed under "cannot finish from here" with no reason."""
    sim = _fleet()
    _with_infra(sim, "can-cp-0", InfraMachineInfo(error="infra-0 not found"))
    doc = plan_document(dry_run(Observation(snapshot=sim.snapshot()), waves_config(),
                                now=T0))
    blocked = {b["cluster"]: b["reason"] for b in doc["blocked"]}
    assert blocked["fleet/can"], doc["blocked"]
    assert "can-cp-0 left to Cluster API (infrastructure machine unreadable: " \
        "infra-0 not found)" in blocked["fleet/can"]
    assert all(blocked.values()), blocked
    text = render_plan(doc)
    assert "Cluster API replaces can-cp-0: infrastructure machine unreadable" in text


def test_plan_cannot_tell_when_the_reader_may_not_read_the_infrastructure_machine() -> None:
    """A user without the controller's RBAC on infrastructure Machines: the plan says it
    cannot tell, and does not claim Cluster API replaces the Machine."""
    sim = _fleet()
    _with_infra(sim, "can-cp-0", InfraMachineInfo(
        error="reading SimMachine can-cp-0: forbidden", denied=True))
    doc = plan_document(dry_run(Observation(snapshot=sim.snapshot()), waves_config(),
                                now=T0))
    cp = doc["waves"][0]["clusters"][0]["objects"][0]
    assert cp["kind"] == "K0sControlPlane"
    assert cp["clusterAPI"] == []
    assert cp["cannotTell"] == [{"machine": "can-cp-0", "reason": (
        "cannot tell (infrastructure machine not readable by you: reading SimMachine "
        "can-cp-0: forbidden)")}]
    text = render_plan(doc)
    assert "Cluster API replaces" not in text
    assert "0 left to Cluster API, 1 cannot tell" in text
    assert "can-cp-0: cannot tell (infrastructure machine not readable by you: " in text


def test_a_wave_with_nothing_to_do_is_not_shown_soaking() -> None:
    """First hour (#31): `plan` showed the canary wave [Soaking] before any upgrade."""
    sim = SimFleet(now=T0)
    for name, labels, new_version in (("can", CANARY, False), ("p1", PROD, True)):
        key = add_cluster(sim, name, namespace="fleet", control_planes=1, workers=1)
        if new_version:
            bump(sim, key, TARGET)
        _label(sim, key, labels)
    doc = plan_document(dry_run(Observation(snapshot=sim.snapshot()), waves_config(),
                                now=T0))
    canary = doc["waves"][0]
    assert [c["phase"] for c in canary["clusters"]] == ["Complete"]
    assert canary["phase"] == "Complete", canary["phase"]
    assert "[Soaking]" not in render_plan(doc).splitlines()[0]


def test_a_refused_cluster_is_listed_once() -> None:
    sim = SimFleet(now=T0)
    add_cluster(sim, "climb", namespace="fleet", control_planes=1, workers=1)
    sim.upgrades[("fleet", "u")] = fleet_upgrade_from({
        "metadata": {"namespace": "fleet", "name": "u", "creationTimestamp": T0.isoformat()},
        "spec": {"version": "v1.33.1+k0s.0"}})
    bare = FleetConfig.model_validate({"download": {"allowUnverified": True}})
    run = dry_run(Observation(snapshot=sim.snapshot()), bare, now=T0)
    doc = plan_document(run)
    doc["refusals"] = refusals(run, doc)
    text = "\n".join([render_plan(doc), *refusals_text(doc)])
    message = doc["refusals"][0]["message"]
    assert "no release of v1.32" in message
    assert text.count(message) == 1, text
    cannot = text[text.index("cannot finish from here"):text.index("(nothing would be written")]
    assert "fleet/climb" not in cannot, cannot
    assert "refuses 1 cluster(s), below" in cannot


def test_the_plan_text_leaves_out_an_empty_default_wave() -> None:
    """The first hour's transcript ended every plan with `wave default [Complete]
    maxConcurrentClusters=1 ...` although every cluster was in a configured wave: the
    implicit wave of the clusters no other wave selects is shown only when it holds one."""
    def wave(name: str, clusters: list[dict[str, Any]]) -> dict[str, Any]:
        return {"name": name, "phase": "Complete", "canary": False,
                "maxConcurrentClusters": 1, "soak": "0s", "toleratedFailures": 0,
                "clusters": clusters}

    cluster = {"namespace": "ns", "name": "c1", "phase": "Complete", "blocked": "",
               "objects": []}
    doc = {"rollout": {"emergencyStop": None, "halted": None, "paused": None},
           "waves": [wave("production", [cluster]), wave("default", [])],
           "estimatedDuration": "0s", "finishesAt": "2026-12-06T00:00:00Z", "blocked": []}
    text = plan_text(doc)
    assert [line.split(" [")[0] for line in text if line.startswith("wave ")] == [
        "wave production"]
    doc["waves"] = [wave("production", []), wave("default", [cluster])]
    assert [line.split(" [")[0] for line in plan_text(doc) if line.startswith("wave ")] == [
        "wave production", "wave default"]
