"""The renewal schedule and loop of a held Lease (leader and shard member alike)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.controllers.renewal import Heartbeat, renew_while_held, renewal_wait
from tests.helpers.clock import FakeClock


def test_a_good_renewal_is_followed_renew_every_after_its_start() -> None:
    assert renewal_wait(failed=False, last_ok=100.0, now=100.5, renew_every=2.0,
                        renew_deadline=10.0) == 1.5


def test_a_slow_good_renewal_is_followed_at_once() -> None:
    assert renewal_wait(failed=False, last_ok=100.0, now=103.0, renew_every=2.0,
                        renew_deadline=10.0) == 0.0


def test_after_a_failure_the_retry_comes_soon_but_never_past_the_deadline() -> None:
    assert renewal_wait(failed=True, last_ok=100.0, now=101.0, renew_every=2.0,
                        renew_deadline=10.0) == 0.4
    assert renewal_wait(failed=True, last_ok=100.0, now=109.9, renew_every=2.0,
                        renew_deadline=10.0) == pytest.approx(0.1)  # the deadline's rest


@given(failed=st.booleans(), elapsed=st.floats(0, 30), every=st.floats(0.1, 5),
       deadline_factor=st.floats(1, 5))
def test_the_wait_never_passes_the_deadline(failed: bool, elapsed: float, every: float,
                                            deadline_factor: float) -> None:
    deadline = every * deadline_factor
    wait = renewal_wait(failed=failed, last_ok=0.0, now=elapsed, renew_every=every,
                        renew_deadline=deadline)
    assert wait >= 0.0
    assert elapsed + wait <= max(elapsed, deadline) + 1e-9



@pytest.mark.anyio
async def test_renewals_stop_once_none_landed_within_the_deadline_of_the_last_good_one(
) -> None:
    clock = FakeClock()
    outcomes = iter([True, True])  # then every renewal fails
    timeouts: list[float] = []
    renewed: list[float] = []

    async def attempt(timeout: float) -> bool:
        timeouts.append(timeout)
        clock.now += 0.3  # each renewal takes 0.3 s to answer
        return next(outcomes, False)

    end = await renew_while_held(
        lease="member lease ns/m", identity="r-1", attempt=attempt, renewed=renewed.append,
        last_ok=0.0, heartbeat=Heartbeat(100.0, monotonic=clock), renew_every=0.01,
        renew_deadline=1.0, monotonic=clock)
    assert renewed == [0.0, pytest.approx(0.3)]  # the start of each good renewal
    # each cut off at the deadline (1 s) after the start of the last good one (0, then 0.3)
    assert timeouts == [pytest.approx(t) for t in (1.0, 0.7, 0.7, 0.4, 0.1)]
    assert not end.stalled
    assert end.problem == "member lease ns/m not renewed within 1.0s"


@pytest.mark.anyio
async def test_no_renewal_is_sent_once_the_main_loop_stalled() -> None:
    clock = FakeClock()
    heartbeat = Heartbeat(5.0, monotonic=clock)
    attempts: list[float] = []

    async def attempt(timeout: float) -> bool:
        attempts.append(timeout)
        clock.now += 3.0  # the main loop beats no more from here on
        return True

    end = await renew_while_held(
        lease="lease ns/l", identity="r-1", attempt=attempt, renewed=lambda at: None,
        last_ok=0.0, heartbeat=heartbeat, renew_every=0.01, renew_deadline=10.0,
        monotonic=clock)
    assert attempts == [10.0, 7.0]  # at 0 and 3 s; at 6 s the loop is 6 s silent
    assert end.stalled
    assert end.problem.startswith("lease ns/l no longer renewed: the main event loop")
