"""The member Leases of a sharded replica's group: its own, created and renewed (on the
renewal thread, fleet.controllers.renewal), and the others', as this replica sees them
move (by the Lease watch and the looks, on its own monotonic clock): which replicas are
live, when one expires or becomes overdue."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.abc

from fleet.controllers.assignment import (
    GROUP_LABEL,
    REPLICA,
    ROLE_LABEL,
    SHARDS_ANNOTATION,
    lease_now,
    member_lease_name,
)
from fleet.controllers.renewal import Heartbeat, Wake, renew_while_held
from fleet.controllers.shardstate import Seen, ShardState
from fleet.kube import AlreadyExistsError, ConflictError, KubeClient, KubeError, NotFoundError
from fleet.kube.resources import LEASES
from fleet.kube.watch import WatchEvent

log = logging.getLogger(__name__)


class Members(ShardState):
    """This replica's member Lease and the others' (see the module docstring)."""

    # -- the member Lease ----------------------------------------------------------------
    def _labels(self, role: str) -> dict[str, str]:
        return {GROUP_LABEL: self.group, ROLE_LABEL: role}

    async def _renew(self, client: KubeClient) -> None:
        """Create or renew this replica's member Lease (resourceVersion precondition)."""
        lease = self._member
        if lease is None:
            lease = await client.get_or_none(LEASES, self.member_name, self.namespace)
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_seconds,
                "renewTime": lease_now()}
        meta: dict[str, Any] = {"name": self.member_name, "namespace": self.namespace,
                                "labels": self._labels(REPLICA),
                                "annotations": {SHARDS_ANNOTATION: str(self.shards)}}
        if lease is None:
            spec["acquireTime"] = spec["renewTime"]
            try:
                self._member = await client.create(
                    LEASES, {"apiVersion": LEASES.api_version, "kind": LEASES.kind,
                             "metadata": meta, "spec": spec}, self.namespace)
                return
            except AlreadyExistsError:
                lease = await client.get(LEASES, self.member_name, self.namespace)
        meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        body = {"apiVersion": LEASES.api_version, "kind": LEASES.kind, "metadata": meta,
                "spec": {**(lease.get("spec") or {}), **spec}}
        try:
            self._member = await client.replace(LEASES, body)
        except (ConflictError, NotFoundError):
            self._member = None  # re-read next time (someone edited or deleted it)
            raise

    async def _attempt_renew(self, client: KubeClient, deadline: float) -> bool:
        with anyio.move_on_after(deadline) as scope:
            try:
                await self._renew(client)
                return True
            except KubeError as e:
                log.warning("member lease %s/%s: %s", self.namespace, self.member_name, e)
                return False
        if scope.cancelled_caught:
            self._member = None
            log.warning("member lease %s/%s: no answer within %.1fs", self.namespace,
                        self.member_name, deadline)
        return False

    async def _keep(self, client: KubeClient, wake: Wake, heartbeat: Heartbeat) -> None:
        """The member Lease's renewals, on the renewal thread (``client`` is its own):
        every ``renew_every``, each cut off at the renew deadline after the start of the
        last good one; past that deadline, or once the main loop stalled past its bound,
        no more (``active`` cleared, ``problem`` says why, the main loop woken)."""
        try:
            while True:
                started = self.monotonic()
                if await self._attempt_renew(client, self.renew_deadline):
                    break
                await anyio.sleep(self.renew_every / 2)
            self.renewed_at = started
            self.active = True
            wake.set()

            def renewed(at: float) -> None:
                self.renewed_at = at

            end = await renew_while_held(
                lease=f"member lease {self.namespace}/{self.member_name}",
                identity=self.identity,
                attempt=lambda left: self._attempt_renew(client, left), renewed=renewed,
                last_ok=started, heartbeat=heartbeat, renew_every=self.renew_every,
                renew_deadline=self.renew_deadline, monotonic=self.monotonic)
            self.problem = end.problem
            self.active = False
            wake.set()
            if end.stalled and self.on_stall is not None:
                self.on_stall(self.problem)
        finally:
            self.active = False

    # -- observing the others ------------------------------------------------------------
    def _observe(self, key: str, record: tuple[Any, ...], now: float) -> Seen:
        seen = self._seen.get(key)
        if seen is None or seen.record != record:
            seen = self._seen[key] = Seen(record, now)
        return seen

    def _live_members(self, leases: Sequence[dict[str, Any]], now: float
                      ) -> tuple[list[str], dict[str, int]]:
        """Live replica identities (self included) and the shard counts they announce."""
        self._expires.clear()
        live = {self.identity}
        counts: dict[str, int] = {}
        present: set[str] = set()
        for lease in leases:
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            name = lease["metadata"]["name"]
            present.add(name)
            seen = self._observe(name, (holder, spec.get("renewTime"),
                                        lease["metadata"].get("resourceVersion")), now)
            if not holder or holder == self.identity:
                continue
            duration = int(spec.get("leaseDurationSeconds") or self.lease_seconds)
            expires = seen.at + duration * self.expiry / self.lease_seconds
            if now < expires:
                live.add(holder)
                self._expires[name] = expires
                try:
                    counts[holder] = int(((lease["metadata"].get("annotations") or {})
                                          .get(SHARDS_ANNOTATION)) or self.shards)
                except ValueError:
                    counts[holder] = -1
        for name in list(self._seen):
            if name.startswith(f"{self.group}-replica-") and name not in present:
                self._observe(name, ("absent",), now)
        return sorted(live), counts

    def _holder_alive(self, holder: str, now: float) -> bool:
        """Whether ``holder`` may still be acting: its member Lease moved within
        ``expiry`` (renew deadline + margin) on this replica's clock before ``now``, the
        time this look began (absent leases count from when first missed)."""
        seen = self._seen.get(member_lease_name(self.group, holder))
        if seen is None:
            seen = self._observe(member_lease_name(self.group, holder), ("unseen",), now)
        return now - seen.at < self.expiry

    def next_expiry(self) -> float | None:
        """When (monotonic) the next member Lease seen live expires, unless it moves."""
        return min(self._expires.values(), default=None)

    def _last_seen(self, holder: str) -> float | None:
        seen = self._seen.get(member_lease_name(self.group, holder))
        return None if seen is None else seen.at

    def next_suspicion(self) -> float | None:
        """When (monotonic, from now on) the next live replica becomes overdue (one
        renewal missed), unless its member Lease moves: known from the Lease watch, so
        checked without a request (:meth:`_suspect`)."""
        if self.suspect_after >= self.expiry:
            return None
        now = self.monotonic()
        return min((t for h in self.members if h != self.identity
                    and (at := self._last_seen(h)) is not None
                    and (t := at + self.suspect_after) > now), default=None)

    async def _on_lease(self, event: WatchEvent) -> None:
        """A Lease of the group changed (the watch): a member Lease's renewal is seen now
        (sooner than the next look would); a claim given back, a member come or gone
        wakes the rebalancing at once."""
        obj = event.object
        meta = obj.get("metadata") or {}
        role = (meta.get("labels") or {}).get(ROLE_LABEL)
        if role == REPLICA and event.type != "DELETED":
            spec = obj.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            self._observe(meta.get("name", ""), (holder, spec.get("renewTime"),
                                                 meta.get("resourceVersion")),
                          self.monotonic())
            if (not holder or holder in self.members) and not self.readying:
                return  # a renewal: nothing to rebalance (readying: perhaps no longer)
        if self._wake is not None:
            self._wake.set()
