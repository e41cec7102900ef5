"""Leader election on a coordination.k8s.io Lease, as client-go's leaderelection does it.

Only the holder of the Lease runs the controller. The holder renews it every
``renew_every`` seconds; another candidate takes it over when the record has not moved
for ``lease_seconds`` as measured on its own monotonic clock (so clock skew between
hosts does not matter). Every write carries the Lease's resourceVersion, so two
candidates can never both believe they won.

The holder stops acting ``renew_deadline`` (2/3 of the lease by default) after the
*start* of its last successful renewal, and each renewal attempt is cut off at that same
instant: a stalled API server (a GET or PUT that neither answers nor fails) cannot keep
an old leader acting past the point where a standby, which counts the lease from when it
*observed* the last renewal (necessarily after that attempt started), may take over.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import anyio

from fleet.controllers.renewal import (
    Heartbeat,
    RenewalThread,
    Wake,
    renew_while_held,
    stall_bound,
)
from fleet.kube import AlreadyExistsError, ConflictError, KubeClient, KubeError, NotFoundError
from fleet.kube.resources import LEASES
from fleet.world.fence import WriteFence, lease_clock
from fleet.world.model import format_time

log = logging.getLogger(__name__)


def lease_timings(lease_seconds: float, renew_every: float | None,
                  renew_deadline: float | None, *, what: str) -> tuple[float, float]:
    """A lease holder's renewal period and per-attempt deadline (by default a third and
    two thirds of the lease); timings under which a holder could outlive its lease are
    refused, naming ``what`` needs them."""
    every = renew_every or lease_seconds / 3
    deadline = renew_deadline or lease_seconds * 2 / 3
    if not 0 < every < deadline < lease_seconds:
        raise ValueError(
            f"{what} needs 0 < renew_every ({every}) < renew_deadline "
            f"({deadline}) < lease_seconds ({lease_seconds})")
    return every, deadline


class LostLeadershipError(RuntimeError):
    """The Lease could not be renewed in time; this instance must stop acting."""


def _micro_now() -> str:
    return format_time(datetime.now(UTC))


class LeaderElector:
    def __init__(self, client: KubeClient, *, namespace: str, identity: str,
                 name: str = "k0s-fleet-controller", lease_seconds: int = 15,
                 renew_every: float | None = None, retry_every: float | None = None,
                 renew_deadline: float | None = None,
                 stall_seconds: float | None = None,
                 on_stall: Callable[[str], None] | None = None,
                 monotonic: Callable[[], float] = lease_clock) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_every, self.renew_deadline = lease_timings(
            lease_seconds, renew_every, renew_deadline, what="leader election")
        self.retry_every = retry_every or lease_seconds / 5
        self.stall_seconds = stall_bound(lease_seconds, stall_seconds, self.renew_deadline,
                                         what="leader election")
        self.on_stall = on_stall
        self.problem: str | None = None  # why renewals stopped (for /healthz)
        self.monotonic = monotonic
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self.leading = False
        self.transitions = 0
        self._held_until = float("-inf")  # monotonic: last good renewal + renew_deadline

    def holds(self) -> bool:
        """Leading, with the last renewal recent enough on this process's own clock: a
        process resumed after a stop past its renew deadline does not write on (its
        renewal task may not have run yet)."""
        return self.leading and self.monotonic() < self._held_until

    def remaining(self) -> float:
        """Seconds this process still knows it leads, on its own clock (<= 0: not)."""
        return self._held_until - self.monotonic() if self.leading else 0.0

    def fence(self) -> WriteFence:
        """The fence of the leader's writes (:meth:`fleet.kube.KubeClient.fenced`)."""
        return WriteFence(self.holds, self.remaining)

    def _body(self, lease: dict[str, Any] | None, *, take: bool) -> dict[str, Any]:
        spec = dict((lease or {}).get("spec") or {})
        now = _micro_now()
        if take:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if lease is not None else 0)
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=self.lease_seconds,
                    renewTime=now)
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if lease is not None:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return {"apiVersion": LEASES.api_version, "kind": LEASES.kind, "metadata": meta,
                "spec": spec}

    async def try_acquire_or_renew(self, client: KubeClient | None = None) -> bool:
        client = client or self.client
        try:
            lease = await client.get(LEASES, self.name, self.namespace)
        except NotFoundError:
            try:
                await client.create(LEASES, self._body(None, take=True), self.namespace)
            except AlreadyExistsError:
                return False
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"),
                  lease["metadata"].get("resourceVersion"))
        if record != self._observed:
            self._observed, self._observed_at = record, self.monotonic()
        if holder and holder != self.identity:
            duration = int(spec.get("leaseDurationSeconds") or self.lease_seconds)
            if self.monotonic() - self._observed_at < duration:
                return False
            log.info("lease %s/%s held by %s expired; taking over", self.namespace, self.name,
                     holder)
        try:
            await client.replace(LEASES, self._body(lease, take=holder != self.identity))
        except ConflictError:
            return False
        return True

    async def _attempt(self, client: KubeClient, deadline: float) -> bool:
        """One acquire-or-renew, abandoned after ``deadline`` seconds (stalled server)."""
        with anyio.move_on_after(deadline) as scope:
            try:
                return await self.try_acquire_or_renew(client)
            except KubeError as e:
                log.warning("leader election (%s/%s): %s", self.namespace, self.name, e)
                return False
        if scope.cancelled_caught:
            log.warning("leader election (%s/%s): no answer within %.1fs", self.namespace,
                        self.name, deadline)
        return False

    async def release(self) -> None:
        try:
            lease = await self.client.get(LEASES, self.name, self.namespace)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            body = self._body(lease, take=False)
            body["spec"].update(holderIdentity=None, leaseDurationSeconds=1)
            await self.client.replace(LEASES, body)
        except KubeError as e:
            log.info("could not release lease: %s", e)

    async def _keep(self, client: KubeClient, wake: Wake, heartbeat: Heartbeat) -> None:
        """Acquire, then renew, on the renewal thread (``client`` is its own); returns
        (``leading`` cleared, ``problem`` set, the main loop woken) once a renewal is
        overdue or the main loop stalled past its bound. No take-over while it is."""
        try:
            while True:
                started = self.monotonic()
                if heartbeat.stalled() is None and \
                        await self._attempt(client, self.renew_deadline):
                    break
                await anyio.sleep(self.retry_every)
            self._held_until = started + self.renew_deadline
            self.leading = True
            self.transitions += 1
            wake.set()

            def renewed(at: float) -> None:
                self._held_until = at + self.renew_deadline

            end = await renew_while_held(
                lease=f"lease {self.namespace}/{self.name}", identity=self.identity,
                attempt=lambda left: self._attempt(client, left), renewed=renewed,
                last_ok=started, heartbeat=heartbeat, renew_every=self.renew_every,
                renew_deadline=self.renew_deadline, monotonic=self.monotonic)
            self.problem = end.problem
            self.leading = False  # stop before another candidate may take over
            wake.set()
            if end.stalled and self.on_stall is not None:
                self.on_stall(self.problem)
        finally:
            self.leading = False

    async def run(self, lead: Callable[[], Awaitable[None]]) -> None:
        """Wait for the Lease, then run ``lead()`` while holding it (the Lease acquired
        and renewed on a thread of its own: fleet.controllers.renewal).

        Returns when ``lead`` returns; raises LostLeadershipError when renewal failed.
        """
        self.problem = None
        wake = Wake()
        heartbeat = Heartbeat(self.stall_seconds, monotonic=self.monotonic)
        thread = RenewalThread(f"lease-{self.name}", self.client)
        lost = False
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(heartbeat.run)
                thread.start(lambda client: self._keep(client, wake, heartbeat), wake.set)
                while not self.leading:
                    if not thread.running:
                        lost = True
                        break
                    await wake.wait(self.retry_every)
                else:
                    log.info("%s leads (lease %s/%s)", self.identity, self.namespace,
                             self.name)

                    async def lead_then_stop() -> None:
                        await lead()
                        tg.cancel_scope.cancel()

                    tg.start_soon(lead_then_stop)
                    while self.leading and thread.running:
                        await wake.wait(self.renew_every)
                    lost = True  # stop before another candidate may take over
                tg.cancel_scope.cancel()
        finally:
            self.leading = False
            self._held_until = float("-inf")
            await thread.stop_and_join(self.renew_deadline)
            if not lost:
                with anyio.CancelScope(shield=True), anyio.move_on_after(self.renew_deadline):
                    await self.release()
        if lost:
            raise LostLeadershipError(
                f"{self.identity}: could not renew lease {self.namespace}/{self.name}"
                + (f" ({self.problem})" if self.problem else
                   f" (renewal thread ended: {thread.error!r})" if thread.error else ""))
