"""The real-world chaos suite's pure parts: schedules replay from their seed, and the
independent watcher catches each kind of violation it is there for (a watcher that
cannot fail would prove nothing). The trials themselves: tests/integration/
test_chaos_real.py and `make chaos-real`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from fleet.contract.signal import CORDONED_BY_KEY, RUNNING_VERSION_KEY, SIGNAL_DATA_KEY
from fleet.kube.watch import WatchEvent
from tests.helpers.realchaos.fencing import two_leaders, writes
from tests.helpers.realchaos.schedule import (
    FAULT_KINDS,
    OLD,
    TARGET,
    ClusterShape,
    Schedule,
    schedule,
)
from tests.helpers.realchaos.watcher import ChaosWatcher

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
CANARY = ClusterShape("c0", "canary", 1, 1, 1)
PROD = ClusterShape("c1", "default", 1, 3, 1)


def test_a_schedule_replays_from_its_seed() -> None:
    assert schedule(7) == schedule(7)
    assert schedule(7).describe() == schedule(7).describe()
    assert len({schedule(s).describe() for s in range(20)}) == 20


def test_every_fault_kind_once_when_asked_for_as_many() -> None:
    for seed in range(10):
        kinds = [f.kind for f in schedule(seed, faults=len(FAULT_KINDS)).faults]
        assert sorted(kinds) == sorted(FAULT_KINDS)


def test_small_fleets_and_step_boundaries() -> None:
    for seed in range(30):
        s = schedule(seed, small=True)
        assert len(s.clusters) == 3 and s.clusters[0].wave == "canary"
        assert all(c.control_planes <= 1 and 1 <= c.workers <= 2 for c in s.clusters)
        steps = [f.at_step for f in s.faults]
        assert steps == sorted(steps) and all(1 <= x < s.total_steps for x in steps)
        assert set(s.crash_points) <= set(s.machines)


def _node(name: str, *, ready: bool = True, cordoned: bool = False, plan: str | None = None,
          state: str | None = None, version: str = OLD, created: datetime = T0,
          attempt: int = 1, at: datetime = T0) -> dict[str, Any]:
    ann: dict[str, str] = {RUNNING_VERSION_KEY: version}
    if plan is not None:
        sig: dict[str, Any] = {"planId": f"chaos/{plan}", "created": created.isoformat(),
                               "command": {"id": attempt, "k0supdate": {
                                   "version": TARGET, "url": "http://x/k0s",
                                   "sha256": "0" * 64}}}
        if state is not None:
            sig["status"] = {"status": state, "timestamp": at.isoformat()}
        ann[SIGNAL_DATA_KEY] = json.dumps(sig)
    if cordoned:
        ann[CORDONED_BY_KEY] = "agent"
    return {"metadata": {"name": name, "annotations": ann},
            "spec": {"unschedulable": True} if cordoned else {},
            "status": {"conditions": [{"type": "Ready",
                                       "status": "True" if ready else "False"}]}}


def _plan(name: str, cluster: str, created: datetime, uid: str = "u1") -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": uid, "namespace": "chaos",
                         "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ")},
            "spec": {"clusterName": cluster}, "status": {}}


def _watcher() -> ChaosWatcher:
    w = ChaosWatcher(Schedule(0, (CANARY, PROD), ()), soak=timedelta(seconds=5))
    for shape in (CANARY, PROD):
        for m in shape.machines:
            w.on_node(shape.name, WatchEvent("ADDED", _node(m)))
    w.arm()
    return w


def test_a_correct_upgrade_breaks_no_rule() -> None:
    w = _watcher()
    for state in ("Downloading", "Cordoning", "Restarting", "Verifying", "UnCordoning",
                  "Completed"):
        down = state in ("Cordoning", "Restarting", "Verifying")
        w.on_node("c1", WatchEvent("MODIFIED", _node(
            "c1-cp-0", plan="c1-cp-0-v", state=state, cordoned=down,
            ready=state != "Restarting",
            version=TARGET if state in ("Verifying", "UnCordoning", "Completed") else OLD)))
    assert w.violations == [] and w.final_violations() == []
    assert w.steps == 6


def test_two_workers_down_with_max_unavailable_one_is_caught() -> None:
    w = _watcher()
    w.on_node("c1", WatchEvent("MODIFIED", _node("c1-cp-0", version=TARGET)))
    w.on_node("c1", WatchEvent("MODIFIED", _node("c1-md-0", plan="p0", state="Cordoning",
                                                 cordoned=True)))
    assert w.violations == []
    w.on_node("c1", WatchEvent("MODIFIED", _node("c1-md-2", plan="p2")))
    assert any("2 workers unavailable" in v for v in w.violations), w.violations


def test_a_worker_before_its_control_plane_is_caught() -> None:
    w = _watcher()
    w.on_node("c1", WatchEvent("MODIFIED", _node("c1-md-1", plan="p1")))
    assert any("control planes ['c1-cp-0'] are not done" in v for v in w.violations)


def test_a_node_signalled_twice_for_one_attempt_is_caught() -> None:
    w = _watcher()
    w.on_plan(WatchEvent("ADDED", _plan("p", "c0", T0)))
    w.on_node("c0", WatchEvent("MODIFIED", _node("c0-cp-0", plan="p", created=T0)))
    w.on_node("c0", WatchEvent("MODIFIED", _node("c0-cp-0", plan="p",
                                                 created=T0 + timedelta(seconds=3))))
    assert any("signalled 2 times for attempt 1" in v for v in w.final_violations())
    # the same, but the NodePlan was deleted and created anew in between: allowed
    w.on_plan(WatchEvent("DELETED", _plan("p", "c0", T0)))
    w.on_plan(WatchEvent("ADDED", _plan("p", "c0", T0, uid="u2")))
    assert w.final_violations() == []


def test_the_default_wave_starting_before_the_canary_soaked_is_caught() -> None:
    w = _watcher()
    for m in CANARY.machines:
        w.on_node("c0", WatchEvent("MODIFIED", _node(m, plan=m, state="Completed",
                                                     version=TARGET, at=T0)))
    w.on_plan(WatchEvent("ADDED", _plan("late", "c1", T0 + timedelta(seconds=6))))
    assert w.final_violations() == []
    w.on_plan(WatchEvent("ADDED", _plan("early", "c1", T0 + timedelta(seconds=2))))
    [v] = w.final_violations()
    assert "NodePlan early created" in v and "soaked 5s" in v


def test_the_default_wave_starting_before_the_canary_is_done_is_caught() -> None:
    w = _watcher()
    w.on_plan(WatchEvent("ADDED", _plan("early", "c1", T0)))
    [v] = w.final_violations()
    assert "were never seen done" in v


OTHER = ClusterShape("c2", "default", 0, 2, 1)


def _three(max_concurrent: int) -> ChaosWatcher:
    w = ChaosWatcher(Schedule(0, (CANARY, PROD, OTHER), (), max_concurrent=max_concurrent),
                     soak=timedelta(seconds=5))
    for shape in (CANARY, PROD, OTHER):
        for m in shape.machines:
            w.on_node(shape.name, WatchEvent("ADDED", _node(m)))
    w.arm()
    return w


def test_a_cluster_admitted_past_max_concurrent_clusters_is_caught() -> None:
    """c1's node upgrades from T0 to T0+20s; c2 admitted at T0+10s (maxConcurrentClusters
    1): caught, whatever became of c1's NodePlan (a deadline-failed plan whose request is
    still live keeps its cluster's slot). Admitted after c1's request ended: fine."""
    for admitted, caught in ((10, True), (25, False)):
        w = _three(1)
        w.on_plan(WatchEvent("ADDED", _plan("p1", "c1", T0)))
        w.on_node("c1", WatchEvent("MODIFIED", _node("c1-cp-0", plan="p1", created=T0,
                                                     state="Downloading", at=T0)))
        w.on_node("c1", WatchEvent("MODIFIED", _node(
            "c1-cp-0", plan="p1", created=T0, state="FailedDownload",
            at=T0 + timedelta(seconds=20))))
        w.on_plan(WatchEvent("ADDED", _plan("p2", "c2", T0 + timedelta(seconds=admitted))))
        found = [v for v in w.admission_violations() if "maxConcurrentClusters 1" in v]
        assert bool(found) is caught, (admitted, w.admission_violations())
    w = _three(2)  # two at once allowed
    w.on_plan(WatchEvent("ADDED", _plan("p1", "c1", T0)))
    w.on_node("c1", WatchEvent("MODIFIED", _node("c1-cp-0", plan="p1", created=T0,
                                                 state="Downloading", at=T0)))
    w.on_plan(WatchEvent("ADDED", _plan("p2", "c2", T0 + timedelta(seconds=10))))
    assert w.admission_violations() == []


def test_a_request_seen_gone_ends_when_it_was_seen_gone() -> None:
    now = [T0 + timedelta(seconds=30)]
    w = _three(1)
    w.wall = lambda: now[0]
    w.on_node("c1", WatchEvent("MODIFIED", _node("c1-cp-0", plan="p1", created=T0,
                                                 state="Downloading", at=T0)))
    w.on_node("c1", WatchEvent("MODIFIED", _node("c1-cp-0")))  # withdrawn, no end said
    [(start, end)] = [tuple(v) for v in w.spans.values()]
    assert (start, end) == (T0, now[0])


def test_a_cluster_admitted_while_the_record_was_unreadable_is_caught() -> None:
    w = _three(2)
    w.record_unreadable(T0, T0 + timedelta(seconds=20))
    w.on_plan(WatchEvent("ADDED", _plan("p1", "c1", T0 + timedelta(seconds=2))))  # decided before
    w.on_plan(WatchEvent("ADDED", _plan("p2", "c2", T0 + timedelta(seconds=12))))
    [v] = w.admission_violations()
    assert "c2 admitted" in v and "unreadable" in v


def test_wave_policies_vary_over_seeds() -> None:
    policies = {(schedule(s).max_concurrent, schedule(s).failure_budget) for s in range(40)}
    assert policies == {(1, 0), (1, 1), (2, 0), (2, 1)}


def _audit(user: str, verb: str, resource: str, name: str, received: float,  # noqa: PLR0917
           completed: float | None = None, code: int = 200) -> str:
    def at(s: float) -> str:
        return (T0 + timedelta(seconds=s)).isoformat().replace("+00:00", "Z")
    return json.dumps({"stage": "ResponseComplete", "verb": verb, "user": {"username": user},
                       "objectRef": {"resource": resource, "name": name},
                       "responseStatus": {"code": code},
                       "requestReceivedTimestamp": at(received),
                       "stageTimestamp": at(completed if completed is not None else received)})


def test_a_write_by_a_replica_that_lost_the_lease_is_caught() -> None:
    lines = [
        _audit("ctl-0", "create", "leases", "lease", 0),
        _audit("ctl-0", "patch", "nodeplans", "a", 1),
        _audit("ctl-1", "update", "leases", "lease", 8, code=409),  # a failed attempt
        _audit("ctl-0", "patch", "nodeplans", "b", 9, completed=11),  # received before
        _audit("ctl-1", "update", "leases", "lease", 10),  # ctl-1 takes over
        _audit("ctl-1", "patch", "nodeplans", "c", 12),
        _audit("ctl-0", "create", "events", "e", 13),  # ctl-0 resumed: acts again
        _audit("test-admin", "patch", "nodeplans", "d", 14),  # not a replica
    ]
    [v] = two_leaders(writes(lines, user_prefix="ctl-"), lease="lease")
    assert v.startswith("ctl-0 wrote create events e") and "after ctl-1" in v
    assert two_leaders(writes(lines[:6], user_prefix="ctl-"), lease="lease") == []
