"""The wave gate as it was before it became incremental (fleet/rollout/gate.py at 1fbf40a):
every evaluation walks every cluster. Kept as the reference the incremental gate is
held equal to (tests/unit/test_incremental_gate.py); not used by the controller."""

# ruff: noqa

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from fleet.config.models import ClusterSettings, FleetConfig, MaintenanceWindow
from fleet.world.model import ClusterKey, ObjectRef
from fleet.rollout.annotations import ANN_EMERGENCY_STOP, ANN_PAUSED, ROLLOUT_CONFIGMAP
from fleet.rollout.gate import (
    FOREIGN,
    ClusterGate,
    ClusterPhase,
    FleetView,
    GateDecision,
    WavePhase,
    WaveStatus,
    _cluster_id,
    _Facts,
    _transition,
    _when,
)
from fleet.rollout.progress import ClusterProgress, fingerprint
from fleet.rollout.state import RolloutState, WaveRecord
from fleet.config.schedule import next_window_start, window_open


class ReferenceGate:
    """The pure wave engine. One instance per fleet configuration.

    Evaluating it is linear in the fleet, but what it derives per cluster (fingerprint,
    completeness, settings, pause) is remembered per :class:`ClusterProgress` object, and
    a wave's fingerprint per list of its members' targets: a pass in which one cluster
    moved recomputes that cluster's facts only."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self._settings: dict[tuple[str, str, tuple[tuple[str, str], ...]], ClusterSettings] = {}
        self._windows: dict[tuple[object, ...], tuple[bool, datetime | None]] = {}
        self._windows_at: datetime | None = None
        self._entries = {(e.namespace, e.name): e for e in config.clusters.entries}
        self._facts: dict[ClusterKey, _Facts] = {}
        self._wave_fps: dict[str, tuple[tuple[object, ...], str]] = {}

    def facts(self, c: ClusterProgress) -> _Facts:
        found = self._facts.get(c.key)
        if found is None or found.progress is not c:
            found = self._facts[c.key] = _Facts(
                progress=c, fingerprint=fingerprint([c]),
                body=(c.namespace, c.name, tuple(c.targets())), complete=c.complete,
                failed=c.failed, started=c.started, needs_dispatch=c.needs_dispatch,
                settings=self.settings(c), pause=self.cluster_pause(c))
        return found

    def _wave_fingerprint(self, wave: str, cs: Sequence[ClusterProgress]) -> str:
        """``fingerprint(cs)``, remembered while the members and their targets stay."""
        body = tuple(self.facts(c).body for c in cs)
        found = self._wave_fps.get(wave)
        if found is None or found[0] != body:
            found = self._wave_fps[wave] = (body, fingerprint(cs))
        return found[1]

    def settings(self, c: ClusterProgress) -> ClusterSettings:
        """The cluster's effective settings (cached: the config never changes)."""
        key = (c.namespace, c.name, tuple(sorted(c.labels.items())))
        found = self._settings.get(key)
        if found is None:
            if len(self._settings) > 100_000:
                self._settings.clear()
            found = self._settings[key] = self.config.for_cluster(c.namespace, c.name,
                                                                  c.labels)
        return found

    def _window(self, windows: tuple[MaintenanceWindow, ...], now: datetime
                ) -> tuple[bool, datetime | None]:
        """(open now, next start) for a set of windows; computed once per instant."""
        if self._windows_at != now:
            self._windows, self._windows_at = {}, now
        found = self._windows.get(windows)
        if found is None:
            is_open = window_open(windows, now)
            found = self._windows[windows] = (
                is_open, None if is_open else next_window_start(windows, now))
        return found

    # -- cluster-level holds -------------------------------------------------------------
    def cluster_pause(self, c: ClusterProgress) -> str | None:
        """Why this one cluster is paused (by whom), or None."""
        entry = self._entries.get((c.namespace, c.name))
        if (reason := c.paused) is not None:
            return f"paused by annotation {ANN_PAUSED} on the Cluster" + (
                f": {reason}" if reason else "")
        if entry is not None and entry.paused:
            return "paused in the fleet config (clusters.entries[].paused)"
        # The controller's snapshot folds config pauses into ClusterInfo.paused; the
        # fleet-wide one is reported as such, not per cluster.
        if c.spec_paused and not self.config.rollout.paused:
            return "Cluster is paused (spec.paused)"
        return None

    def _cluster_hold(self, c: ClusterProgress, now: datetime,
                      wakeups: list[datetime]) -> str | None:
        if (paused := self.facts(c).pause) is not None:
            return paused
        if not c.observed:
            return c.not_observed_reason
        is_open, nxt = self._window(self.facts(c).settings.maintenance_windows, now)
        if not is_open:
            if nxt is not None:
                wakeups.append(nxt)
            return "outside its maintenance window" + (
                f"; next opens {_when(nxt)}" if nxt is not None else "; no window opens again")
        return None

    # -- the evaluation ------------------------------------------------------------------
    def evaluate(self, view: FleetView, now: datetime) -> GateDecision:
        rollout = self.config.rollout
        waves = rollout.effective_waves
        members: dict[str, list[ClusterProgress]] = {w.name: [] for w in waves}
        for c in view.clusters:
            wave = self.facts(c).settings.wave
            members[wave.name].append(c)
        if len(self._facts) > len(view.clusters):
            keys = {c.key for c in view.clusters}
            self._facts = {k: f for k, f in self._facts.items() if k in keys}
        for cs in members.values():
            cs.sort(key=lambda c: c.key)
        state = view.state
        known = {_cluster_id(c.key) for c in view.clusters}

        # Fleet-wide stops.
        stop = "emergencyStop in the fleet config" if rollout.emergency_stop else None
        if view.controls.emergency_stop is not None:
            stop = f"annotation {ANN_EMERGENCY_STOP} on ConfigMap {ROLLOUT_CONFIGMAP}" + (
                f": {view.controls.emergency_stop}" if view.controls.emergency_stop else "")
        pause = "rollout.paused in the fleet config" if rollout.paused else None
        if view.controls.paused is not None:
            pause = f"annotation {ANN_PAUSED} on ConfigMap {ROLLOUT_CONFIGMAP}" + (
                f": {view.controls.paused}" if view.controls.paused else "")
        over_budget: dict[str, str] = {}
        for w in waves:
            failed = [c for c in members[w.name] if self.facts(c).failed]
            tolerated = w.tolerated_failures(len(members[w.name]))
            if len(failed) > tolerated:
                names = ", ".join(_cluster_id(c.key) for c in failed[:5])
                more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
                over_budget[w.name] = (
                    f"wave {w.name}: {len(failed)} failed cluster(s) ({names}{more}) exceed "
                    f"its failure budget of {tolerated}"
                    + (" (canary: no failure tolerated)" if w.canary else ""))
        halted = "; ".join(over_budget.values()) or None
        fleet_hold = (f"emergency stop ({stop})" if stop is not None
                      else f"rollout halted: {halted}" if halted is not None
                      else f"rollout paused ({pause})" if pause is not None else None)

        allowed: set[ClusterKey] = set()
        reasons: dict[ClusterKey, str] = {}
        gates: dict[ClusterKey, ClusterGate] = {}
        held: dict[ObjectRef, str] = {}
        wakeups: list[datetime] = []
        admitted = {k: v for k, v in state.admitted.items() if k in known}
        records = dict(state.waves)
        statuses: list[WaveStatus] = []
        blocker: str | None = None  # why clusters of later waves may not be admitted
        open_before: str | None = None  # the wave before this one, when not complete

        for index, w in enumerate(waves):
            cs = members[w.name]
            wave_fp = self._wave_fingerprint(w.name, cs)
            record = records.get(w.name)
            if record is not None and record.fingerprint != wave_fp:
                record = None
            limit = rollout.concurrency(w)
            phases: dict[ClusterKey, ClusterPhase] = {}
            active: list[ClusterProgress] = []
            queued: list[ClusterProgress] = []
            for c in cs:
                f = self.facts(c)
                cid, cfp = _cluster_id(c.key), f.fingerprint
                if c.foreign and cid in admitted and admitted[cid] != cfp and not f.failed:
                    # admitted by its replica for targets this one does not see: its slot
                    phases[c.key] = ClusterPhase.UPGRADING
                    active.append(c)
                elif f.complete:
                    phases[c.key] = ClusterPhase.COMPLETE
                    if not c.foreign:  # another replica's: dropped by that replica
                        admitted.pop(cid, None)
                elif f.failed:
                    phases[c.key] = ClusterPhase.FAILED
                elif f.started or admitted.get(cid) == cfp:
                    phases[c.key] = ClusterPhase.UPGRADING
                    active.append(c)
                elif f.needs_dispatch and c.observed:
                    phases[c.key] = ClusterPhase.QUEUED
                    queued.append(c)
                else:
                    phases[c.key] = ClusterPhase.WAITING
                if cid in admitted and admitted[cid] != cfp and not c.foreign:
                    del admitted[cid]  # admitted for targets that are no longer wanted

            # The slots go to the clusters admitted in the record first; a cluster that is
            # only started (NodePlans for its targets, no admission: its admission ended
            # when it was complete and it has work again, or the record was lost) comes
            # after them, and goes through the record when it may dispatch again.
            active.sort(key=lambda c: (admitted.get(_cluster_id(c.key))
                                       != self.facts(c).fingerprint, c.key))
            newly: set[ClusterKey] = set()
            for i, c in enumerate(active):
                if c.foreign:
                    reasons[c.key] = FOREIGN  # counted against the limit, acted on elsewhere
                    continue
                hold = fleet_hold or self._cluster_hold(c, now, wakeups)
                if hold is None and i >= limit:
                    # A failed cluster retried, or a started one with work again, while
                    # others took the slots.
                    hold = (f"wave {w.name}: clusters upgrading exceed "
                            f"maxConcurrentClusters {limit}; waiting for one to finish")
                if hold is None:
                    allowed.add(c.key)
                    cid, cfp = _cluster_id(c.key), self.facts(c).fingerprint
                    if admitted.get(cid) != cfp and self.facts(c).needs_dispatch:
                        admitted[cid] = cfp
                        newly.add(c.key)
                else:
                    reasons[c.key] = hold
            # a failed cluster whose node still works on its request (its NodePlan failed
            # by a deadline) holds its slot until the node has finished
            failing = sum(1 for c in cs if phases[c.key] is ClusterPhase.FAILED
                          and c.in_flight > 0)
            slots = limit - len(active) - failing
            # a held cluster names the wave before its own while that one is not complete
            held_by_waves = blocker if blocker is None or open_before is None \
                else f"waiting for wave {open_before} to complete"
            for c in queued:
                if c.foreign:
                    reasons[c.key] = FOREIGN  # only the replica acting on it admits it
                elif fleet_hold is not None:
                    reasons[c.key] = fleet_hold
                elif held_by_waves is not None:
                    reasons[c.key] = held_by_waves
                elif slots <= 0:
                    reasons[c.key] = (f"wave {w.name}: maxConcurrentClusters {limit} "
                                      "clusters upgrading; waiting for one to finish")
                elif (hold := self._cluster_hold(c, now, wakeups)) is not None:
                    reasons[c.key] = hold
                else:
                    allowed.add(c.key)
                    newly.add(c.key)
                    admitted[_cluster_id(c.key)] = self.facts(c).fingerprint
                    phases[c.key] = ClusterPhase.UPGRADING
                    slots -= 1
            for c in cs:
                if c.key in reasons or c.key in allowed:
                    continue
                if phases[c.key] is ClusterPhase.COMPLETE:
                    reasons[c.key] = "up to date"
                elif phases[c.key] is ClusterPhase.FAILED:
                    reasons[c.key] = (f"{c.failed} failed node upgrade(s); retry (annotation "
                                      "fleet.k0s-fleet.io/retry) or clear them to continue")
                elif not c.observed:
                    reasons[c.key] = c.not_observed_reason
                else:
                    reasons[c.key] = "nothing to upgrade in place (left to Cluster API, or " \
                                     "nodes not Ready)"
            for c in cs:
                for o in c.objects:
                    if o.paused is not None and not c.foreign:
                        held[o.ref] = f"paused by annotation {ANN_PAUSED} on {o.ref.kind}" + (
                            f": {o.paused}" if o.paused else "")
                gates[c.key] = ClusterGate(c.key, w.name, phases[c.key], c.key in allowed,
                                           "" if c.key in allowed else reasons[c.key],
                                           admitted_now=c.key in newly,
                                           paused=self.facts(c).pause, foreign=c.foreign)

            # The wave's own record and phase.
            upgrading = sum(1 for p in phases.values() if p is ClusterPhase.UPGRADING)
            failed_n = sum(1 for p in phases.values() if p is ClusterPhase.FAILED)
            done_n = sum(1 for p in phases.values() if p is ClusterPhase.COMPLETE)
            complete = done_n == len(cs)
            open_before = w.name if cs and not complete else None
            if not cs:
                statuses.append(WaveStatus(
                    name=w.name, index=index, canary=w.canary, phase=WavePhase.COMPLETE,
                    clusters=(), complete=0, upgrading=0, failed=0, tolerated_failures=0,
                    max_concurrent=limit, soak=w.soak, message="no clusters"))
                continue
            if record is None and (upgrading or complete):
                record = WaveRecord(wave_fp, started_at=now if upgrading else None)
            elif record is not None and record.started_at is None and upgrading:
                record = replace(record, started_at=now)
            soak_until: datetime | None = None
            message = ""
            if complete and not view.fleet_writer and (
                    record is None or record.completed_at is None):
                # Complete as this replica sees it, but the soak counts from the recorded
                # completion, which only the fleet-wide writer records: wait for it.
                phase = WavePhase.PROGRESSING
                message = "complete; waiting for the completion to be recorded"
                if blocker is None:
                    # (the held clusters' reason as while the wave ran: the completion is
                    # the recorded one, and their status is not rewritten for the wait)
                    blocker = f"waiting for wave {w.name} to complete"
            elif complete:
                assert record is not None
                if record.completed_at is None:
                    record = replace(record, completed_at=now)
                assert record.completed_at is not None
                soak_until = record.completed_at + w.soak
                if now < soak_until:
                    phase = WavePhase.SOAKING
                    message = f"soaking until {_when(soak_until)}"
                    wakeups.append(soak_until)
                    if blocker is None:
                        blocker = f"wave {w.name} is soaking until {_when(soak_until)}"
                else:
                    phase = WavePhase.COMPLETE
            else:
                if record is not None and record.completed_at is not None:
                    record = replace(record, completed_at=None)  # a node regressed
                if w.name in over_budget:
                    phase, message = WavePhase.HALTED, over_budget[w.name]
                elif blocker is not None and not upgrading:
                    phase, message = WavePhase.PENDING, blocker
                else:
                    phase = WavePhase.PROGRESSING
                    message = f"{done_n}/{len(cs)} clusters complete"
                if blocker is None:
                    blocker = f"waiting for wave {w.name} to complete"
            if record is not None:
                records[w.name] = record
            statuses.append(WaveStatus(
                name=w.name, index=index, canary=w.canary, phase=phase,
                clusters=tuple(c.key for c in cs), complete=done_n, upgrading=upgrading,
                failed=failed_n, tolerated_failures=w.tolerated_failures(len(cs)),
                max_concurrent=limit, soak=w.soak,
                started_at=record.started_at if record else None,
                completed_at=record.completed_at if record else None,
                soak_until=soak_until, message=message))

        new_state = RolloutState(
            waves={n: r for n, r in records.items() if n in members},
            paused=_transition(state.paused, pause, now),
            halted=_transition(state.halted, halted, now),
            stopped=_transition(state.stopped, stop, now),
            admitted=admitted,
        ) if view.fleet_writer else replace(state, admitted=admitted)
        future = [t for t in wakeups if t > now]
        return GateDecision(
            now=now, allowed_clusters=frozenset(allowed), reasons=reasons, held_objects=held,
            next_wakeup=min(future, default=None), waves=tuple(statuses), clusters=gates,
            state=new_state, previous=state, halted=halted, paused=pause, emergency_stop=stop)


