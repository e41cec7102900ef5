"""A sharded replica's shard claims: one look at the members and the claims (give back
what is no longer this replica's once nothing is in flight there, take what is and whose
holder is gone), the shards readying for a take that may come (read ahead), the warm-up
of shards taken, and giving everything back at the end. The protocol and why it is safe:
fleet.controllers.shard."""

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
    SHARD,
    assignment,
    lease_now,
    member_lease_name,
    shard_lease_name,
    shard_of,
)
from fleet.controllers.members import Members
from fleet.kube import AlreadyExistsError, ConflictError, KubeError, NotFoundError
from fleet.kube.resources import LEASES

log = logging.getLogger(__name__)


class ShardClaims(Members):
    """This replica's shard claims (see the module docstring)."""

    def _note_kept(self) -> None:
        """Count each shard that began to be kept in full since the last call (called
        after every change of ``held`` or ``readying``, with no await in between)."""
        kept = self.held | self.readying
        for shard in kept - self._kept:
            self._kept_epoch[shard] = self._kept_epoch.get(shard, 0) + 1
        self._kept = kept

    # -- claims --------------------------------------------------------------------------
    def _claim_body(self, shard: int, lease: dict[str, Any] | None, holder: str | None
                    ) -> dict[str, Any]:
        spec = dict((lease or {}).get("spec") or {})
        now = lease_now()
        if holder is not None:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if lease is not None else 0)
        spec.update(holderIdentity=holder, leaseDurationSeconds=self.lease_seconds,
                    renewTime=now)
        meta: dict[str, Any] = {"name": shard_lease_name(self.group, shard),
                                "namespace": self.namespace, "labels": self._labels(SHARD)}
        if lease is not None:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return {"apiVersion": LEASES.api_version, "kind": LEASES.kind, "metadata": meta,
                "spec": spec}

    async def _take(self, shard: int, lease: dict[str, Any] | None) -> bool:
        try:
            if lease is None:
                await self.client.create(LEASES, self._claim_body(shard, None, self.identity),
                                         self.namespace)
            else:
                await self.client.replace(LEASES, self._claim_body(shard, lease, self.identity))
        except (AlreadyExistsError, ConflictError, NotFoundError):
            return False  # another replica moved first: its claim stands
        return True

    async def _take_all(self, claims: Sequence[tuple[int, dict[str, Any] | None]]
                        ) -> tuple[list[bool], KubeError | None]:
        """:meth:`_take` each of ``claims`` at the same time: whether each was taken, and
        the first KubeError among them (None when none failed)."""
        took = [False] * len(claims)
        failed: list[KubeError] = []

        slots = anyio.CapacityLimiter(16)  # a first replica takes every shard at once

        async def take(i: int, shard: int, lease: dict[str, Any] | None) -> None:
            async with slots:
                try:
                    took[i] = await self._take(shard, lease)
                except KubeError as e:
                    failed.append(e)

        async with anyio.create_task_group() as tg:
            for i, (shard, lease) in enumerate(claims):
                tg.start_soon(take, i, shard, lease)
        return took, (failed[0] if failed else None)

    async def _give_back(self, shard: int, lease: dict[str, Any] | None) -> bool:
        if lease is None:
            return True
        if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return True
        try:
            await self.client.replace(LEASES, self._claim_body(shard, lease, None))
        except (ConflictError, NotFoundError):
            return False
        return True

    def _busy_shards(self) -> set[int]:
        return {shard_of(c, self.shards) for c in self.busy()}

    async def _rebalance(self) -> None:
        """One look at the members and the claims: give back, take over (warmed up by
        :meth:`_warm_up` after the look)."""
        now = self.monotonic()
        selector = f"{GROUP_LABEL}={self.group}"
        leases = (await self.client.list(LEASES, self.namespace,
                                         label_selector=selector)).items
        members = [x for x in leases if (x["metadata"].get("labels") or {}).get(ROLE_LABEL)
                   == REPLICA]
        claims = {x["metadata"]["name"]: x for x in leases
                  if (x["metadata"].get("labels") or {}).get(ROLE_LABEL) == SHARD}
        live, counts = self._live_members(members, now)
        disagree = sorted(h for h, n in counts.items() if n != self.shards)
        if tuple(live) != self.members:
            log.info("%s: live replicas %s", self.identity, ", ".join(live))
            self.members = tuple(live)
        owners = assignment(self.shards, live)
        busy = self._busy_shards()
        changed = False
        to_take: list[tuple[int, dict[str, Any] | None, str, float]] = []
        for shard in range(self.shards):
            lease = claims.get(shard_lease_name(self.group, shard))
            holder = ((lease or {}).get("spec") or {}).get("holderIdentity") or ""
            if holder == self.identity and shard not in self.held:
                # A claim this identity took before a restart of this process: the old
                # process is gone (same identity = same pod), adopt it after warming.
                self.held.add(shard)
                self.warming.add(shard)
                self._note_kept()
                changed = True
            if holder != self.identity and shard in self.held:
                log.warning("%s: claim on shard %d now held by %r; stopping there",
                            self.identity, shard, holder)
                self.held.discard(shard)
                self.releasing.discard(shard)
                self.warming.discard(shard)
                self._note_kept()
                changed = True
            mine = owners.get(shard) == self.identity
            if shard in self.held:
                if mine:
                    if shard in self.releasing:
                        self.releasing.discard(shard)
                        changed = True
                    continue
                if shard not in self.releasing:
                    self.releasing.add(shard)  # stop starting anything there
                    changed = True
                    continue
                if shard in busy:
                    continue  # actions in flight: give back once they are done
                if await self._give_back(shard, lease):
                    log.info("%s: gave shard %d back (owner now %s)", self.identity, shard,
                             owners.get(shard))
                    self.held.discard(shard)
                    self.releasing.discard(shard)
                    self.warming.discard(shard)
                    self._note_kept()
                    changed = True
                continue
            if not mine or disagree:
                continue
            if holder and self._holder_alive(holder, now):
                continue  # the holder gives it back once it sees the new owner
            # As the decision saw it: the holder's lease may be seen again during the take
            # (a restarted holder renewing), which must not make the logged age negative.
            age = now - self._seen[member_lease_name(self.group, holder)].at if holder \
                else 0.0
            to_take.append((shard, lease, holder, age))
        # All at once: each claim is a compare-and-swap of its own Lease. One after the
        # other, a taker of 4 shards wrote its last claim 1.2 s after its first on a
        # loaded API server, and its warm-up waited for them all (bench/README.md
        # "Claims taken at once").
        taken, failure = await self._take_all([(s, lease) for s, lease, _, _ in to_take])
        for (shard, _, holder, age), took in zip(to_take, taken, strict=True):
            if not took:
                continue
            if holder:
                self.handoffs += 1
                log.warning("%s: took shard %d from %s (its member lease stopped "
                            "moving: last seen %.2fs before this look began, expiry "
                            "%.2fs)", self.identity, shard, holder, age, self.expiry)
            else:
                log.info("%s: took shard %d", self.identity, shard)
            self.held.add(shard)
            self.warming.add(shard)
            self._taken_at[shard] = self.monotonic()
            self._note_kept()
            changed = True
        self._claims_seen, self._disagree = claims, bool(disagree)
        if self._set_readying(self._overdue_shards(claims, live, now)):
            changed = True
        if disagree:
            log.error("%s: replicas %s announce a different shard count than %d; taking no "
                      "new shards until every replica runs with the same --shards",
                      self.identity, ", ".join(disagree), self.shards)
        if changed:
            self.on_change()
        if failure is not None:
            raise failure  # the look failed (what the other claims took is recorded)

    def _overdue_shards(self, claims: dict[str, dict[str, Any]], live: Sequence[str],
                        now: float) -> set[int]:
        """The shards held by live replicas overdue at ``now`` (one renewal missed, as the
        Lease watch and the looks saw them) that would be this replica's if they were
        gone."""
        if self._disagree or self.suspect_after >= self.expiry:
            return set()
        overdue = [h for h in live if h != self.identity and (at := self._last_seen(h))
                   is not None and now - at >= self.suspect_after]
        if not overdue:
            return set()
        out: set[int] = set()
        for holder in overdue:
            without = assignment(self.shards, [m for m in live if m != holder])
            for shard in range(self.shards):
                lease = claims.get(shard_lease_name(self.group, shard))
                if ((lease or {}).get("spec") or {}).get("holderIdentity") == holder \
                        and without.get(shard) == self.identity:
                    out.add(shard)
        return out - self.held

    def _set_readying(self, readying: set[int]) -> bool:
        """Make ``readying`` this (logged); whether it changed."""
        if readying == self.readying:
            return False
        if readying - self.readying:
            log.info("%s: shards %s may be taken soon (their holder is overdue): read "
                     "ahead", self.identity, ",".join(map(str, sorted(readying -
                                                                        self.readying))))
        self.readying = readying
        self._note_kept()
        return True

    def _suspect(self, tg: anyio.abc.TaskGroup) -> None:
        """Between looks, at an instant a live replica may have become overdue: readying
        from what is known (the watch's renewals, the last look's claims), no request;
        the read-ahead started when there is something to read."""
        if self._set_readying(self._overdue_shards(self._claims_seen, self.members,
                                                   self.monotonic())):
            self.on_change()
        self._start_read_ahead(tg)

    def _start_read_ahead(self, tg: anyio.abc.TaskGroup) -> None:
        if self.readying and self.read_ahead is not None and not self._reading_ahead:
            self._reading_ahead = True  # beside the looks: a take waits for none
            tg.start_soon(self._read_ahead)

    async def _read_ahead(self) -> None:
        """``read_ahead()`` once, bounded by a lease; a failure is only logged (the take
        reads what is missing)."""
        assert self.read_ahead is not None
        try:
            with anyio.move_on_after(self.lease_seconds):
                await self.read_ahead()
        except KubeError as e:
            log.info("%s: reading ahead: %s", self.identity, e)
        finally:
            self._reading_ahead = False

    async def _warm_up(self) -> None:
        """The shards taken and not yet acted on: once ``warm()`` says the caches are
        fresh enough for them, acted on from now. Called after a look, with a bound of its
        own (the run loop's), not with what a look left of its bound."""
        if not self.warming or not (self.warm is None or await self.warm()):
            return
        now = self.monotonic()
        taken = [self._taken_at.pop(s, now) for s in self.warming]
        log.info("%s: shards %s warm, acted on from now (%.1fs after the first was "
                 "taken)", self.identity, ",".join(map(str, sorted(self.warming))),
                 now - min(taken))
        self.warming.clear()
        self.on_change()

    async def release_all(self) -> None:
        """Give back every claim and the member Lease (after the controller stopped)."""
        self.active = False
        for shard in sorted(self.held):
            try:
                lease = await self.client.get_or_none(LEASES, shard_lease_name(self.group,
                                                                               shard),
                                                      self.namespace)
                await self._give_back(shard, lease)
            except KubeError as e:
                log.info("could not give back shard %d: %s", shard, e)
        self.held.clear()
        self.readying.clear()
        self._note_kept()
        try:
            lease = await self.client.get_or_none(LEASES, self.member_name, self.namespace)
            if lease is not None and (lease.get("spec") or {}).get("holderIdentity") == \
                    self.identity:
                lease["spec"].update(holderIdentity=None, leaseDurationSeconds=1)
                await self.client.replace(LEASES, lease)
        except KubeError as e:
            log.info("could not release member lease: %s", e)
