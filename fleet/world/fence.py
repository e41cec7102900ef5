"""On whose behalf a write is sent, for the Lease fences of the controller's clients.

A replica's writes are fenced by the Lease(s) it writes under
(:meth:`fleet.kube.KubeClient.fenced`): the client asks its fence before sending each
write. With one leader the fence is the leader Lease alone; with sharded replicas it also
depends on what the write is for: a cluster's writes need that cluster's shard held, the
fleet-wide writes (wave times in the rollout record, FleetUpgrade status) the writer
Lease. The code that sends a write says which, with the context managers here; the fence
reads it back (``contextvars``: each task keeps its own, a task started inside inherits
it, so an Event emitted in the background for an action still counts as that cluster's).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from fleet.world.model import ClusterKey

_CLUSTER: ContextVar[ClusterKey | None] = ContextVar("k0s_fleet_write_cluster", default=None)
_FLEET_WIDE: ContextVar[bool] = ContextVar("k0s_fleet_fleet_wide_write", default=False)


@contextmanager
def writes_for(cluster: ClusterKey | None) -> Iterator[None]:
    """The writes sent inside are for ``cluster`` (None: not known)."""
    token = _CLUSTER.set(cluster)
    try:
        yield
    finally:
        _CLUSTER.reset(token)


@contextmanager
def fleet_wide_writes(on: bool = True) -> Iterator[None]:
    """The writes sent inside (when ``on``) are the fleet-wide writer's."""
    token = _FLEET_WIDE.set(on)
    try:
        yield
    finally:
        _FLEET_WIDE.reset(token)


def write_cluster() -> ClusterKey | None:
    """The cluster the write being sent is for (None: not known, or none)."""
    return _CLUSTER.get()


def fleet_wide() -> bool:
    """Whether the write being sent is the fleet-wide writer's."""
    return _FLEET_WIDE.get()


def lease_clock() -> float:
    """Seconds on the clock the Lease fences run on: one that keeps counting while the
    machine is suspended (Linux ``CLOCK_BOOTTIME``), so that a process resumed after a
    suspension finds its renewal overdue; ``CLOCK_MONOTONIC`` stops during a suspension.
    Where there is no such clock, the monotonic one."""
    return time.clock_gettime(_CLOCK)


_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


@dataclass(frozen=True, slots=True)
class WriteFence:
    """A Lease fence for :meth:`fleet.kube.KubeClient.fenced`: ``holds()`` says whether a
    write may be sent now, ``remaining()`` for how many more seconds the Lease is known to
    be held (<= 0: not held). The client bounds the whole send of a write (its turn for a
    connection, the connect, retries) by ``remaining()``: a write that could not be sent
    within it is not sent at all (FencedError)."""

    holds: Callable[[], bool]
    remaining: Callable[[], float]

    def __call__(self) -> bool:
        return self.holds()


__all__ = ["WriteFence", "fleet_wide", "fleet_wide_writes", "lease_clock", "write_cluster",
           "writes_for"]
