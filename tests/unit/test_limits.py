"""The limits on a controller's actions (fleet.controllers.limits.ActionLimits), without a
server: a failed object cools down for its backoff's next delay (growing while it keeps
failing, from the start again once it succeeded), and one limiter per workload cluster."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleet.controllers.limits import ActionLimits

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TARGET = ("md", "ns", "md-0")


def test_a_failed_object_cools_down_longer_each_time_until_it_succeeds() -> None:
    now = [T0]
    limits = ActionLimits(concurrency=16, cluster_concurrency=4, clock=lambda: now[0])
    first = limits.failed(TARGET)
    assert limits.cooldown[TARGET] == T0 + timedelta(seconds=first)
    assert limits.cooled(T0) == [] and TARGET in limits.cooldown
    assert limits.cooled(T0 + timedelta(seconds=first)) == [TARGET]
    assert TARGET not in limits.cooldown
    delays = [first] + [limits.failed(TARGET) for _ in range(8)]
    # (Backoff(initial=0.2, maximum=10): each delay in [cap / 2, cap], the cap doubling)
    assert 0.1 <= delays[0] <= 0.2 and 5.0 <= delays[-1] <= 10.0
    limits.succeeded(TARGET)
    assert limits.failed(TARGET) <= 0.2  # started over


def test_one_limiter_per_workload_cluster_none_for_an_unknown_one() -> None:
    limits = ActionLimits(concurrency=16, cluster_concurrency=4, clock=lambda: T0)
    a = limits.cluster_limiter(("ns", "a"), clusters=2)
    assert a is not None and a.total_tokens == 4
    assert limits.cluster_limiter(("ns", "a"), clusters=2) is a
    assert limits.cluster_limiter(("ns", "b"), clusters=2) is not a
    assert limits.cluster_limiter(None, clusters=2) is None
    assert limits.limiter.total_tokens == 16
