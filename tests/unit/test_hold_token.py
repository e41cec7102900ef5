"""A pass's action groups take their capacity tokens without yielding when tokens are free
(fleet.controllers.limits.hold_token): started by the control loop, a group reaches its
first request within the one yield of the loop's next wait, instead of letting a whole
planning pass run first (bench/README.md "Requests sent before the next pass")."""

from __future__ import annotations

import contextlib

import anyio
import anyio.lowlevel
import pytest

from fleet.controllers.limits import hold_token


async def _started_group(take: str, per_cluster: anyio.CapacityLimiter,
                         overall: anyio.CapacityLimiter, reached: list[str]) -> None:
    async with contextlib.AsyncExitStack() as stack:
        if take == "hold_token":
            await hold_token(stack, per_cluster)
            await hold_token(stack, overall)
        else:  # what the groups did before: anyio's own acquire, as a context manager
            await stack.enter_async_context(per_cluster)
            await stack.enter_async_context(overall)
        reached.append(take)
        await anyio.sleep_forever()  # the request, on the wire


@pytest.mark.anyio
@pytest.mark.parametrize("take, first_yield", [("hold_token", True), ("async with", False)])
async def test_a_group_with_free_tokens_reaches_its_request_within_one_yield(
        take: str, first_yield: bool) -> None:
    per_cluster, overall = anyio.CapacityLimiter(4), anyio.CapacityLimiter(16)
    reached: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_started_group, take, per_cluster, overall, reached)
        await anyio.lowlevel.checkpoint()  # the loop's wait for its next pass yields once
        # With anyio's acquire (one yield per limiter even when free) the loop would have
        # run its next pass here, before the group's request went out.
        assert (reached == [take]) is first_yield
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
        assert reached == [take]
        assert per_cluster.borrowed_tokens == overall.borrowed_tokens == 1
        tg.cancel_scope.cancel()
    assert per_cluster.borrowed_tokens == overall.borrowed_tokens == 0


@pytest.mark.anyio
async def test_a_full_limiter_is_waited_for_in_turn_and_every_token_is_given_back() -> None:
    limiter = anyio.CapacityLimiter(1)
    order: list[str] = []
    release_first = anyio.Event()

    async def group(name: str, until: anyio.Event | None) -> None:
        async with contextlib.AsyncExitStack() as stack:
            await hold_token(stack, limiter)
            order.append(name)
            if until is not None:
                await until.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(group, "first", release_first)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(group, "queued", None)
        await anyio.wait_all_tasks_blocked()
        # A token given back goes to the group already waiting for it, not to one that
        # arrives then: "late" comes after "queued".
        release_first.set()
        tg.start_soon(group, "late", None)
    assert order == ["first", "queued", "late"]
    assert limiter.borrowed_tokens == 0


@pytest.mark.anyio
async def test_a_group_cancelled_while_waiting_holds_nothing() -> None:
    limiter = anyio.CapacityLimiter(1)
    held, done = anyio.Event(), anyio.Event()

    async def holder() -> None:
        async with contextlib.AsyncExitStack() as stack:
            await hold_token(stack, limiter)
            held.set()
            await done.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await held.wait()
        with anyio.move_on_after(0.01) as scope:
            async with contextlib.AsyncExitStack() as stack:
                await hold_token(stack, limiter)
                pytest.fail("took a token that was held")
        assert scope.cancelled_caught
        assert limiter.borrowed_tokens == 1
        assert limiter.statistics().tasks_waiting == 0
        done.set()
    assert limiter.borrowed_tokens == 0
