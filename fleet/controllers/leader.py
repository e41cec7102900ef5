"""Leader election on a coordination.k8s.io Lease, as client-go's leaderelection does it.

Only the holder of the Lease runs the controller. The holder renews it every
``renew_every`` seconds; another candidate takes it over when the record has not moved
for ``lease_seconds`` as measured on its own monotonic clock (so clock skew between
hosts does not matter). A holder that cannot renew for ``lease_seconds`` stops leading
before anyone else may start. Every write carries the Lease's resourceVersion, so two
candidates can never both believe they won.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import anyio

from fleet.kube import AlreadyExistsError, ConflictError, KubeClient, KubeError, NotFoundError
from fleet.kube.resources import LEASES
from fleet.model import format_time

log = logging.getLogger(__name__)


class LostLeadershipError(RuntimeError):
    """The Lease could not be renewed in time; this instance must stop acting."""


def _micro_now() -> str:
    return format_time(datetime.now(UTC))


class LeaderElector:
    def __init__(self, client: KubeClient, *, namespace: str, identity: str,
                 name: str = "k0s-fleet-controller", lease_seconds: int = 15,
                 renew_every: float | None = None, retry_every: float | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_every = renew_every or lease_seconds / 3
        self.retry_every = retry_every or lease_seconds / 5
        self.monotonic = monotonic
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self.leading = False
        self.transitions = 0

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

    async def try_acquire_or_renew(self) -> bool:
        try:
            lease = await self.client.get(LEASES, self.name, self.namespace)
        except NotFoundError:
            try:
                await self.client.create(LEASES, self._body(None, take=True), self.namespace)
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
            await self.client.replace(LEASES, self._body(lease, take=holder != self.identity))
        except ConflictError:
            return False
        return True

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

    async def run(self, lead: Callable[[], Awaitable[None]]) -> None:
        """Wait for the Lease, then run ``lead()`` while holding it.

        Returns when ``lead`` returns; raises LostLeadershipError when renewal failed.
        """
        while True:
            try:
                if await self.try_acquire_or_renew():
                    break
            except KubeError as e:
                log.warning("leader election: %s", e)
            await anyio.sleep(self.retry_every)
        self.leading = True
        self.transitions += 1
        log.info("%s leads (lease %s/%s)", self.identity, self.namespace, self.name)
        lost = False
        try:
            async with anyio.create_task_group() as tg:
                async def lead_then_stop() -> None:
                    await lead()
                    tg.cancel_scope.cancel()

                async def renew() -> None:
                    nonlocal lost
                    last_ok = self.monotonic()
                    while True:
                        await anyio.sleep(self.renew_every)
                        try:
                            ok = await self.try_acquire_or_renew()
                        except KubeError as e:
                            log.warning("renewing lease: %s", e)
                            ok = False
                        if ok:
                            last_ok = self.monotonic()
                        elif self.monotonic() - last_ok >= self.lease_seconds * 2 / 3:
                            # Stop well before another candidate may take over.
                            lost = True
                            tg.cancel_scope.cancel()
                            return

                tg.start_soon(lead_then_stop)
                tg.start_soon(renew)
        finally:
            self.leading = False
            if not lost:
                with anyio.CancelScope(shield=True):
                    await self.release()
        if lost:
            raise LostLeadershipError(f"{self.identity}: could not renew lease "
                                      f"{self.namespace}/{self.name}")
