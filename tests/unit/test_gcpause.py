"""fleet.controllers.gcpause: the collector's pauses are timed and the long ones logged."""

from __future__ import annotations

import gc
import logging

import pytest

from fleet.controllers.gcpause import GcPauses, freeze_survivors
from tests.helpers.clock import FakeClock


def test_each_collection_is_timed_and_a_long_one_logged(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    clock = FakeClock(10.0)
    pauses = GcPauses(log_over=0.1, clock=clock)
    with caplog.at_level(logging.INFO, logger="fleet.controllers.gcpause"):
        pauses("start", {"generation": 0})
        clock.now += 0.002
        pauses("stop", {"generation": 0, "collected": 3})
        pauses("start", {"generation": 2})
        clock.now += 0.45
        pauses("stop", {"generation": 2, "collected": 12})
    assert pauses.collections == [1, 0, 1]
    assert pauses.longest[2] == pytest.approx(0.45) and pauses.seconds == pytest.approx(0.452)
    assert [r.getMessage() for r in caplog.records] == [
        "garbage collection of generation 2 stopped the controller for 450 ms "
        "(12 objects freed)"]


def test_it_hears_the_real_collector() -> None:
    pauses = GcPauses()
    pauses.install()
    try:
        gc.collect()
    finally:
        pauses.remove()
    assert pauses.collections[2] >= 1 and pauses not in gc.callbacks


def test_what_lives_at_the_end_of_the_start_up_is_frozen() -> None:
    kept = [{"node": i} for i in range(1000)]
    try:
        assert freeze_survivors() >= len(kept)
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
