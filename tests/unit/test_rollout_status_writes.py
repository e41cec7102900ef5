"""How often a rolled cluster's K0sControlPlane and MachineDeployment status is written.

Issue #13 target 2 (bench/README.md "Fewer status writes per rolled cluster"): the MD and
KCP status patches were 59 % of a sharded fleet's writes. Each status write must say
something new; a message that changes on the pass after a dispatch (or names which
control plane the workers wait for) cost a write per node without telling the operator
more. The status still tells the truth whenever the passes settle: at the end of every
node the counts are the nodes done, and the names are the node in flight.
"""

from __future__ import annotations

from collections import Counter

from fleet.planner import PlannerSettings, plan
from fleet.planner.actions import SetRolloutStatus
from fleet.planner.conditions import PROGRESSING, UP_TO_DATE
from fleet.planner.simulate import SimFleet, add_cluster, bump
from fleet.world.model import KIND_KCP, KIND_MD
from tests.helpers.gate import T0

V1 = "v1.31.2+k0s.0"
V2 = "v1.31.3+k0s.0"
KEY = ("fleet", "c")


def _settle(sim: SimFleet, writes: Counter[str]) -> None:
    """Passes until one has nothing to do (the controller plans on every event)."""
    for _ in range(20):
        actions = plan(sim.snapshot(), PlannerSettings()).actions
        if not actions:
            return
        writes.update(a.owner.kind for a in actions if isinstance(a, SetRolloutStatus))
        sim.apply_all(actions)
        sim.advance(0.1)
    raise AssertionError("the passes never settled")


def _roll(control_planes: int, workers: int) -> tuple[Counter[str], list[tuple[int, int]]]:
    sim = SimFleet(now=T0)
    add_cluster(sim, "c", namespace="fleet", control_planes=control_planes, workers=workers,
                max_unavailable=1, version=V1)
    writes: Counter[str] = Counter()
    _settle(sim, writes)  # at V1: up to date
    writes.clear()
    bump(sim, KEY, V2)
    seen: list[tuple[int, int]] = []
    for _ in range(400):
        _settle(sim, writes)
        kcp = sim.control_planes[("fleet", "c-cp")]
        md = sim.deployments[("fleet", "c-md")]
        done = sum(1 for n in (sim.nodes[KEY] or {}).values() if n.running_version == V2
                   and n.signal is not None and n.signal.status is not None
                   and n.signal.status.status.terminal)
        # The truth once the passes settled: the counts are the finished nodes (a
        # control plane's as its Machine records it), and what runs is named.
        counted = int(kcp.status.counts["updated"]) + int(md.status.counts["updated"])
        assert counted <= done
        for owner in (kcp, md):
            flight = [m.ref.name for m in sim.machines.values() if m.owner == owner.ref
                      and sim.nodes[KEY] is not None
                      and (n := (sim.nodes[KEY] or {}).get(m.node_name)) is not None
                      and n.signal is not None and (n.signal.status is None
                                                    or not n.signal.status.status.terminal)]
            prog = owner.status.condition(PROGRESSING)
            assert prog is not None
            for name in flight:
                assert name in prog.message, (name, prog)
        seen.append((int(kcp.status.counts["updated"]), int(md.status.counts["updated"])))
        active = sim.active_requests()
        if not active:
            up = [o.status.condition(UP_TO_DATE) for o in (kcp, md)]
            if all(c is not None and c.status == "True" for c in up):
                return writes, seen
        for ckey, node in active:
            sim.step_node(ckey, node)
        sim.advance(1)
    raise AssertionError("the rollout never finished")


def test_a_control_plane_is_written_once_per_node_not_twice() -> None:
    writes, seen = _roll(control_planes=3, workers=1)
    assert seen[-1] == (3, 1)
    # one per control plane (its dispatch, with the others' wait), and the end; before:
    # each dispatch was followed a pass later by "...; another control plane is being
    # upgraded" (7 writes for 3 control planes)
    assert writes[KIND_KCP] <= 3 + 1, writes


def test_workers_wait_for_the_control_planes_in_one_status() -> None:
    writes, seen = _roll(control_planes=3, workers=7)
    assert seen[-1] == (3, 7)
    # KCP: one per control plane and the end; MD: the wait for the control planes once
    # (it named the Machine awaited: one write per control plane), one per worker, the end
    assert writes[KIND_KCP] <= 3 + 1, writes
    assert writes[KIND_MD] <= 1 + 7 + 1, writes
