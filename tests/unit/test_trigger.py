"""The controller loop's wake-up (fleet.controllers.trigger.Trigger): a wait is always a
checkpoint, so a loop that is poked again by every pass still stops when cancelled
(`make stress-restarts` shows it on the real test world)."""

from __future__ import annotations

import anyio
import pytest

from fleet.controllers.trigger import Trigger


@pytest.mark.anyio
async def test_a_wait_for_a_poke_already_there_is_a_cancellation_point() -> None:
    trigger = Trigger()
    trigger.poke()
    with anyio.CancelScope() as scope:
        scope.cancel()
        await trigger.wait(None)
        pytest.fail("the wait returned inside a cancelled scope")
    assert scope.cancelled_caught


@pytest.mark.anyio
async def test_a_wait_for_a_poke_already_there_lets_other_tasks_run() -> None:
    trigger = Trigger()
    ran = False

    async def other() -> None:
        nonlocal ran
        ran = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        trigger.poke()
        assert await trigger.wait(None) is True
        assert ran, "a poked wait returned without letting a ready task run"
