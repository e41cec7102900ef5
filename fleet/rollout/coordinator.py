"""The rollout gate's I/O: the rollout ConfigMap (switches + durable record) and Events.

One call per planning pass: ``decision = await coordinator.decide(clusters)``. It reads
the ConfigMap (creating it when missing; from a watch while :meth:`RolloutCoordinator.watch`
runs, else with a GET), evaluates the pure gate, writes the record
back *before* the decision is used when it changed (new admissions become durable
first; if the write fails they are withdrawn), and reports transitions as Events:

* on the rollout ConfigMap: RolloutPaused / RolloutResumed, RolloutHalted /
  RolloutHaltCleared, EmergencyStop / EmergencyStopCleared, WaveStarted, WaveCompleted;
* on the CAPI Cluster: UpgradeAdmitted, UpgradeCompleted, ClusterPaused / ClusterResumed;
* on a MachineDeployment / K0sControlPlane: ObjectPaused / ObjectResumed.

Fleet-level transitions are derived from the durable record (exactly once, restart
safe); cluster and object pauses from the previous decision of this process (an Event
re-sent after a restart is deduplicated by its deterministic name).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from fleet.config.models import FleetConfig
from fleet.events import NORMAL, WARNING, EventRecorder, Regarding
from fleet.kube import AlreadyExistsError, KubeClient, KubeError, NotFoundError, patch_with_retry
from fleet.kube.cache import newer_or_same
from fleet.kube.resources import CONFIGMAPS
from fleet.kube.watch import Reflector, WatchEvent
from fleet.rollout.annotations import ROLLOUT_CONFIGMAP, STATE_KEY
from fleet.rollout.gate import (
    ClusterGate,
    ClusterPhase,
    FleetControls,
    FleetView,
    GateDecision,
    RolloutGate,
)
from fleet.rollout.progress import ClusterProgress
from fleet.rollout.state import RolloutState, Transition
from fleet.world.delta import generation, moved_since
from fleet.world.model import ClusterKey, format_time

log = logging.getLogger(__name__)

ACTION = "Rollout"


def _log_admissions(d: GateDecision) -> None:
    """One line per admission and per admission dropped, with what it was decided from
    (the record's admissions before, the cluster's wave and verdict, the targets'
    fingerprint), so that a count of clusters upgrading at once can be explained."""
    prev, cur = d.previous.admitted, d.state.admitted
    if not d.admitted_now and prev.keys() <= cur.keys():
        return
    before = ", ".join(sorted(prev)) or "none"
    for key in sorted(d.admitted_now):
        g = d.clusters[key]
        cid = f"{key[0]}/{key[1]}"
        log.info("admitted %s in wave %s (targets %s); admitted before: %s", cid, g.wave,
                 cur.get(cid, "?"), before)
    for cid in sorted(prev.keys() - cur.keys()):
        ns, _, name = cid.partition("/")
        gone = d.clusters.get((ns, name))
        log.info("admission of %s dropped (%s)", cid,
                 "no longer a member" if gone is None else f"{gone.phase.value}"
                 + (f": {gone.reason}" if gone.reason else ""))


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _rv(obj: dict[str, Any] | None) -> str | None:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "") or None \
        if obj is not None else None


class RolloutCoordinator:
    def __init__(self, client: KubeClient, config: FleetConfig, *,
                 recorder: EventRecorder | None = None,
                 clock: Callable[[], datetime] = _utcnow) -> None:
        self.client = client
        self.config = config
        self.gate = RolloutGate(config)
        self.recorder = recorder
        self.clock = clock
        self.namespace = config.management.namespace
        self.last: GateDecision | None = None
        self._configmap: dict[str, Any] | None = None
        self._record: Reflector | None = None  # the ConfigMap's watch, while it runs
        self.gets = 0  # reads that had to ask the API server (no healthy watch)
        self.raced = False  # the last write lost the race for the record (another replica)

    async def watch(self, on_change: Callable[[], None] | None = None, *,
                    watch_timeout: int = 120) -> None:
        """Keep the rollout ConfigMap from a watch, until cancelled. While it is synced and
        healthy, :meth:`read` serves the ConfigMap from it (or from this process's own last
        write, whichever is newer) instead of a GET per pass. That copy may trail the API
        server by an event in transit, as a GET trails it by the time the pass takes: what
        makes admissions safe is :meth:`write`'s resourceVersion precondition, which a
        trailing copy fails (409, re-read, withdrawn). ``on_change`` is told when someone
        else changed it (a pause annotation, another replica's record)."""
        async def changed(ev: WatchEvent) -> None:
            if on_change is not None and _rv(ev.object) != _rv(self._configmap):
                on_change()

        reflector = Reflector(self.client, CONFIGMAPS, namespace=self.namespace,
                              field_selector=f"metadata.name={ROLLOUT_CONFIGMAP}",
                              listener=changed, watch_timeout=watch_timeout)
        self._record = reflector
        try:
            await reflector.run()
        finally:
            self._record = None

    def _watched(self) -> dict[str, Any] | None:
        """The ConfigMap as the healthy watch (or our own newer write) has it; None when
        there is no such copy (no watch, not synced, failing, or no ConfigMap yet)."""
        r = self._record
        if r is None or not r.synced.is_set() or r.failing_since is not None:
            return None
        cm = r.get(ROLLOUT_CONFIGMAP, self.namespace)
        if cm is None:
            return None
        own = self._configmap
        if own is not None and _rv(own) is not None and newer_or_same(own, cm):
            return own
        return cm

    @property
    def configmap_ref(self) -> Regarding:
        uid = str(((self._configmap or {}).get("metadata") or {}).get("uid") or "")
        return Regarding("ConfigMap", ROLLOUT_CONFIGMAP, self.namespace, uid, "v1")

    async def read(self) -> tuple[FleetControls, RolloutState]:
        cm = self._watched()
        if cm is None:
            self.gets += 1
            cm = await self.client.get_or_none(CONFIGMAPS, ROLLOUT_CONFIGMAP, self.namespace)
        if cm is None:
            try:
                cm = await self.client.create(CONFIGMAPS, {
                    "metadata": {"name": ROLLOUT_CONFIGMAP, "namespace": self.namespace,
                                 "labels": {"app.kubernetes.io/managed-by": "k0s-fleet"}},
                    "data": {STATE_KEY: RolloutState().to_json()}}, self.namespace)
            except AlreadyExistsError:
                cm = await self.client.get(CONFIGMAPS, ROLLOUT_CONFIGMAP, self.namespace)
        self._configmap = cm
        annotations = (cm.get("metadata") or {}).get("annotations") or {}
        state = RolloutState.from_json((cm.get("data") or {}).get(STATE_KEY))
        return FleetControls.from_annotations(annotations), state

    async def write(self, decision: GateDecision) -> bool:
        """Record ``decision.state`` only if the record is still the one it was decided
        from (resourceVersion precondition; a conflict re-reads and gives up when the
        record moved). False when not written."""
        text = decision.state.to_json()
        expected = decision.previous.to_json()

        def mutate(cm: dict[str, Any]) -> dict[str, Any] | None:
            current = (cm.get("data") or {}).get(STATE_KEY)
            # Someone else (another replica) moved the record meanwhile: do not clobber it;
            # the next pass re-evaluates from theirs.
            if RolloutState.from_json(current).to_json() != expected:
                return None
            return {"data": {STATE_KEY: text}}

        self.raced = False
        try:
            result = await patch_with_retry(self.client, CONFIGMAPS, ROLLOUT_CONFIGMAP, mutate,
                                            self.namespace, current=self._configmap,
                                            attempts=5)
        except (KubeError, NotFoundError) as e:
            log.warning("could not record the rollout state: %s", e)
            return False
        if result is None:
            self.raced = True  # another replica moved the record first
            return False
        self._configmap = result
        return True

    async def decide(self, clusters: Sequence[ClusterProgress],
                     now: datetime | None = None, *, fleet_writer: bool = True) -> GateDecision:
        """Evaluate the gate for this pass and make its record durable.

        With several replicas (sharding) each admits only its own clusters, by a
        compare-and-swap of the whole record (:meth:`write`): two replicas that decided from
        the same record cannot both add to it, the second one re-evaluates. Only the
        ``fleet_writer`` moves wave times and fleet-wide transitions."""
        now = now or self.clock()
        try:
            controls, state = await self.read()
        except KubeError as e:
            # Without the switches and the record nothing new may start: fail closed.
            log.warning("cannot read the rollout ConfigMap: %s", e)
            decision = self.gate.evaluate(
                FleetView(clusters, FleetControls(emergency_stop="rollout state unreadable")),
                now)
            return decision.without_new_admissions()
        decision = self.gate.evaluate(
            FleetView(clusters, controls, state, fleet_writer=fleet_writer), now)
        if state.problem is not None:
            # Fail closed: the admissions it held are unknown, so nothing new is admitted
            # and the record is not written over; upkeep and admitted work go on.
            why = (f"no new cluster is admitted: {state.problem}; fix or delete the "
                   f"{STATE_KEY} key of ConfigMap {self.namespace}/{ROLLOUT_CONFIGMAP}")
            log.error("%s", why)
            decision = decision.without_new_admissions(why=why)
            await self._emit(self.configmap_ref, "RolloutRecordUnreadable", why, type=WARNING)
            self.last = decision
            return decision
        if decision.state_changed and not await self.write(decision):
            # A lost race keeps the held clusters' last reasons (see without_new_admissions)
            if decision.admitted_now:
                log.info("admission(s) of %s withdrawn: the record was %s",
                         ", ".join(f"{k[0]}/{k[1]}" for k in sorted(decision.admitted_now)),
                         "moved by another replica first" if self.raced else "not written")
            decision = decision.without_new_admissions(
                kept=self.last if self.raced else None)
        else:
            _log_admissions(decision)
        await self._report(decision)
        self.last = decision
        return decision

    # -- events ----------------------------------------------------------------------------
    async def _emit(self, regarding: Any, reason: str, note: str, *, type: str = NORMAL,
                    key: str = "") -> None:
        if self.recorder is not None:
            await self.recorder.emit(regarding, reason=reason, action=ACTION, note=note,
                                     type=type, key=key)

    async def _fleet_transition(self, old: Transition | None, new: Transition | None,
                                on: tuple[str, str], off: tuple[str, str]) -> None:
        if new is not None and (old is None or old.since != new.since):
            await self._emit(self.configmap_ref, on[0], new.reason or on[1],
                             type=WARNING if on[0] != "RolloutPaused" else NORMAL,
                             key=format_time(new.since))
        elif new is None and old is not None:
            await self._emit(self.configmap_ref, off[0], f"{off[1]} (since "
                             f"{format_time(old.since)}: {old.reason})",
                             key=format_time(old.since))

    async def _report(self, d: GateDecision) -> None:
        if self.recorder is None:
            return
        prev, cur = d.previous, d.state
        await self._fleet_transition(prev.paused, cur.paused, ("RolloutPaused", "paused"),
                                     ("RolloutResumed", "rollout resumed"))
        await self._fleet_transition(prev.halted, cur.halted, ("RolloutHalted", "halted"),
                                     ("RolloutHaltCleared", "failures cleared; rollout "
                                      "continues"))
        await self._fleet_transition(prev.stopped, cur.stopped, ("EmergencyStop", "stopped"),
                                     ("EmergencyStopCleared", "emergency stop lifted"))
        for w in d.waves:
            before, after = prev.waves.get(w.name), cur.waves.get(w.name)
            if after is None:
                continue
            same = before is not None and before.fingerprint == after.fingerprint
            if after.started_at is not None and not (same and before is not None
                                                     and before.started_at is not None):
                await self._emit(self.configmap_ref, "WaveStarted",
                                 f"wave {w.name} started ({len(w.clusters)} clusters, at most "
                                 f"{w.max_concurrent} at once)",
                                 key=f"{w.name}/{after.fingerprint}/started")
            if after.completed_at is not None and not (same and before is not None
                                                       and before.completed_at is not None):
                soak = f"; soaking until {format_time(w.soak_until)}" if w.soak_until and \
                    w.soak_until > d.now else ""
                await self._emit(self.configmap_ref, "WaveCompleted",
                                 f"wave {w.name}: every node of its {len(w.clusters)} clusters "
                                 f"runs its target version and is Ready{soak}",
                                 key=f"{w.name}/{after.fingerprint}/{after.completed_at}")
        for key in sorted(d.admitted_now):
            g = d.clusters[key]
            await self._emit(_cluster_ref(key), "UpgradeAdmitted",
                             f"admitted to upgrade in wave {g.wave}",
                             key=cur.admitted.get(f"{key[0]}/{key[1]}", ""))
        for cid, fp in prev.admitted.items():
            ns, _, name = cid.partition("/")
            done = d.clusters.get((ns, name))
            if cid not in cur.admitted and done is not None and not done.foreign \
                    and done.phase is ClusterPhase.COMPLETE:
                await self._emit(_cluster_ref((ns, name)), "UpgradeCompleted",
                                 f"every node runs its target version and is Ready "
                                 f"(wave {done.wave})", key=fp)
        last = self.last
        # A cluster whose verdict is the very object of the last decision (the gate keeps a
        # settled cluster's) has no pause news: only the others are looked at.
        told = None if last is None else moved_since(d.clusters, generation(last.clusters))
        moved: Iterable[tuple[ClusterKey, ClusterGate]] = d.clusters.items() if last is None \
            else [(k, d.clusters[k]) for k in told if k in d.clusters] if told is not None \
            else [(k, g) for k, g in d.clusters.items() if last.clusters.get(k) is not g]
        for key, g in sorted(moved):
            if g.foreign:
                continue  # its own replica reports it
            paused = g.paused
            was = last.clusters[key].paused if last and key in last.clusters else None
            if paused is not None and paused != was:
                await self._emit(_cluster_ref(key), "ClusterPaused", paused,
                                 key=format_time(d.now) if was is not None else "")
            elif paused is None and was is not None:
                await self._emit(_cluster_ref(key), "ClusterResumed",
                                 f"no longer paused ({was})", key=format_time(d.now))
        for ref, why in sorted(d.held_objects.items()):
            if last is None or last.held_objects.get(ref) != why:
                await self._emit(ref, "ObjectPaused", why)
        if last is not None:
            for ref, why in sorted(last.held_objects.items()):
                if ref not in d.held_objects:
                    await self._emit(ref, "ObjectResumed", f"no longer paused ({why})",
                                     key=format_time(d.now))


def _cluster_ref(key: ClusterKey) -> Regarding:
    return Regarding("Cluster", key[1], key[0])


