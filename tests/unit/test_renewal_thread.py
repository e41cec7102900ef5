"""The renewal schedule of a held Lease (leader and shard member alike)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet.controllers.renewal import renewal_wait


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
