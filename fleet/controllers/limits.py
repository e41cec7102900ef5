"""Limits on the actions in flight: how many run at once (overall, and per workload
cluster so one busy cluster cannot take every slot), and how long an object whose action
failed cools down before it is given another (backing off per object)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime, timedelta

import anyio

from fleet.kube.backoff import Backoff
from fleet.world.model import ClusterKey

Target = tuple[str, ...]  # the object an action acts on (fleet.controllers.dispatcher)


async def hold_token(stack: contextlib.AsyncExitStack, limiter: anyio.CapacityLimiter
                     ) -> None:
    """Take one of ``limiter``'s tokens for the life of ``stack``: without yielding when one
    is free and nobody waits, else in turn. anyio's ``acquire`` yields to the event loop even
    when a token is free, and each yield let the control loop run a whole planning pass
    (5-35 ms at 1000 clusters) before this group's first request was sent: a NodePlan's
    create waited behind a pass that had nothing to do with it (bench/README.md "Requests
    sent before the next pass")."""
    try:
        limiter.acquire_nowait()
    except anyio.WouldBlock:
        await limiter.acquire()
    stack.callback(limiter.release)


class ActionLimits:
    """The limiters and the cooldowns of a controller's actions (see the module
    docstring)."""

    def __init__(self, *, concurrency: int, cluster_concurrency: int,
                 clock: Callable[[], datetime]) -> None:
        self.clock = clock
        self.limiter = anyio.CapacityLimiter(concurrency)
        # Writes in flight per workload cluster (its Nodes, and its objects in the
        # management cluster): one busy cluster cannot take every slot.
        self.cluster_concurrency = cluster_concurrency
        self._cluster_limiters: dict[ClusterKey, anyio.CapacityLimiter] = {}
        self.cooldown: dict[Target, datetime] = {}  # no new action before then
        self._failures: dict[Target, Backoff] = {}

    def cluster_limiter(self, cluster: ClusterKey | None, clusters: int
                        ) -> anyio.CapacityLimiter | None:
        """The cluster's limiter (None: not known); ``clusters``: how many the fleet has
        (limiters of more than four times as many are pruned to those in use)."""
        if cluster is None:
            return None
        limiter = self._cluster_limiters.get(cluster)
        if limiter is None:
            if len(self._cluster_limiters) > 4 * clusters + 64:
                self._cluster_limiters = {k: v for k, v in self._cluster_limiters.items()
                                          if v.borrowed_tokens}
            limiter = self._cluster_limiters[cluster] = anyio.CapacityLimiter(
                self.cluster_concurrency)
        return limiter

    def failed(self, target: Target) -> float:
        """An action on ``target`` failed: it cools down for the next delay of its
        backoff (returned, in seconds)."""
        backoff = self._failures.setdefault(
            target, Backoff(initial=0.2, maximum=10.0))
        delay = backoff.next_delay()
        self.cooldown[target] = self.clock() + timedelta(seconds=delay)
        return delay

    def succeeded(self, target: Target) -> None:
        """Every action of a group on ``target`` succeeded: its backoff starts over."""
        self._failures.pop(target, None)

    def cooled(self, now: datetime) -> list[Target]:
        """The targets whose cooldown ended by ``now`` (no longer cooling from here)."""
        ended = []
        for target, until in list(self.cooldown.items()):
            if until <= now:
                del self.cooldown[target]
                ended.append(target)
        return ended
