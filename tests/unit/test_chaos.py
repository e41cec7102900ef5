"""The CI-sized slice of the chaos suite (issue #12 item 7; `make chaos` runs 1000+).

Seeded trials over simulated fleets of >= 3 clusters, the real gate and planner, faults
from tests.helpers.chaos.FAULTS, an independent watcher at every event. The seeds of
failing trials are printed for replay (`python -m tests.helpers.chaos --seed N`).
K0S_FLEET_CHAOS_TRIALS / K0S_FLEET_CHAOS_FIRST_SEED change the slice.
"""

from __future__ import annotations

import os
import time

from tests.helpers.chaos import FAULTS, Trial, run_trials, summary

TRIALS = int(os.environ.get("K0S_FLEET_CHAOS_TRIALS", "200"))
FIRST = int(os.environ.get("K0S_FLEET_CHAOS_FIRST_SEED", "0"))


def test_chaos_slice_has_no_violations() -> None:
    t0 = time.monotonic()
    results = run_trials(range(FIRST, FIRST + TRIALS))
    report = summary(results, time.monotonic() - t0)
    print(report)
    assert all(r.ok for r in results), report
    injected = {k for r in results for k in r.faults}
    assert injected == set(FAULTS), f"faults never injected: {set(FAULTS) - injected}"
    assert sum(r.completed_nodes for r in results) > 0


def test_watcher_catches_a_controller_that_ignores_the_waves() -> None:
    caught = [r for r in (Trial(seed, ignore_waves=True).run() for seed in range(10))
              if any("was not complete and soaked" in v for v in r.violations)]
    assert len(caught) >= 8, "the watcher must see clusters of later waves start early"


def test_a_trial_replays_from_its_seed() -> None:
    a, b = Trial(42).run(), Trial(42).run()
    assert (a.events, a.faults, a.steps, a.violations) == (b.events, b.faults, b.steps,
                                                            b.violations)
