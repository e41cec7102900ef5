"""fleet.controllers.eventloop: at most a few ready sockets a turn, all of them served in
order over the turns, and what the first reads woke runs before the last are read."""

from __future__ import annotations

import asyncio
import selectors
import socket
from collections.abc import Iterator

import pytest

from fleet.controllers.eventloop import FairEpollSelector, new_event_loop


@pytest.fixture
def pairs() -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    made = [socket.socketpair() for _ in range(10)]
    try:
        yield made
    finally:
        for a, b in made:
            a.close()
            b.close()


def test_a_few_ready_sockets_a_call_and_every_one_in_turn(
        pairs: list[tuple[socket.socket, socket.socket]]) -> None:
    sel = FairEpollSelector(ready_per_turn=3)
    try:
        for i, (a, b) in enumerate(pairs):
            sel.register(a, selectors.EVENT_READ, i)
            b.send(b"x")  # all ten readable, and they stay so (nobody reads)
        got = [[key.data for key, _ in sel.select(0)] for _ in range(4)]
        assert [len(g) for g in got] == [3, 3, 3, 3]
        # level-triggered: one handed out goes to the back; the ten come round in order
        flat = [i for g in got for i in g]
        assert sorted(flat[:10]) == list(range(10))
        assert flat[10:] == flat[:2]
        assert all(mask == selectors.EVENT_READ for key, mask in sel.select(0))
        for a, _ in pairs:  # read: none ready any more
            a.recv(1)
        assert sel.select(0) == [] and sel.calls == 6
    finally:
        sel.close()


def test_a_task_woken_by_an_early_read_runs_before_the_last_reads() -> None:
    loop = new_event_loop(ready_per_turn=4)
    made = [socket.socketpair() for _ in range(40)]
    order: list[str] = []

    async def main() -> None:
        woken = asyncio.Event()

        async def waiter() -> None:
            await woken.wait()
            order.append("task")

        task = asyncio.ensure_future(waiter())
        await asyncio.sleep(0)
        done = asyncio.get_running_loop().create_future()

        def on_read(i: int, sock: socket.socket) -> None:
            sock.recv(1)
            asyncio.get_running_loop().remove_reader(sock)
            order.append(f"read {i}")
            woken.set()
            if sum(o != "task" for o in order) == 40:
                done.set_result(None)

        for i, (a, b) in enumerate(made):
            asyncio.get_running_loop().add_reader(a, on_read, i, a)
            b.send(b"x")
        await done
        await task

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
        for a, b in made:
            a.close()
            b.close()
    assert order.index("task") < 12  # after a turn or two of reads, not after all 40
    assert sorted(o for o in order if o != "task") == sorted(f"read {i}" for i in range(40))


def test_ready_per_turn_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        FairEpollSelector(0)
