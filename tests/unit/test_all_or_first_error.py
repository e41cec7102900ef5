"""fleet.controllers.takeover.all_or_first_error: a taken shard's clusters are read again
several at a time; the first failure is raised as itself, and nothing more is started."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from fleet.controllers.takeover import all_or_first_error
from fleet.kube import KubeError

pytestmark = pytest.mark.anyio


async def test_every_call_runs_at_most_limit_at_once() -> None:
    running, most, done = 0, 0, []

    def call(i: int) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            nonlocal running, most
            running += 1
            most = max(most, running)
            for _ in range(3):
                await anyio.lowlevel.checkpoint()
            running -= 1
            done.append(i)
        return run

    await all_or_first_error([call(i) for i in range(10)], 3)
    assert sorted(done) == list(range(10)) and most == 3


async def test_the_first_kube_error_is_raised_and_nothing_more_starts() -> None:
    started: list[int] = []
    release = anyio.Event()

    def call(i: int) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            started.append(i)
            if i == 0:
                raise KubeError("list machines: HTTP 500")
            await release.wait()  # the other one running ends after the failure
        return run

    async def end_the_second() -> None:
        while 0 not in started:
            await anyio.lowlevel.checkpoint()
        release.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(end_the_second)
        with pytest.raises(KubeError, match="list machines"):
            await all_or_first_error([call(i) for i in range(6)], 2)
    # 1 may have started before 0 failed (then it ran to its end); 2..5 never started
    assert 0 in started and set(started) <= {0, 1}
