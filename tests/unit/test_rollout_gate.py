"""The wave engine (fleet.rollout.gate), pure: no server, an explicit clock."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from fleet.config.models import FleetConfig
from fleet.rollout.annotations import ANN_EMERGENCY_STOP, ANN_PAUSED
from fleet.rollout.gate import (
    ClusterPhase,
    DecisionHold,
    FleetControls,
    FleetView,
    RolloutGate,
    WavePhase,
)
from fleet.rollout.state import RolloutState
from fleet.world.model import ObjectRef
from tests.helpers.gate import CANARY, PROD, T0, cluster, config, evaluate, waves_config

# -- waves ------------------------------------------------------------------------------


def test_first_matching_wave_wins_and_the_rest_form_the_default_wave() -> None:
    cfg = config(waves=[
        {"name": "a", "clusterSelector": {"matchLabels": {"x": "1"}}},
        {"name": "b", "clusterSelector": {"matchExpressions": [
            {"key": "x", "operator": "Exists"}]}},
    ])
    d = evaluate(cfg, [cluster("c1", "u", labels={"x": "1"}), cluster("c2", "u", labels={"x": "2"}),
                       cluster("c3", "u")])
    assert [(w.name, w.clusters) for w in d.waves] == [
        ("a", (("fleet", "c1"),)), ("b", (("fleet", "c2"),)), ("default", (("fleet", "c3"),))]


def test_config_entry_labels_take_part_in_wave_selection() -> None:
    cfg = FleetConfig.model_validate({
        "clusters": {"entries": [{"name": "c2", "namespace": "fleet", "labels": CANARY}]},
        "rollout": {"waves": [{"name": "canary", "clusterSelector": {"matchLabels": CANARY}}]},
    }, by_alias=True, by_name=False)
    d = evaluate(cfg, [cluster("c1"), cluster("c2")])
    assert d.clusters[("fleet", "c2")].wave == "canary"
    assert d.clusters[("fleet", "c1")].wave == "default"


def test_canary_goes_first_and_later_waves_wait() -> None:
    d = evaluate(waves_config(), [cluster("can", labels=CANARY), cluster("p1", labels=PROD),
                                  cluster("other")])
    assert d.allowed_clusters == {("fleet", "can")}
    assert "waiting for wave canary" in d.reasons[("fleet", "p1")]
    # the wave before its own (prod completes only after canary): a reason that stays
    assert "waiting for wave prod" in d.reasons[("fleet", "other")]
    assert [w.phase for w in d.waves] == [WavePhase.PROGRESSING, WavePhase.PENDING,
                                          WavePhase.PENDING]
    assert d.state.admitted == {"fleet/can": d.state.admitted["fleet/can"]}
    assert d.admitted_now == {("fleet", "can")}


def test_max_concurrent_clusters_counts_admitted_and_started_clusters() -> None:
    cfg = config(maxConcurrentClusters=2)
    cs = [cluster(f"c{i}") for i in range(5)]
    d = evaluate(cfg, cs)
    assert d.allowed_clusters == {("fleet", "c0"), ("fleet", "c1")}
    assert "maxConcurrentClusters 2 clusters upgrading" in d.reasons[("fleet", "c2")]
    # The next pass sees no NodePlan yet (lagging cache): the recorded admissions count.
    d2 = evaluate(cfg, cs, T0 + timedelta(seconds=1), state=d.state)
    assert d2.allowed_clusters == d.allowed_clusters
    assert not d2.admitted_now
    assert not d2.state_changed
    # c0 completes: one slot frees up, the next cluster in order is admitted.
    cs[0] = cluster("c0", "uu")
    d3 = evaluate(cfg, cs, T0 + timedelta(seconds=2), state=d2.state)
    assert d3.allowed_clusters == {("fleet", "c1"), ("fleet", "c2")}
    assert "fleet/c0" not in d3.state.admitted



def test_a_held_clusters_verdict_does_not_move_with_other_clusters_progress() -> None:
    """bench/README.md "Why the sharded rollout crawled": the reason a waiting cluster is
    held for goes into its MachineDeployment's and K0sControlPlane's status (and is its
    verdict for the incremental planner). With the fleet's counts in it ("waiting for wave
    first to complete (1/2 clusters)", "2 of maxConcurrentClusters 2") every completion
    or admission anywhere changed the verdict of every waiting cluster: all of them were
    planned again and their two status objects rewritten, O(fleet) writes per event (at
    10 x 300 clusters ~1500 status patches a minute, dispatches queued behind them). The
    reason names the rule that holds the cluster; the counts are in the waves' status."""
    cfg = config(maxConcurrentClusters=1, waves=[
        {"name": "first", "clusterSelector": {"matchLabels": CANARY}}])
    gate = RolloutGate(cfg)
    a = [cluster(f"a{i}", "ww", labels=CANARY) for i in range(2)]
    b = [cluster(f"b{i}", "ww") for i in range(3)]
    d1 = gate.evaluate(FleetView([*a, *b], FleetControls(), RolloutState()), T0)
    assert d1.allowed_clusters == {("fleet", "a0")}
    # a0 completes, a1 takes its slot: wave "first" moved (1/2 complete, a new admission)
    a[0] = cluster("a0", "uu", labels=CANARY)
    d2 = gate.evaluate(FleetView([*a, *b], FleetControls(), d1.state),
                       T0 + timedelta(seconds=10))
    assert d2.allowed_clusters == {("fleet", "a1")}
    for c in b:
        assert d2.reasons[c.key] == d1.reasons[c.key] == "waiting for wave first to complete"
        assert DecisionHold(d2).verdict(c.key) == DecisionHold(d1).verdict(c.key)
    # Wave "first" done: b0 admitted; b1 and b2 wait for a slot, whoever holds it.
    a[1] = cluster("a1", "uu", labels=CANARY)
    d3 = gate.evaluate(FleetView([*a, *b], FleetControls(), d2.state),
                       T0 + timedelta(seconds=20))
    assert d3.allowed_clusters == {("fleet", "b0")}
    b[0] = cluster("b0", "uw")
    b.append(cluster("b3", "gw"))  # started, no admission: a second cluster upgrading
    d4 = gate.evaluate(FleetView([*a, *b], FleetControls(), d3.state),
                       T0 + timedelta(seconds=30))
    assert d4.allowed_clusters == {("fleet", "b0")}
    assert d4.reasons[("fleet", "b3")] == ("wave default: clusters upgrading exceed "
                                           "maxConcurrentClusters 1; waiting for one to finish")
    assert d4.reasons[("fleet", "b1")] == d3.reasons[("fleet", "b1")] == (
        "wave default: maxConcurrentClusters 1 clusters upgrading; waiting for one to finish")
    assert DecisionHold(d4).verdict(("fleet", "b2")) == DecisionHold(d3).verdict(("fleet", "b2"))

def test_a_held_clusters_verdict_does_not_move_when_an_earlier_wave_completes() -> None:
    """Issue #13 target 2 (bench/README.md "Fewer status writes per rolled cluster"): a
    cluster of the third wave named the first incomplete wave ("waiting for wave first"),
    then, once that completed, the second: its verdict changed, so every waiting cluster
    of the fleet was planned again and its MD and KCP status rewritten at each earlier
    wave's completion (2 writes per cluster per wave, all at once). It names the wave
    right before its own, which is as true (a wave completes only after those before it)
    and stays the same until that wave completes."""
    cfg = config(maxConcurrentClusters=1, waves=[
        {"name": "first", "clusterSelector": {"matchLabels": CANARY}},
        {"name": "second", "clusterSelector": {"matchLabels": PROD}}])
    gate = RolloutGate(cfg)
    a = cluster("a", "ww", labels=CANARY)
    b = cluster("b", "ww", labels=PROD)
    c = [cluster(f"c{i}", "ww") for i in range(2)]
    d1 = gate.evaluate(FleetView([a, b, *c], FleetControls(), RolloutState()), T0)
    assert d1.allowed_clusters == {("fleet", "a")}
    assert d1.reasons[b.key] == "waiting for wave first to complete"
    a = cluster("a", "uu", labels=CANARY)  # the first wave completes; b is admitted
    d2 = gate.evaluate(FleetView([a, b, *c], FleetControls(), d1.state),
                       T0 + timedelta(seconds=10))
    assert d2.allowed_clusters == {("fleet", "b")}
    for x in c:
        assert d1.reasons[x.key] == d2.reasons[x.key] == "waiting for wave second to complete"
        assert DecisionHold(d2).verdict(x.key) == DecisionHold(d1).verdict(x.key)
    # The waves' own status still names the first wave that holds the rest.
    assert d1.waves[2].message == "waiting for wave first to complete"


def test_an_admission_lost_to_another_replica_keeps_the_clusters_last_reason() -> None:
    """Issue #13 target 2 (bench/README.md "Fewer status writes per rolled cluster"): with
    ten replicas about two admissions in three lost the record's compare-and-swap to
    another replica; each withdrawn cluster was held "admission not yet recorded in the
    rollout state; retrying" for the one round trip before the next decision, and back:
    its MD and KCP status written twice each for nothing. A lost race keeps the reason
    (and verdict) the cluster was held with; a record that cannot be written says so."""
    cfg = config(maxConcurrentClusters=1)
    gate = RolloutGate(cfg)
    cs = [cluster("c0"), cluster("c1")]
    d1 = gate.evaluate(FleetView(cs, FleetControls(), RolloutState()), T0)
    assert d1.allowed_clusters == {("fleet", "c0")}
    held = d1.reasons[("fleet", "c1")]
    assert "maxConcurrentClusters 1" in held
    cs[0] = cluster("c0", "uu")  # c0 completes: c1 admitted, the record to be written
    d2 = gate.evaluate(FleetView(cs, FleetControls(), d1.state), T0 + timedelta(seconds=1))
    assert d2.admitted_now == {("fleet", "c1")}
    lost = d2.without_new_admissions(kept=d1)
    assert ("fleet", "c1") not in lost.allowed_clusters
    assert lost.hold(("fleet", "c1")) == held
    assert DecisionHold(lost).verdict(("fleet", "c1")) == DecisionHold(d1).verdict(("fleet", "c1"))
    assert lost.state == d2.previous
    # Not written for another reason (or no decision before): the reason says so.
    failed = d2.without_new_admissions()
    assert failed.hold(("fleet", "c1")) == (
        "admission not yet recorded in the rollout state; retrying")


def test_started_clusters_hold_slots_even_without_a_record() -> None:
    cs = [cluster("c0", "gw"), cluster("c1", "uw"), cluster("c2")]
    d = evaluate(config(maxConcurrentClusters=2), cs)
    assert d.allowed_clusters == {("fleet", "c0"), ("fleet", "c1")}
    assert d.clusters[("fleet", "c2")].phase is ClusterPhase.QUEUED


def test_a_cluster_started_again_after_its_admission_ended_waits_behind_admitted_ones() -> None:
    """#12 verification: a complete cluster's admission is dropped from the record; if it
    gets work again while its NodePlans for the target are still there (an unrecorded
    completion re-upgraded: one node's NodePlan deleted before its Machine recorded it),
    it counts as started. It must not take a slot from the clusters admitted in the
    record: sorted by name it came first and was allowed, holding the last admitted one
    whose nodes were still in flight (three clusters upgrading, maxConcurrentClusters 2).
    It waits for a slot and then goes through the record like any admission."""
    cfg = config(maxConcurrentClusters=2)
    d = evaluate(cfg, [cluster("a", "uu"), cluster("b"), cluster("c")])
    assert d.allowed_clusters == {("fleet", "b"), ("fleet", "c")}
    assert "fleet/a" not in d.state.admitted
    # b and c upgrading; a's node to do again, its other node's NodePlan still there.
    again = [cluster("a", "uw", started=True), cluster("b", "gw"), cluster("c", "gw")]
    d2 = evaluate(cfg, again, T0 + timedelta(seconds=1), state=d.state)
    assert d2.allowed_clusters == {("fleet", "b"), ("fleet", "c")}, d2.reasons
    assert "exceed maxConcurrentClusters 2" in d2.reasons[("fleet", "a")]
    assert "fleet/a" not in d2.state.admitted
    # b completes: a takes the slot, recorded before anything is dispatched there.
    again[1] = cluster("b", "uu")
    d3 = evaluate(cfg, again, T0 + timedelta(seconds=2), state=d2.state)
    assert d3.allowed_clusters == {("fleet", "a"), ("fleet", "c")}
    assert d3.admitted_now == {("fleet", "a")} and "fleet/a" in d3.state.admitted
    # Not recorded (another replica moved the record first): not allowed either.
    assert ("fleet", "a") not in d3.without_new_admissions().allowed_clusters


def test_soak_is_measured_from_the_recorded_completion_and_survives_a_restart() -> None:
    cfg = waves_config()
    cs = [cluster("can", "uu", labels=CANARY), cluster("p1", labels=PROD)]
    d = evaluate(cfg, cs)
    assert d.waves[0].phase is WavePhase.SOAKING
    assert d.waves[0].completed_at == T0
    assert d.next_wakeup == T0 + timedelta(minutes=30)
    assert "soaking until 2026-03-02T12:30:00Z" in d.reasons[("fleet", "p1")]
    # "Restart": a new gate reading the record back from its JSON form.
    stored = RolloutState.from_json(d.state.to_json())
    later = T0 + timedelta(minutes=29, seconds=59)
    d2 = evaluate(cfg, cs, later, state=stored)
    assert d2.allowed_clusters == frozenset()
    assert d2.waves[0].completed_at == T0
    d3 = evaluate(cfg, cs, T0 + timedelta(minutes=30), state=stored)
    assert d3.allowed_clusters == {("fleet", "p1")}
    assert d3.waves[0].phase is WavePhase.COMPLETE


def test_a_new_target_is_a_new_rollout_of_the_wave() -> None:
    cfg = waves_config()
    d = evaluate(cfg, [cluster("can", "uu", labels=CANARY)])
    assert d.state.waves["canary"].completed_at == T0
    bumped = cluster("can", "uu", labels=CANARY)
    obj = dataclasses.replace(bumped.objects[0], target="v1.32.0+k0s.0")
    bumped = dataclasses.replace(bumped, objects=(obj,))
    d2 = evaluate(cfg, [bumped], T0 + timedelta(hours=1), state=d.state)
    assert d2.state.waves["canary"].completed_at == T0 + timedelta(hours=1)
    assert d2.state.waves["canary"].fingerprint != d.state.waves["canary"].fingerprint


def test_wave_is_complete_only_when_every_node_is_on_target_and_ready() -> None:
    cfg = waves_config()
    for states in ("un", "um", "uc", "ug", "uw"):
        d = evaluate(cfg, [cluster("can", states, labels=CANARY), cluster("p", labels=PROD)])
        assert d.waves[0].phase is not WavePhase.SOAKING, states
        assert d.waves[0].completed_at is None, states
        assert ("fleet", "p") not in d.allowed_clusters
    unobserved = cluster("can", "uu", labels=CANARY, observed=False)
    assert evaluate(cfg, [unobserved]).waves[0].completed_at is None


def test_a_regressed_node_reopens_the_wave() -> None:
    cfg = waves_config()
    d = evaluate(cfg, [cluster("can", "uu", labels=CANARY), cluster("p", labels=PROD)])
    later = T0 + timedelta(hours=1)
    d2 = evaluate(cfg, [cluster("can", "un", labels=CANARY), cluster("p", labels=PROD)],
                  later, state=d.state)
    assert ("fleet", "p") not in d2.allowed_clusters
    assert d2.state.waves["canary"].completed_at is None
    d3 = evaluate(cfg, [cluster("can", "uu", labels=CANARY), cluster("p", labels=PROD)],
                  later, state=d2.state)
    assert d3.state.waves["canary"].completed_at == later


def test_empty_waves_are_complete_without_soak() -> None:
    d = evaluate(waves_config(), [cluster("p", labels=PROD)])
    assert d.allowed_clusters == {("fleet", "p")}
    assert d.waves[0].phase is WavePhase.COMPLETE


# -- failures ---------------------------------------------------------------------------


def test_a_canary_failure_halts_everything() -> None:
    cfg = waves_config(waves=[
        {"name": "canary", "canary": True, "clusterSelector": {"matchLabels": CANARY},
         "maxConcurrentClusters": 2},
        {"name": "prod", "clusterSelector": {"matchLabels": PROD}}])
    cs = [cluster("can1", "fw", labels=CANARY), cluster("can2", "gw", labels=CANARY),
          cluster("p", labels=PROD)]
    d = evaluate(cfg, cs)
    assert d.allowed_clusters == frozenset()
    assert d.halted is not None and "canary" in d.halted and "fleet/can1" in d.halted
    assert "rollout halted" in d.reasons[("fleet", "can2")]
    assert d.waves[0].phase is WavePhase.HALTED
    assert d.state.halted is not None and d.state.halted.since == T0
    # Retried (the failure cleared): the rollout resumes on its own, record cleared.
    cs[0] = cluster("can1", "gw", labels=CANARY)
    d2 = evaluate(cfg, cs, T0 + timedelta(minutes=1), state=d.state)
    assert d2.halted is None and d2.state.halted is None
    assert d2.allowed_clusters == {("fleet", "can1"), ("fleet", "can2")}


def test_failure_budget_counts_and_percentages() -> None:
    cfg = waves_config()  # prod tolerates 1 failed cluster
    cs = [cluster("p1", "fw", labels=PROD), cluster("p2", "gw", labels=PROD),
          cluster("p3", labels=PROD)]
    d = evaluate(cfg, cs)
    assert d.halted is None
    # the failed cluster frees its slot: p2 keeps going and p3 is admitted
    assert d.allowed_clusters == {("fleet", "p2"), ("fleet", "p3")}
    assert d.clusters[("fleet", "p1")].phase is ClusterPhase.FAILED
    cs[1] = cluster("p2", "fu", labels=PROD)
    d2 = evaluate(cfg, cs, state=d.state)
    assert d2.halted is not None and "2 failed cluster(s)" in d2.halted
    assert d2.allowed_clusters == frozenset()
    pct = config(waves=[{"name": "p", "failureBudget": "50%"}])
    four = [cluster("a", "f"), cluster("b", "f"), cluster("c"), cluster("d")]
    assert evaluate(pct, four).halted is None
    assert evaluate(pct, [*four[:3], cluster("d", "f")]).halted is not None


def test_a_failed_cluster_keeps_its_wave_incomplete() -> None:
    d = evaluate(waves_config(), [cluster("p1", "fu", labels=PROD), cluster("x")])
    assert d.waves[1].phase is WavePhase.PROGRESSING
    assert "waiting for wave prod" in d.reasons[("fleet", "x")]


def test_retried_cluster_beyond_the_limit_is_held_until_a_slot_frees() -> None:
    cfg = config(maxConcurrentClusters=1)
    d = evaluate(cfg, [cluster("a", "gw"), cluster("b", "gw")])
    assert d.allowed_clusters == {("fleet", "a")}
    assert "exceed maxConcurrentClusters 1" in d.reasons[("fleet", "b")]


# -- windows ----------------------------------------------------------------------------


def test_nothing_new_starts_outside_a_maintenance_window() -> None:
    cfg = config(maxConcurrentClusters=2, maintenanceWindows=[
        {"schedule": "0 22 * * *", "duration": "2h", "timeZone": "UTC"}])
    cs = [cluster("active", "gw"), cluster("queued")]
    d = evaluate(cfg, cs)  # 12:00: closed
    assert d.allowed_clusters == frozenset()
    assert "next opens 2026-03-02T22:00:00Z" in d.reasons[("fleet", "queued")]
    assert d.clusters[("fleet", "active")].phase is ClusterPhase.UPGRADING
    assert d.next_wakeup == T0.replace(hour=22)
    assert not d.state.admitted  # nothing admitted while closed
    d2 = evaluate(cfg, cs, T0.replace(hour=23), state=d.state)
    assert d2.allowed_clusters == {("fleet", "active"), ("fleet", "queued")}
    d3 = evaluate(cfg, cs, T0.replace(hour=23) + timedelta(hours=1), state=d2.state)
    assert d3.allowed_clusters == frozenset()  # closed again at midnight: both wait
    assert d3.clusters[("fleet", "queued")].phase is ClusterPhase.UPGRADING


def test_per_cluster_windows_override_the_fleet_windows() -> None:
    cfg = FleetConfig.model_validate({
        "clusters": {"entries": [{"name": "b", "namespace": "fleet", "maintenanceWindows": []},
                                 {"name": "c", "namespace": "fleet", "maintenanceWindows": [
                                     {"schedule": "0 11 * * *", "duration": "2h"}]}]},
        "rollout": {"maxConcurrentClusters": 5, "maintenanceWindows": [
            {"schedule": "0 22 * * *", "duration": "2h"}]},
    }, by_alias=True, by_name=False)
    d = evaluate(cfg, [cluster("a"), cluster("b"), cluster("c")])
    assert d.allowed_clusters == {("fleet", "b"), ("fleet", "c")}


def test_a_closed_window_lets_the_next_cluster_of_the_wave_go_first() -> None:
    cfg = FleetConfig.model_validate({
        "clusters": {"entries": [{"name": "a", "namespace": "fleet", "maintenanceWindows": [
            {"schedule": "0 1 * * *", "duration": "1h"}]}]},
    }, by_alias=True, by_name=False)
    d = evaluate(cfg, [cluster("a"), cluster("b")])
    assert d.allowed_clusters == {("fleet", "b")}


# -- pause, stop ------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["config", "annotation"])
def test_fleet_pause_stops_new_starts_and_resume_continues(how: str) -> None:
    cfg = config(maxConcurrentClusters=2, paused=how == "config")
    controls = FleetControls.from_annotations(
        {ANN_PAUSED: "change freeze"} if how == "annotation" else {})
    cs = [cluster("a", "gw"), cluster("b")]
    d = evaluate(cfg, cs, controls=controls)
    assert d.allowed_clusters == frozenset()
    assert d.paused is not None and "rollout paused" in d.reasons[("fleet", "a")]
    if how == "annotation":
        assert "change freeze" in d.paused
    assert d.state.paused is not None and d.state.paused.since == T0
    d2 = evaluate(config(maxConcurrentClusters=2), cs, T0 + timedelta(minutes=5),
                  state=d.state)
    assert d2.allowed_clusters == {("fleet", "a"), ("fleet", "b")}
    assert d2.state.paused is None


def test_pause_annotation_false_means_not_paused() -> None:
    assert FleetControls.from_annotations({ANN_PAUSED: "false"}).paused is None
    assert FleetControls.from_annotations({ANN_PAUSED: "true"}).paused == ""


def test_cluster_level_pauses() -> None:
    cfg = FleetConfig.model_validate({
        "clusters": {"entries": [{"name": "e", "namespace": "fleet", "paused": True}]},
        "rollout": {"maxConcurrentClusters": 10},
    }, by_alias=True, by_name=False)
    cs = [cluster("a", annotations={ANN_PAUSED: "investigating"}), cluster("s", spec_paused=True),
          cluster("e"), cluster("ok")]
    d = evaluate(cfg, cs)
    assert d.allowed_clusters == {("fleet", "ok")}
    assert "investigating" in d.reasons[("fleet", "a")]
    assert "spec.paused" in d.reasons[("fleet", "s")]
    assert "clusters.entries" in d.reasons[("fleet", "e")]


def test_object_level_pause_holds_only_that_object() -> None:
    c = cluster("a", object_annotation="db migration")
    d = evaluate(config(), [c])
    assert d.allowed_clusters == {("fleet", "a")}
    ref = c.objects[0].ref
    assert d.hold(("fleet", "a"), ref) is not None
    assert "db migration" in (d.hold(("fleet", "a"), ref) or "")
    other = ObjectRef("K0sControlPlane", "fleet", "a-cp")
    assert d.hold(("fleet", "a"), other) is None
    assert d.hold(("fleet", "zzz")) is not None


@pytest.mark.parametrize("how", ["config", "annotation"])
def test_emergency_stop_halts_all_new_dispatches(how: str) -> None:
    cfg = config(emergencyStop=how == "config", maxConcurrentClusters=3)
    controls = FleetControls.from_annotations(
        {ANN_EMERGENCY_STOP: "bad release"} if how == "annotation" else {})
    d = evaluate(cfg, [cluster("a", "gw"), cluster("b")], controls=controls)
    assert d.allowed_clusters == frozenset()
    assert d.emergency_stop is not None
    assert d.reasons[("fleet", "a")].startswith("emergency stop")
    assert d.state.stopped is not None


def test_unobserved_clusters_are_not_admitted() -> None:
    d = evaluate(config(), [cluster("a", observed=False), cluster("b")])
    assert d.allowed_clusters == {("fleet", "b")}


def test_without_new_admissions_withdraws_unrecorded_admissions() -> None:
    # a: started, nothing more to dispatch (its nodes in flight): allowed without a record
    d = evaluate(config(maxConcurrentClusters=2), [cluster("a", "gg"), cluster("b")])
    w = d.without_new_admissions()
    assert w.allowed_clusters == {("fleet", "a")}
    assert w.state == d.previous
    assert "not yet recorded" in (w.hold(("fleet", "b")) or "")


def test_state_round_trips_and_garbage_reads_as_empty() -> None:
    d = evaluate(waves_config(), [cluster("can", "uu", labels=CANARY), cluster("p", labels=PROD)],
                 controls=FleetControls(paused="x"))
    assert RolloutState.from_json(d.state.to_json()) == d.state
    assert RolloutState.from_json("not json") == RolloutState()
    assert RolloutState.from_json("[1]") == RolloutState()
    assert RolloutState.from_json(None) == RolloutState()


def test_evaluation_is_deterministic() -> None:
    cs = [cluster(f"c{i}", labels=PROD if i % 2 else CANARY) for i in range(6)]
    a = evaluate(waves_config(), cs)
    b = evaluate(waves_config(), list(reversed(cs)))
    assert a == b


def test_fleet_config_pause_is_not_reported_as_a_pause_of_every_cluster() -> None:
    # The controller's snapshot marks every cluster paused when rollout.paused is set.
    d = evaluate(config(paused=True), [cluster("a", spec_paused=True)])
    assert d.clusters[("fleet", "a")].paused is None
    assert d.reasons[("fleet", "a")].startswith("rollout paused")
    d2 = evaluate(config(), [cluster("a", spec_paused=True)])
    assert d2.clusters[("fleet", "a")].paused == "Cluster is paused (spec.paused)"


def test_a_failed_cluster_whose_node_still_works_keeps_its_slot() -> None:
    """Issue #30: a cluster failed while a node still works on its request (its NodePlan
    failed by a deadline) holds its slot until that node has finished: no further cluster
    is admitted in its place, failure budget or not."""
    cfg = config(waves=[{"name": "all", "clusterSelector": {}, "maxConcurrentClusters": 1,
                         "failureBudget": 1}])
    busy = evaluate(cfg, [cluster("c0", "fg"), cluster("c1", "w")])
    assert busy.clusters[("fleet", "c0")].phase is ClusterPhase.FAILED
    assert ("fleet", "c1") not in busy.allowed_clusters
    assert "maxConcurrentClusters" in busy.reasons[("fleet", "c1")]
    done = evaluate(cfg, [cluster("c0", "fw"), cluster("c1", "w")])
    assert ("fleet", "c1") in done.allowed_clusters


@pytest.mark.parametrize(("text", "words"), [
    ("{not json", "not JSON"), ("[1]", "JSON list"), ('{"waves": [1]}', "waves is a list"),
    ('{"admitted": "x"}', "admitted is a str"), ('{"waves": {"a": {"fingerprint": 3}}}', None),
    ('{"paused": {"since": 5}}', None)])
def test_an_unreadable_record_is_flagged_not_read_as_empty(text: str, words: str | None) -> None:
    state = RolloutState.from_json(text)
    if words is None:  # a bad member is dropped, the rest is a record
        assert state.problem is None
    else:
        assert state.problem is not None and words in state.problem, state.problem
    assert RolloutState.from_json("").problem is None
    assert RolloutState.from_json(None).problem is None
