"""The write limiter's token bucket (fleet.kube.ratelimit) on a fake clock: no sleeping,
no wall time. The property: writes released in any interval of length t are at most
burst + qps * t; and the bucket never delays a write the bound would allow."""

from __future__ import annotations

import math

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.kube.ratelimit import TokenBucket, WriteLimiter
from tests.helpers.clock import FakeClock


def test_starts_full_then_one_token_every_1_over_qps() -> None:
    clock = FakeClock(1000.0)
    b = TokenBucket(10, 3, clock=clock)
    assert [b.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    # empty: the waiters queue, the n-th one n/qps after the bucket ran dry
    assert [b.reserve() for _ in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    clock.now += 0.3  # those three tokens came back and went to the waiters
    assert b.reserve() == pytest.approx(0.1)
    assert b.stats.taken == 7 and b.stats.delayed == 4
    assert b.stats.longest_wait == pytest.approx(0.3)


def test_an_idle_bucket_refills_to_burst_and_no_further() -> None:
    clock = FakeClock(1000.0)
    b = TokenBucket(2, 5, clock=clock)
    for _ in range(5):
        b.reserve()
    assert b.tokens() == pytest.approx(0.0)
    clock.now += 1.0
    assert b.tokens() == pytest.approx(2.0)
    clock.now += 3600.0
    assert b.tokens() == pytest.approx(5.0)
    assert [b.reserve() for _ in range(6)][-2:] == [0.0, pytest.approx(0.5)]


def test_a_cancelled_waiter_gives_its_token_back() -> None:
    clock = FakeClock(1000.0)
    b = TokenBucket(1, 1, clock=clock)
    assert b.reserve() == 0.0
    assert b.reserve() == pytest.approx(1.0)
    b.give_back()  # that write was never sent
    clock.now += 1.0
    assert b.reserve() == 0.0
    assert b.stats.returned == 1


@pytest.mark.parametrize(("qps", "burst"), [(0, 1), (-1, 5), (math.inf, 5), (math.nan, 1),
                                            (5, 0)])
def test_refuses_nonsense(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match=r"qps|burst"):
        TokenBucket(qps, burst)


ops = st.lists(st.tuples(st.floats(min_value=0, max_value=2, allow_nan=False),
                         st.integers(min_value=0, max_value=6),
                         st.booleans()), min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(qps=st.floats(min_value=0.5, max_value=50), burst=st.integers(min_value=1, max_value=8),
       steps=ops)
def test_released_writes_never_exceed_burst_plus_qps_times_t(
        qps: float, burst: int, steps: list[tuple[float, int, bool]]) -> None:
    """Writes arrive in clumps at arbitrary times; some waiters give up (their token goes
    back, their write is not sent). For every interval [a, b] between release times, the
    writes released in it are at most burst + qps * (b - a) (float slack 1e-6)."""
    clock = FakeClock(1000.0)
    b = TokenBucket(qps, burst, clock=clock)
    released: list[float] = []
    pending: list[float] = []  # release times of waiters not yet released
    for dt, arrivals, cancel_one in steps:
        clock.now += dt
        released += [t for t in pending if t <= clock.now]
        pending = [t for t in pending if t > clock.now]
        if cancel_one and pending:
            pending.pop()  # the last waiter gives up before its turn
            b.give_back()
        for _ in range(arrivals):
            at = clock.now + b.reserve()
            (pending if at > clock.now else released).append(at)
    released = sorted(released + pending)
    # (j - i + 1) <= burst + qps (t_j - t_i) for all i <= j, i.e. with f(k) = k - qps t_k:
    # f(j) - min over i <= j of f(i) + 1 <= burst
    lowest = math.inf
    for k, t in enumerate(released):
        f = k - qps * t
        lowest = min(lowest, f)
        assert f - lowest + 1 <= burst + 1e-6, (k, released)


@settings(max_examples=200, deadline=None)
@given(qps=st.floats(min_value=0.5, max_value=50), burst=st.integers(min_value=1, max_value=8),
       n=st.integers(min_value=1, max_value=40))
def test_a_burst_at_one_instant_is_released_as_fast_as_the_bound_allows(
        qps: float, burst: int, n: int) -> None:
    """n writes at once from a full bucket: the first `burst` go now, the k-th after
    that (k = 1, 2...) k/qps later: never later than needed."""
    b = TokenBucket(qps, burst, clock=FakeClock(1000.0))
    waits = [b.reserve() for _ in range(n)]
    expected = [max(0, i + 1 - burst) / qps for i in range(n)]
    assert waits == pytest.approx(expected)


@pytest.mark.anyio
async def test_write_limiter_sleeps_the_reserved_delay_and_returns_it_when_cancelled() -> None:
    clock = FakeClock(1000.0)
    slept: list[float] = []
    blocked = anyio.Event()

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 2:
            blocked.set()
            await anyio.sleep_forever()  # cancelled by the test
        clock.now += seconds

    limiter = WriteLimiter(4, 2, clock=clock, sleep=fake_sleep)
    await limiter.wait()
    await limiter.wait()
    assert slept == []
    await limiter.wait()
    assert slept == [pytest.approx(0.25)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(limiter.wait)
        await blocked.wait()
        tg.cancel_scope.cancel()
    assert limiter.stats.returned == 1
    assert limiter.bucket.tokens() == pytest.approx(0.0)  # the token came back


@pytest.mark.parametrize("flags", [["--write-qps", "-1"], ["--write-burst", "0"]])
def test_the_controller_refuses_a_nonsense_write_limit(
        flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from fleet.cli import main  # noqa: PLC0415

    assert main(["controller", "--no-leader-elect", *flags]) == 2
    assert "--write-qps must be 0 (no limit) or positive" in capsys.readouterr().err


def test_the_controllers_default_write_limit_depends_on_sharding() -> None:
    import argparse  # noqa: PLC0415

    from fleet.cli.controller import (  # noqa: PLC0415
        DEFAULT_WRITE_BURST,
        add_arguments,
        write_limiter,
        write_qps,
    )

    p = argparse.ArgumentParser()
    add_arguments(p)
    sharded = p.parse_args(["--shards", "8"])
    limiter = write_limiter(write_qps(sharded), sharded.write_burst)
    assert limiter is not None and (limiter.qps, limiter.burst) == (20.0, DEFAULT_WRITE_BURST)
    single = p.parse_args([])  # the one active replica: no other writer of ours to share with
    assert write_qps(single) == 0 and write_limiter(write_qps(single), 50) is None
    assert write_qps(p.parse_args(["--write-qps", "5"])) == 5  # given: as given
    assert write_qps(p.parse_args(["--shards", "8", "--write-qps", "0"])) == 0
