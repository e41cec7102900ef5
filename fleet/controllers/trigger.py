"""The control loop's wake-up: every watch event and every write of its own pokes the
:class:`Trigger`, and any number of pokes while a pass runs make one more pass."""

from __future__ import annotations

import math
import time

import anyio
import anyio.lowlevel


class Trigger:
    """Level-triggered wake-up: any number of pokes while busy make one more pass."""

    def __init__(self) -> None:
        self._event = anyio.Event()
        self.pokes = 0
        self.first_poke: float | None = None  # monotonic time of the oldest unserved poke
        self.served: float | None = None  # ... of the poke the current pass serves

    def poke(self) -> None:
        self.pokes += 1
        if not self._event.is_set():
            self.first_poke = time.monotonic()
        self._event.set()

    async def wait(self, timeout: float | None) -> bool:
        """Wait for a poke (or the timeout); True when poked.

        Always a checkpoint, even when a poke is waiting already: a loop poked again by
        every pass must still yield to other tasks, and must stop once cancelled. Without
        it a controller stopped from outside (its caller's cancel scope) was seen planning
        on, 76 000 passes after the stop: each pass's action groups were cancelled at once
        and poked it again, and anyio's cancel delivery never caught the loop itself.
        ``checkpoint_if_cancelled`` yields until a pending cancellation is delivered."""
        poked = self._event.is_set()
        if poked:
            await anyio.lowlevel.checkpoint_if_cancelled()
            await anyio.lowlevel.checkpoint()
        else:
            with anyio.move_on_after(math.inf if timeout is None else max(0.0, timeout)):
                await self._event.wait()
                poked = True
        self._event = anyio.Event()
        self.served, self.first_poke = (self.first_poke if poked else None), None
        return poked
