"""FleetUpgrade status from the rollout gate's decision (pure) and its writer (thin I/O).

Each pass of the controller evaluates the gate; where a FleetUpgrade's status would say
something new (per wave, per cluster, its conditions), it is written to the status
subresource. Conditions keep their lastTransitionTime while their status stays.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from fleet.events import NORMAL, WARNING, EventRecorder, Regarding
from fleet.kube import KubeClient, KubeError, KubeObject, NotFoundError, patch_with_retry
from fleet.kube.cache import newer_or_same
from fleet.kube.resources import FLEET_UPGRADES
from fleet.rollout.gate import ClusterGate, ClusterPhase, GateDecision
from fleet.rollout.progress import ClusterProgress
from fleet.world.intent import (
    COND_REFUSED,
    PHASE_FAILED,
    REASON_REFUSED,
    ClusterStanding,
    WaveStanding,
    status_changed,
    upgrade_status,
    withdrawing_status,
)
from fleet.world.model import (
    FLEET_UPGRADE_FINALIZER,
    ClusterKey,
    FleetUpgradeInfo,
    IntentTarget,
    format_time,
)

log = logging.getLogger(__name__)


def standing(c: ClusterProgress, gate: ClusterGate) -> ClusterStanding:
    """Where one cluster stands, as a FleetUpgrade's status shows it."""
    complete = gate.phase is ClusterPhase.COMPLETE
    message = "up to date" if complete else (gate.reason or "upgrading")
    return ClusterStanding(
        key=c.key, wave=gate.wave, phase=gate.phase.value, nodes_done=c.nodes_done,
        nodes_total=c.nodes_total, message=message, complete=complete,
        failed=gate.phase is ClusterPhase.FAILED)


def fleet_hold(decision: GateDecision) -> str | None:
    if decision.emergency_stop is not None:
        return f"emergency stop ({decision.emergency_stop})"
    if decision.halted is not None:
        return f"rollout halted: {decision.halted}"
    if decision.paused is not None:
        return f"rollout paused ({decision.paused})"
    return None


def _with_times(new: Mapping[str, Any], old: Mapping[str, Any], now: datetime
                ) -> dict[str, Any]:
    before = {c.get("type"): c for c in old.get("conditions") or [] if isinstance(c, dict)}
    conds = []
    for c in new.get("conditions") or []:
        prev = before.get(c["type"])
        ltt = prev.get("lastTransitionTime") if prev and prev.get("status") == c["status"] \
            else None
        conds.append({**c, "lastTransitionTime": ltt or format_time(now)})
    return {**new, "conditions": conds}


def _gist(u: FleetUpgradeInfo, intents: Mapping[ClusterKey, IntentTarget],
          stand: Sequence[ClusterStanding], waves: Sequence[WaveStanding],
          hold: str | None) -> dict[str, Any]:
    """The status without its node counts: what changes when a cluster's phase, a wave, a
    condition or a hold changes, and not when one more node is done."""
    blind = [dataclasses.replace(s, nodes_done=0) for s in stand]
    return upgrade_status(u, intents, blind, waves, fleet_hold=hold)


def _base(u: FleetUpgradeInfo) -> KubeObject:
    """The FleetUpgrade as the cache last saw it: enough for a patch's precondition."""
    return {"metadata": {"namespace": u.ref.namespace, "name": u.ref.name,
                         "resourceVersion": u.resource_version},
            "status": dict(u.status)}


class UpgradeStatusWriter:
    """Writes every FleetUpgrade's status that says something new, from the cached object
    (no GET before a patch: its resourceVersion is the precondition, a real 409 re-reads).

    * What this writer last wrote is remembered until the watch delivers it (or something
      newer), so a pass in between neither writes it again nor patches from a stale base.
    * A change of node counts alone (one more node done, nothing else) is written at most
      once per ``settle``: a later pass or :attr:`due` (a wake-up the policy schedules)
      writes the latest counts. A change of anything else (a cluster's or a wave's phase,
      a condition, a hold) is written at once, with the counts of that moment.
    """

    def __init__(self, client: KubeClient, *, clock: Callable[[], datetime],
                 settle: timedelta = timedelta(seconds=5),
                 recorder: EventRecorder | None = None) -> None:
        self.client = client
        self.recorder = recorder
        self.clock = clock
        self.settle = settle
        self._written: dict[tuple[str, str], KubeObject] = {}
        # per FleetUpgrade: the gist last written and when (count-only changes wait).
        self._last: dict[tuple[str, str], tuple[dict[str, Any], datetime]] = {}
        self._due: dict[tuple[str, str], datetime] = {}
        # per cluster a FleetUpgrade decides: its standing, and the progress and gate
        # verdict it was made from (made again only when either is a new object)
        self._standings: dict[ClusterKey, tuple[ClusterProgress, ClusterGate,
                                                ClusterStanding]] = {}
        # per FleetUpgrade: its status as last computed, and from what
        self._computed: dict[tuple[str, str], tuple[tuple[object, ...], dict[str, Any]]] = {}
        self.writes = 0
        self.deferred = 0

    def forget(self) -> None:
        """Drop what is remembered (another replica writes the status now)."""
        self._written.clear()
        self._last.clear()
        self._due.clear()
        self._standings.clear()
        self._computed.clear()

    @property
    def due(self) -> datetime | None:
        """When a deferred count-only change is to be written (None: nothing waits)."""
        return min(self._due.values(), default=None)

    def _current(self, u: FleetUpgradeInfo) -> KubeObject:
        key = (u.ref.namespace, u.ref.name)
        base = _base(u)
        mine = self._written.get(key)
        if mine is not None and (mine.get("metadata") or {}).get("uid") in (None, u.ref.uid) \
                and newer_or_same(mine, base) and _rv_of(mine) != u.resource_version:
            return mine  # the watch has not delivered our last write yet
        self._written.pop(key, None)
        return base

    def standings(self, decision: GateDecision, clusters: Sequence[ClusterProgress],
                  intents: Mapping[ClusterKey, IntentTarget]) -> list[ClusterStanding]:
        """The standings of the clusters some FleetUpgrade decides (those of the others are
        in no status), in the order of ``clusters``; a cluster's is made again only when
        its progress or its verdict is a new object (the rollout keeps both while the
        cluster does not move)."""
        memo = self._standings
        out: list[ClusterStanding] = []
        for c in _decided(clusters, intents):
            if c.key not in intents or (gate := decision.clusters.get(c.key)) is None:
                continue
            hit = memo.get(c.key)
            if hit is None or hit[0] is not c or hit[1] is not gate:
                hit = memo[c.key] = (c, gate, standing(c, gate))
            out.append(hit[2])
        if len(memo) > 2 * len(out) + 64:
            self._standings = {s.key: memo[s.key] for s in out}
        return out

    def status(self, u: FleetUpgradeInfo, intents: Mapping[ClusterKey, IntentTarget],
               stand: Sequence[ClusterStanding], waves: Sequence[WaveStanding],
               hold: str | None) -> dict[str, Any]:
        """``upgrade_status``, computed again only when something it reads moved."""
        key = (u.ref.namespace, u.ref.name)
        inputs = (u, hold, tuple(waves), tuple(stand), tuple(intents[s.key] for s in stand))
        hit = self._computed.get(key)
        if hit is None or hit[0] != inputs:
            hit = self._computed[key] = (inputs, upgrade_status(u, intents, stand, waves,
                                                                fleet_hold=hold))
        return hit[1]

    async def write(self, upgrades: Mapping[Any, FleetUpgradeInfo],
                    intents: Mapping[ClusterKey, IntentTarget], decision: GateDecision,
                    clusters: Sequence[ClusterProgress], *, defer: bool = True) -> int:
        """Write every FleetUpgrade's status that changed; returns how many were written.
        ``defer=False``: count-only changes too are written at once (nobody would come
        back for them: the caller schedules no wake-up at :attr:`due`)."""
        if not upgrades:
            self.forget()
            return 0
        stand = self.standings(decision, clusters, intents)
        waves = [WaveStanding(w.name, w.phase.value, w.message) for w in decision.waves]
        hold = fleet_hold(decision)
        now = self.clock()
        live = {(u.ref.namespace, u.ref.name) for u in upgrades.values()}
        for gone in [k for k in self._last.keys() | self._computed.keys() if k not in live]:
            self._computed.pop(gone, None)
            self._last.pop(gone, None)
            self._due.pop(gone, None)
            self._written.pop(gone, None)
        written = 0
        for u in sorted(upgrades.values(), key=lambda u: u.ref):
            key = (u.ref.namespace, u.ref.name)
            if u.deleting:
                self._due.pop(key, None)
                if FLEET_UPGRADE_FINALIZER in u.finalizers:
                    written += await self._withdraw(u, stand, intents)
                continue
            if FLEET_UPGRADE_FINALIZER not in u.finalizers and u.problem is None:
                await self._finalizer(u, add=True)
            current = self._current(u)
            old = current.get("status") or {}
            new = self.status(u, intents, stand, waves, hold)
            if not status_changed(old, new):
                self._due.pop(key, None)
                continue
            gist = _gist(u, intents, stand, waves, hold)
            last = self._last.get(key)
            if defer and last is not None and last[0] == gist and now < last[1] + self.settle:
                self._due[key] = last[1] + self.settle  # counts only: wait, then write
                self.deferred += 1
                continue
            if await self._patch(u, current, new):
                written += 1
                self._last[key] = (gist, now)
            self._due.pop(key, None)
        self.writes += written
        return written

    async def _withdraw(self, u: FleetUpgradeInfo, stand: Sequence[ClusterStanding],
                        intents: Mapping[ClusterKey, IntentTarget]) -> int:
        """A deleted FleetUpgrade: its status says Withdrawing with the clusters still
        finishing the version k0s-fleet had written into them (fleet.world.intent.apply_intents
        keeps those, and only those, on it); once none is left, the finalizer goes (and
        the object with it). Returns the status writes made."""
        finishing = [s for s in stand if not s.complete and (
            t := intents.get(s.key)) is not None and t.intent.namespace == u.ref.namespace
            and t.intent.name == u.ref.name]
        new = withdrawing_status(u, finishing)
        current = self._current(u)
        wrote = 0
        if status_changed(current.get("status") or {}, new) and await self._patch(
                u, current, new):
            wrote = 1
        if not finishing:
            log.info("FleetUpgrade %s/%s withdrawn; no cluster left finishing it: releasing",
                     u.ref.namespace, u.ref.name)
            await self._finalizer(u, add=False)
        return wrote

    async def _finalizer(self, u: FleetUpgradeInfo, *, add: bool) -> None:
        """Add k0s-fleet's finalizer to a FleetUpgrade, or release it."""
        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            meta = obj.get("metadata") or {}
            have = list(meta.get("finalizers") or [])
            if (FLEET_UPGRADE_FINALIZER in have) == add:
                return None
            if add and meta.get("deletionTimestamp"):
                return None  # being deleted already: too late to hold it
            want = [*have, FLEET_UPGRADE_FINALIZER] if add else [
                f for f in have if f != FLEET_UPGRADE_FINALIZER]
            return {"metadata": {"finalizers": want}}

        # the cached object is the base (no GET first: a real 409 re-reads)
        base: KubeObject = {"metadata": {
            "namespace": u.ref.namespace, "name": u.ref.name,
            "resourceVersion": u.resource_version, "finalizers": list(u.finalizers),
            **({"deletionTimestamp": "set"} if u.deleting else {})}}
        try:
            obj = await patch_with_retry(self.client, FLEET_UPGRADES, u.ref.name, mutate,
                                         u.ref.namespace,
                                         current=base if u.resource_version else None)
            if obj is not None:  # the status patch that follows starts from it
                self._written[(u.ref.namespace, u.ref.name)] = obj
        except NotFoundError:
            pass
        except KubeError as e:
            log.warning("could not %s the finalizer of FleetUpgrade %s/%s: %s",
                        "add" if add else "release", u.ref.namespace, u.ref.name, e)

    async def _patch(self, u: FleetUpgradeInfo, current: KubeObject,
                     new: Mapping[str, Any]) -> bool:
        key = (u.ref.namespace, u.ref.name)

        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            status = obj.get("status") or {}
            if not status_changed(status, new):
                return None
            return {"status": _with_times(new, status, self.clock())}

        try:
            obj = await patch_with_retry(
                self.client, FLEET_UPGRADES, u.ref.name, mutate, u.ref.namespace,
                subresource="status",
                current=current if _rv_of(current) else None)
        except NotFoundError:
            self._written.pop(key, None)
            return False
        except KubeError as e:
            log.warning("could not write the status of FleetUpgrade %s/%s: %s",
                        u.ref.namespace, u.ref.name, e)
            return False
        if obj is None:
            return False
        self._written[key] = obj
        await self._announce_refusal(u, current.get("status") or {}, new)
        await self._announce_phase(u, current.get("status") or {}, new)
        return True

    async def _announce_phase(self, u: FleetUpgradeInfo, old: Mapping[str, Any],
                              new: Mapping[str, Any]) -> None:
        """An Event on the FleetUpgrade when its phase changes (Progressing, Complete,
        Failed, Withdrawing...), with the status message: `kubectl describe` tells its
        story. Failed is a Warning. Only a write that changed the phase announces it, so
        a restarted controller that finds the phase written says nothing again."""
        if self.recorder is None:
            return
        phase = str(new.get("phase") or "")
        if not phase or phase == str(old.get("phase") or ""):
            return
        await self.recorder.emit(
            Regarding(kind=FLEET_UPGRADES.kind, name=u.ref.name, namespace=u.ref.namespace,
                      uid=u.ref.uid, api_version=FLEET_UPGRADES.api_version),
            reason=phase, action="Rollout",
            note=str(new.get("message") or f"{u.ref.name}: {phase}"),
            type=WARNING if phase == PHASE_FAILED else NORMAL)

    async def _announce_refusal(self, u: FleetUpgradeInfo, old: Mapping[str, Any],
                                new: Mapping[str, Any]) -> None:
        """A Warning Event on the FleetUpgrade when k0s's version skew policy starts refusing
        some of its clusters (the condition ``Refused`` turns True), naming rule and versions."""
        if self.recorder is None:
            return
        refused = _condition(new, COND_REFUSED)
        if refused is None or refused.get("status") != "True":
            return
        before = _condition(old, COND_REFUSED)
        if before is not None and before.get("status") == "True" \
                and before.get("message") == refused.get("message"):
            return
        await self.recorder.emit(
            Regarding(kind=FLEET_UPGRADES.kind, name=u.ref.name, namespace=u.ref.namespace,
                      uid=u.ref.uid, api_version=FLEET_UPGRADES.api_version),
            reason=str(refused.get("reason") or REASON_REFUSED), action="Refuse",
            note=str(refused.get("message") or ""), type=WARNING)


def _condition(status: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    return next((c for c in status.get("conditions") or []
                 if isinstance(c, Mapping) and c.get("type") == ctype), None)


def _rv_of(obj: KubeObject) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _decided(clusters: Sequence[ClusterProgress], intents: Mapping[ClusterKey, IntentTarget]
             ) -> Sequence[ClusterProgress]:
    """The progress of the clusters some FleetUpgrade decides, in the order of
    ``clusters`` (by key): looked up by their keys when they are a few of many and
    ``clusters`` can say (the rollout's list, :class:`~fleet.world.delta.DeltaList`),
    rather than walking every cluster of the fleet on every pass."""
    lookup = getattr(clusters, "lookup", None)
    if lookup is None or 4 * len(intents) >= len(clusters):
        return clusters
    found: list[ClusterProgress] = []
    for key in sorted(intents):
        items = lookup(key)
        if items is None:  # not the producer's latest list: walk it
            return clusters
        found.extend(items)
    return found
