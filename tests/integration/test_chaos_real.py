"""The CI slice of the real-world chaos suite (issue #12; `make chaos-real` runs many
seeds): one seeded trial with every fault kind once, on its own real test world (etcd,
a management and three workload kube-apiservers), two `k0s-fleet controller` processes,
a real agent per node, judged by the independent watcher at every event and converged
at the end. A failure prints the seed, the schedule, the replay command and keeps the
logs. K0S_FLEET_REAL_CHAOS_SEEDS (comma-separated) changes the seeds.
"""

from __future__ import annotations

import os

import pytest

from tests.helpers.realchaos.schedule import FAULT_KINDS
from tests.helpers.realchaos.trial import run_trial

SEEDS = [int(s) for s in os.environ.get("K0S_FLEET_REAL_CHAOS_SEEDS", "3").split(",")]


@pytest.mark.anyio
@pytest.mark.parametrize("seed", SEEDS)
async def test_seeded_chaos_on_real_processes_breaks_no_rule_and_converges(seed: int) -> None:
    result = await run_trial(seed, small=True, faults=len(FAULT_KINDS))
    print(result.report())
    assert result.ok, result.report()
    assert set(result.faults) == set(FAULT_KINDS), result.faults
    assert result.steps >= 7 * 5  # every node walked its upgrade (at least 5 nodes)
