"""API requests per node upgrade, counted by the API servers themselves (audit log).

One cluster (a control plane and six workers, maxUnavailable 2) rolled to a new version
by the controller, with the fleet rollout policy as `k0s-fleet controller` runs it (its
record kept from a watch), and the real agents on a test world of its own; every request
of the controller (management and workload cluster, reads and writes, watches) and of
the agents is counted (tests/helpers/upgradecost.py). Issue #13's target is at most 10
requests of the controller per node upgrade: with a hand-edited bump (before #11) it
measured 9.57-9.86 (bench/README.md, `requests.py`), bound 11 then, since a node step
that lasts longer than status_settle on a loaded machine costs one more NodePlan status
write (up to +0.7 per node seen). With the record read by a GET per pass instead of the
watch the same rollout cost 19.7-21.7, so the rollout ConfigMap is also asserted to be
read from the watch.

With #11's one writer of versions the bump is a FleetUpgrade (a hand edit is reported,
never rolled) and the controller writes the versions itself: 15.0-15.7 per node measured
before #13 item 5's second round; after it (the FleetUpgrade status patched from the
cached object, no GET first; its count-only changes coalesced; no per-node success
Event) 11.9-12.1 (bench/README.md, "Under the FleetUpgrade flow"). After its third round
(NodePlans created started, no status write before the signal; a worker's completion
recorded on its Machine with its spec.version at the end of the paused sequence; the
MachineSet paused and moved in one write; no PauseReleased Event; a control plane's
Completed NodePlan counting while its Machine write lands) 9.57-9.71 at load average
~25 (bench/README.md, "Third round"), against 11.9-12.0 before it: the bound asserted is
#13's target, 10. What still varies with the machine's load: a node step outlasting
status_settle adds a NodePlan status write, and a slow rollout more coalesced
FleetUpgrade count writes (one per 5 s).
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.upgradecost import AGENT_USER, CONTROLLER_USER, measure_rollout


@pytest.mark.anyio
async def test_controller_requests_per_node_upgrade_bounded() -> None:
    cost = await measure_rollout(control_planes=1, workers=6, max_unavailable=2)
    print(json.dumps(cost.summary(), indent=1))
    assert cost.nodes == 7
    # the count is real: every node was at least created, signalled and completed
    assert len(cost.of(CONTROLLER_USER)) >= 3 * cost.nodes
    assert len(cost.of(AGENT_USER)) >= cost.nodes
    record_reads = [r for r in cost.of(CONTROLLER_USER, "mgmt")
                    if r.resource == "configmaps" and r.verb == "get"]
    assert len(record_reads) <= 1, "the rollout record is read from its watch, not per pass"
    # the FleetUpgrade's status is patched from the cached object (a GET only after a 409)
    upgrade_reads = [r for r in cost.of(CONTROLLER_USER, "mgmt")
                     if r.resource.startswith("fleetupgrades") and r.verb == "get"]
    conflicts = [r for r in cost.of(CONTROLLER_USER, "mgmt")
                 if r.resource == "fleetupgrades/status" and r.code == 409]
    assert len(upgrade_reads) <= len(conflicts), upgrade_reads
    # ... and, its count-only changes coalesced, still says where the rollout stands
    status = cost.upgrade_status
    assert status["phase"] == "Complete" and status["nodesUpToDate"] == cost.nodes, status
    assert status["clusters"][0]["nodes"] == f"{cost.nodes}/{cost.nodes}", status
    # no status write between a NodePlan's create and its signal (created started): at
    # most the node's first answer and the completion, plus what a step outlasting
    # status_settle adds on a loaded machine (one more per node at the very most)
    plan_status = [r for r in cost.of(CONTROLLER_USER, "mgmt")
                   if r.resource == "nodeplans/status"]
    assert len(plan_status) <= 3 * cost.nodes, plan_status
    # a worker's Machine is written once (spec.version and the record of its completion)
    machine_writes = [r for r in cost.of(CONTROLLER_USER, "mgmt")
                      if r.resource == "machines" and r.write and r.code < 300]
    assert len(machine_writes) == cost.nodes, machine_writes
    # #13's target (see the module docstring)
    assert cost.per_node(CONTROLLER_USER) <= 10, cost.breakdown(CONTROLLER_USER)
