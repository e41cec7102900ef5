"""The fleet rollout gate: which clusters may start new node upgrades right now.

Pure: ``RolloutGate(config).evaluate(view, now)`` reads nothing but its arguments. The
controller consults it on every planning pass and dispatches new nodes only in
``decision.allowed_clusters`` (and not on held objects); nodes already in flight always
finish. The rules (docs/rollout-policy.md has the long form):

* Clusters belong to the first wave whose selector matches their labels (the config's
  ``effective_waves``: a final ``default`` wave takes the rest).
* A cluster of wave N+1 is admitted only once every earlier wave is complete (every node
  observed on its target version, Ready and schedulable) and its soak time has passed
  since the completion recorded in the durable state.
* At most ``maxConcurrentClusters`` clusters of a wave upgrade at once. A cluster is
  *active* from its admission (recorded durably before the first dispatch) or its first
  NodePlan until it is complete; failed clusters do not hold a slot.
* Failed clusters (a failed node upgrade not yet retried or cleared) beyond a wave's
  failure budget (0 in a canary wave) halt the whole fleet: nothing new starts anywhere.
* Emergency stop, fleet pause (config or annotation on the rollout ConfigMap), cluster
  pause (config entry, annotation, ``spec.paused``) and closed maintenance windows stop
  new starts; object pause (annotation on the MD / KCP) holds that object only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum

from fleet.config.models import ClusterSettings, FleetConfig, MaintenanceWindow, Wave
from fleet.config.schedule import next_window_start, window_open
from fleet.rollout.annotations import ANN_EMERGENCY_STOP, ANN_PAUSED, ROLLOUT_CONFIGMAP, switch
from fleet.rollout.progress import ClusterProgress, fingerprint, fingerprint_of
from fleet.rollout.state import RolloutState, Transition, WaveRecord
from fleet.world.delta import Delta, DeltaDict, generation, moved_since
from fleet.world.model import ClusterKey, ObjectRef, format_time


class ClusterPhase(StrEnum):
    COMPLETE = "Complete"  # every node on target and Ready
    UPGRADING = "Upgrading"  # admitted or started, not complete (holds a slot)
    QUEUED = "Queued"  # has in-place work, not admitted yet
    FAILED = "Failed"  # a failed node upgrade not yet retried / cleared
    WAITING = "Waiting"  # not complete, nothing to start in place (CAPI, NotReady, unseen)


class WavePhase(StrEnum):
    PENDING = "Pending"  # an earlier wave is not complete and soaked yet
    PROGRESSING = "Progressing"
    SOAKING = "Soaking"
    COMPLETE = "Complete"
    HALTED = "Halted"  # its failure budget is exceeded


@dataclass(frozen=True, slots=True)
class FleetControls:
    """Fleet-level switches set by annotations on the rollout ConfigMap."""

    paused: str | None = None
    emergency_stop: str | None = None

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> FleetControls:
        return cls(paused=switch(annotations, ANN_PAUSED),
                   emergency_stop=switch(annotations, ANN_EMERGENCY_STOP))


@dataclass(frozen=True, slots=True)
class FleetView:
    """What one gate evaluation looks at: fresh cluster progress, the operator's fleet
    switches and the durable rollout record."""

    clusters: Sequence[ClusterProgress]
    controls: FleetControls = field(default_factory=FleetControls)
    state: RolloutState = field(default_factory=RolloutState)
    # Sharded replicas: only one (the fleet-wide writer) moves the record's wave times and
    # fleet transitions; the others read them (and still admit their own clusters).
    fleet_writer: bool = True


@dataclass(frozen=True, slots=True)
class ClusterGate:
    key: ClusterKey
    wave: str
    phase: ClusterPhase
    allowed: bool
    reason: str = ""  # why it may not start new node upgrades ("" when allowed)
    admitted_now: bool = False
    paused: str | None = None  # the cluster's own pause (config entry, annotation, spec)
    foreign: bool = False  # another replica acts on it (sharding)


@dataclass(frozen=True, slots=True)
class WaveStatus:
    name: str
    index: int
    canary: bool
    phase: WavePhase
    clusters: tuple[ClusterKey, ...]
    complete: int
    upgrading: int
    failed: int
    tolerated_failures: int
    max_concurrent: int
    soak: timedelta
    started_at: datetime | None = None
    completed_at: datetime | None = None
    soak_until: datetime | None = None
    message: str = ""


@dataclass(frozen=True, slots=True)
class GateDecision:
    now: datetime
    allowed_clusters: frozenset[ClusterKey]
    reasons: Mapping[ClusterKey, str]
    held_objects: Mapping[ObjectRef, str]
    next_wakeup: datetime | None
    waves: tuple[WaveStatus, ...]
    clusters: Mapping[ClusterKey, ClusterGate]
    state: RolloutState  # the durable record as it should be now (persist if changed)
    previous: RolloutState  # the record this decision was computed from
    halted: str | None = None
    paused: str | None = None
    emergency_stop: str | None = None

    @property
    def state_changed(self) -> bool:
        return self.state != self.previous

    @property
    def admitted_now(self) -> frozenset[ClusterKey]:
        return frozenset(k for k, g in self.clusters.items() if g.admitted_now)

    def hold(self, cluster: ClusterKey, owner: ObjectRef | None = None) -> str | None:
        """Why no new node upgrade may start in ``cluster`` (for ``owner``); None = go."""
        if cluster not in self.allowed_clusters:
            return self.reasons.get(cluster) or "not admitted by the fleet rollout"
        if owner is not None:
            return self.held_objects.get(ObjectRef(owner.kind, owner.namespace, owner.name))
        return None

    def without_new_admissions(self, kept: GateDecision | None = None, *,
                               why: str = "admission not yet recorded in the rollout state; "
                                          "retrying") -> GateDecision:
        """This decision if its state could not be recorded: admissions not yet durable are
        withdrawn (they would not be counted after a restart).

        ``kept``: the last decision, when the record was not written only because another
        replica moved it first (a lost compare-and-swap, decided again from theirs at
        once). A withdrawn cluster that was held then keeps that verdict and reason: it
        is still held, and a reason that flapped to "not yet recorded" and back for one
        round trip cost its MachineDeployment and K0sControlPlane two status writes each
        (issue #13: ~2 lost races per admission at 10 replicas, bench/README.md "Fewer
        status writes per rolled cluster"). Otherwise (the record unreadable or not
        writable) it says so."""
        new = self.admitted_now
        if not new:
            return self
        clusters = dict(self.clusters)
        reasons = dict(self.reasons)
        for k in new:
            g = clusters[k]
            prev = kept.clusters.get(k) if kept is not None else None
            if prev is not None and not prev.allowed and prev.reason and not prev.foreign:
                clusters[k] = replace(g, phase=prev.phase, allowed=False, reason=prev.reason,
                                      admitted_now=False)
                reasons[k] = prev.reason
            else:
                clusters[k] = replace(g, allowed=False, reason=why, admitted_now=False)
                reasons[k] = why
        return replace(
            self,
            allowed_clusters=self.allowed_clusters - new,
            reasons=reasons,
            clusters=clusters,
            state=self.previous,
        )


@dataclass(frozen=True, slots=True)
class DecisionHold:
    """A decision as the planner's hold (a :class:`~fleet.planner.policy.VerdictHold`): a
    cluster's answers are its verdict (admitted or why not) and the held objects, so a
    cluster whose verdict is the same as when the planner last asked needs no asking."""

    decision: GateDecision

    def __call__(self, cluster: ClusterKey, owner: ObjectRef) -> str | None:
        return self.decision.hold(cluster, owner)

    def verdict(self, cluster: ClusterKey) -> object:
        d = self.decision
        return (d.clusters.get(cluster), d.held_objects)

    def moved_since(self, before: object) -> AbstractSet[ClusterKey] | None:
        """The clusters whose verdict may differ from ``before``'s: those whose gate is
        another (the gate keeps a settled cluster's object from one decision to the next,
        so this is mostly identity checks); None when the held objects moved (every
        cluster's verdict holds them) or ``before`` is no decision hold."""
        if not isinstance(before, DecisionHold):
            return None
        was, now = before.decision, self.decision
        if was is now:
            return frozenset()
        if was.held_objects != now.held_objects:
            return None
        told = moved_since(now.clusters, generation(was.clusters))
        if told is not None:  # the gate's decision after ``was``: it says whose moved
            return told
        old, new = was.clusters, now.clusters
        moved = {k for k, g in new.items() if (o := old.get(k)) is not g and o != g}
        moved.update(old.keys() - new.keys())  # gone: no verdict now
        return moved


FOREIGN = "acted on by another controller replica"


def _cluster_id(key: ClusterKey) -> str:
    return f"{key[0]}/{key[1]}"


def _when(t: datetime) -> str:
    return format_time(t).replace(".000000Z", "Z")


@dataclass(frozen=True, slots=True)
class GateSettings:
    """What the gate reads of a cluster's effective settings (fleet.config.models.ClusterSettings):
    its wave and maintenance windows. One object for every cluster that shares them (a
    pydantic ClusterSettings per cluster was 1.4 KB, for each of 10 000 clusters)."""

    wave: Wave
    maintenance_windows: tuple[MaintenanceWindow, ...]


@dataclass(frozen=True, slots=True)
class _Facts:
    """What the gate derives from one cluster's progress alone (remembered while the
    progress is the same object: the controller keeps it per cluster until it moves)."""

    progress: ClusterProgress
    fingerprint: str
    body: tuple[str, str, tuple[tuple[str, str, str], ...]]  # what the fingerprint hashes
    complete: bool
    failed: int
    started: bool
    needs_dispatch: bool
    settings: ClusterSettings | GateSettings
    pause: str | None


@dataclass(slots=True, eq=False)
class _Member:
    """One cluster as the gate last judged it: what of its verdict depends on nothing but
    its own progress and its admission in the record (kept until either moves)."""

    progress: ClusterProgress
    facts: _Facts
    wave: str
    cid: str
    admitted: str | None  # its admission in the record it was judged with
    phase: ClusterPhase  # before this evaluation's admissions
    held: tuple[tuple[ObjectRef, str], ...]  # its paused objects (not when foreign)


class _WaveIndex:
    """A wave's members and the aggregates the gate reads every evaluation, kept up to
    date member by member: counts per phase, who fails, who upgrades, who queues."""

    __slots__ = ("active", "counts", "failed", "failing", "fp", "keys", "members", "queued")

    def __init__(self) -> None:
        self.members: dict[ClusterKey, _Member] = {}
        self.counts: dict[ClusterPhase, int] = dict.fromkeys(ClusterPhase, 0)
        self.failed: set[ClusterKey] = set()  # a failed node upgrade (facts.failed)
        self.active: set[ClusterKey] = set()  # UPGRADING: holds a slot
        # FAILED with a node still working on its request (its NodePlan failed by a
        # deadline): dispatches nothing, but holds its slot until the node has finished
        self.failing: set[ClusterKey] = set()
        # QUEUED: wants a slot (this replica's own clusters: another replica's queued
        # cluster has the same verdict whatever the fleet does, kept as settled)
        self.queued: set[ClusterKey] = set()
        self.keys: tuple[ClusterKey, ...] | None = ()  # sorted members; None: to sort
        self.fp: str | None = fingerprint([])  # None: to hash

    def add(self, m: _Member) -> None:
        key = m.progress.key
        self.members[key] = m
        self.counts[m.phase] += 1
        if m.facts.failed:
            self.failed.add(key)
        if m.phase is ClusterPhase.UPGRADING:
            self.active.add(key)
        elif m.phase is ClusterPhase.FAILED and m.progress.in_flight > 0:
            self.failing.add(key)
        elif m.phase is ClusterPhase.QUEUED and not m.progress.foreign:
            self.queued.add(key)

    def remove(self, key: ClusterKey) -> _Member:
        m = self.members.pop(key)
        self.counts[m.phase] -= 1
        self.failed.discard(key)
        self.active.discard(key)
        self.failing.discard(key)
        self.queued.discard(key)
        return m

    def sorted_keys(self) -> tuple[ClusterKey, ...]:
        if self.keys is None:
            self.keys = tuple(sorted(self.members))
        return self.keys

    def fingerprint(self) -> str:
        """``fingerprint`` of the members, hashed again only after a member joined, left
        or changed its targets."""
        if self.fp is None:
            self.fp = fingerprint_of(m.facts.body for m in self.members.values())
        return self.fp


def _phase(f: _Facts, c: ClusterProgress, admitted: str | None) -> ClusterPhase:
    if c.foreign and admitted is not None and admitted != f.fingerprint and not f.failed:
        # Another replica admitted it for targets this one does not see (yet): one of the
        # two is behind (the FleetUpgrades' watch and the record's are separate streams).
        # It holds its slot until its own replica drops the admission (complete, or
        # its targets changed) or this one catches up: never taken for free on a stale view.
        return ClusterPhase.UPGRADING
    if f.complete:
        return ClusterPhase.COMPLETE
    if f.failed:
        return ClusterPhase.FAILED
    if f.started or admitted == f.fingerprint:
        return ClusterPhase.UPGRADING
    if f.needs_dispatch and c.observed:
        return ClusterPhase.QUEUED
    return ClusterPhase.WAITING


def _settled_reason(m: _Member) -> str:
    """Why a cluster that neither upgrades nor queues may not start anything."""
    c = m.progress
    if m.phase is ClusterPhase.COMPLETE:
        return "up to date"
    if m.phase is ClusterPhase.FAILED:
        return (f"{c.failed} failed node upgrade(s); retry (annotation "
                "fleet.k0s-fleet.io/retry) or clear them to continue")
    if not c.observed:
        return c.not_observed_reason
    return "nothing to upgrade in place (left to Cluster API, or nodes not Ready)"


class RolloutGate:
    """The pure wave engine. One instance per fleet configuration.

    Incremental: the gate keeps an index of the fleet (per wave: members, counts per
    phase, failing, upgrading and queued clusters) and updates it for the clusters whose
    progress is a new object (the controller keeps it per cluster until it moves) or
    whose admission in the record changed. An evaluation then costs the clusters that
    moved, plus those upgrading or queued (their verdict depends on the fleet: slots,
    holds, earlier waves); a settled cluster's verdict (up to date, failed, nothing to do
    in place) is kept, as its :class:`ClusterGate` object. Equal to walking the whole
    fleet (tests/unit/test_incremental_gate.py holds it to that reference)."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        # per cluster: the labels its settings were computed with, and the shared settings
        self._settings: dict[ClusterKey, tuple[Mapping[str, str], GateSettings]] = {}
        self._shared: dict[tuple[object, ...], GateSettings] = {}
        self._windows: dict[tuple[object, ...], tuple[bool, datetime | None]] = {}
        self._windows_at: datetime | None = None
        self._entries = {(e.namespace, e.name): e for e in config.clusters.entries}
        self._facts: dict[ClusterKey, _Facts] = {}
        # The index: every cluster of the last view, per wave, and the verdicts kept.
        self._members: dict[ClusterKey, _Member] = {}
        self._by_cid: dict[str, ClusterKey] = {}
        self._waves: dict[str, _WaveIndex] = {}
        self._record: dict[str, str] = {}  # the record's admissions the index was built on
        self._reasons: dict[ClusterKey, str] = {}
        self._gates: dict[ClusterKey, ClusterGate] = {}
        self._held: dict[ObjectRef, str] = {}
        self.judged = 0  # clusters whose verdict was recomputed (metrics, tests)
        # the generation of the progress list the index was brought to (fleet.world.delta)
        self._clusters_gen = 0
        # whose verdict was replaced or dropped since the last decision, and its delta
        self._gates_moved: set[ClusterKey] = set()
        self._decided: Delta | None = None

    def facts(self, c: ClusterProgress) -> _Facts:
        found = self._facts.get(c.key)
        if found is None or found.progress is not c:
            found = self._facts[c.key] = _Facts(
                progress=c, fingerprint=fingerprint([c]),
                body=(c.namespace, c.name, tuple(c.targets())), complete=c.complete,
                failed=c.failed, started=c.started, needs_dispatch=c.needs_dispatch,
                settings=self.settings(c), pause=self.cluster_pause(c))
        return found

    def settings(self, c: ClusterProgress) -> GateSettings:
        """What the gate reads of the cluster's effective settings (cached per cluster and
        labels: the config never changes; one object per distinct wave and windows)."""
        found = self._settings.get(c.key)
        if found is not None and found[0] == c.labels:
            return found[1]
        if len(self._settings) > 100_000:
            self._settings.clear()
        full = self.config.for_cluster(c.namespace, c.name, c.labels)
        windows = full.maintenance_windows
        # waves by name (unique; the default wave is made anew on each ask), windows by
        # identity (the config's own objects, kept alive by the shared value)
        shared = self._shared.setdefault(
            (full.wave.name, *map(id, windows)), GateSettings(full.wave, windows))
        self._settings[c.key] = (c.labels, shared)
        return shared

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

    # -- the index -----------------------------------------------------------------------
    def _wave(self, name: str) -> _WaveIndex:
        found = self._waves.get(name)
        if found is None:
            found = self._waves[name] = _WaveIndex()
        return found

    def _forget(self, key: ClusterKey) -> None:
        m = self._members.pop(key)
        index = self._waves[m.wave]
        index.remove(key)
        index.keys = index.fp = None
        self._by_cid.pop(m.cid, None)
        self._facts.pop(key, None)
        self._reasons.pop(key, None)
        self._gates.pop(key, None)
        self._gates_moved.add(key)
        for ref, _ in m.held:
            self._held.pop(ref, None)

    def _judge(self, c: ClusterProgress, admitted: str | None) -> None:
        """(Re)index one cluster: its phase, its wave's aggregates, its settled verdict."""
        self.judged += 1
        key = c.key
        f = self.facts(c)
        old = self._members.get(key)
        wave = f.settings.wave.name
        index = self._wave(wave)
        if old is not None:
            before = self._waves[old.wave]
            before.remove(key)
            if old.wave != wave:
                before.keys = before.fp = None
                index.keys = index.fp = None
            elif old.facts.body != f.body:
                index.fp = None
            for ref, _ in old.held:
                self._held.pop(ref, None)
        else:
            index.keys = index.fp = None
        held = () if c.foreign else tuple(
            (o.ref, f"paused by annotation {ANN_PAUSED} on {o.ref.kind}"
                    + (f": {o.paused}" if o.paused else ""))
            for o in c.objects if o.paused is not None)
        cid = _cluster_id(key)
        m = _Member(progress=c, facts=f, wave=wave, cid=cid, admitted=admitted,
                    phase=_phase(f, c, admitted), held=held)
        self._members[key] = m
        self._by_cid[cid] = key
        index.add(m)
        self._held.update(held)
        if m.phase not in (ClusterPhase.UPGRADING, ClusterPhase.QUEUED) or (
                c.foreign and m.phase is ClusterPhase.QUEUED):
            # Its verdict depends on nothing but itself: settled until it moves. (Another
            # replica's queued cluster is only ever admitted by that replica: walking
            # them on every evaluation was a quarter of a sharded replica's CPU.)
            reason = FOREIGN if m.phase is ClusterPhase.QUEUED else _settled_reason(m)
            self._reasons[key] = reason
            gate = ClusterGate(key, wave, m.phase, False, reason, paused=f.pause,
                               foreign=c.foreign)
            if self._gates.get(key) != gate:
                self._gates[key] = gate
                self._gates_moved.add(key)

    def _clusters_out(self) -> DeltaDict[ClusterKey, ClusterGate]:
        """The verdicts for a decision: a copy that says whose verdict is another object
        than in the decision before (fleet.world.delta), for the planner's hold and the
        coordinator's report, which looked at every cluster's on each pass."""
        moved, self._gates_moved = self._gates_moved, set()
        out: DeltaDict[ClusterKey, ClusterGate] = DeltaDict(
            self._gates, Delta.after(self._decided, moved))
        self._decided = out.delta
        return out

    def _moved(self, clusters: Sequence[ClusterProgress]) -> list[ClusterProgress] | None:
        """The clusters whose progress moved since the list the index was last brought to,
        the gone ones forgotten, when ``clusters`` says (a
        :class:`~fleet.world.delta.DeltaList` following that list); else None."""
        hinted = moved_since(clusters, self._clusters_gen)
        self._clusters_gen = 0  # (again once the index is brought to this list)
        lookup = getattr(clusters, "lookup", None)
        if hinted is None or lookup is None:
            return None
        found: list[tuple[ClusterKey, Sequence[ClusterProgress]]] = []
        for key in hinted:
            items = lookup(key)
            if items is None:  # the list is no longer its producer's latest
                return None
            found.append((key, items))
        members = self._members
        moved: list[ClusterProgress] = []
        for key, items in found:
            if not items:
                if key in members:
                    self._forget(key)
                continue
            for c in items:
                m = members.get(c.key)
                if m is None or m.progress is not c:
                    moved.append(c)
        return moved

    def _update(self, view: FleetView) -> None:
        """Bring the index to ``view``: clusters gone, new or moved (a new progress object,
        or another admission in the record)."""
        members = self._members
        moved = self._moved(view.clusters)
        if moved is None:  # looked at whole
            present: set[ClusterKey] = set()
            moved = []
            new = 0
            for c in view.clusters:
                present.add(c.key)
                m = members.get(c.key)
                if m is None:
                    new += 1
                    moved.append(c)
                elif m.progress is not c:
                    moved.append(c)
            if len(present) < len(view.clusters):
                raise ValueError("the rollout gate was given a cluster twice")
            if len(members) + new > len(present):  # some left
                for gone in [k for k in members if k not in present]:
                    self._forget(gone)
        self._clusters_gen = generation(view.clusters)
        record = view.state.admitted
        for c in moved:
            self._judge(c, record.get(_cluster_id(c.key)))
        if record != self._record:
            for cid in record.keys() | self._record.keys():
                key = self._by_cid.get(cid)
                if key is not None and members[key].admitted != record.get(cid):
                    self._judge(members[key].progress, record.get(cid))
            self._record = dict(record)

    # -- the evaluation ------------------------------------------------------------------
    def evaluate(self, view: FleetView, now: datetime) -> GateDecision:
        rollout = self.config.rollout
        waves = rollout.effective_waves
        self._update(view)
        members = self._members
        state = view.state

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
            index = self._wave(w.name)
            tolerated = w.tolerated_failures(len(index.members))
            if len(index.failed) > tolerated:
                failed = sorted(index.failed)
                names = ", ".join(_cluster_id(k) for k in failed[:5])
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
        reasons = self._reasons
        gates = self._gates
        wakeups: list[datetime] = []
        # The record's admissions of clusters in view, less those of this replica's own
        # clusters that are complete or for targets no longer wanted. Another replica's
        # cluster keeps its admission until its own replica drops it: when every replica
        # dropped a complete one, each completion made all of them rewrite the record at
        # once, one write landing and the others conflicting (409), withdrawing whatever
        # they had admitted with it; and one whose targets this replica sees otherwise
        # was admitted by a replica that is ahead of it or behind it (a complete cluster,
        # matching, holds no slot; a mismatched one does: _phase).
        admitted: dict[str, str] = {}
        for cid, fp in state.admitted.items():
            key = self._by_cid.get(cid)
            if key is not None:
                m = members[key]
                if m.progress.foreign or (m.facts.fingerprint == fp
                                          and m.phase is not ClusterPhase.COMPLETE):
                    admitted[cid] = fp
        records = dict(state.waves)
        statuses: list[WaveStatus] = []
        blocker: str | None = None  # why clusters of later waves may not be admitted
        # The wave before this one, if it is not complete: a held cluster names it, not
        # the first incomplete wave (true as well: a wave completes only after those
        # before it), so its reason does not change when an earlier wave completes
        # (bench/README.md "Fewer status writes per rolled cluster"). The first blocker
        # stays in the waves' status.
        open_before: str | None = None

        for index_no, w in enumerate(waves):
            wi = self._wave(w.name)
            wave_fp = wi.fingerprint()
            record = records.get(w.name)
            if record is not None and record.fingerprint != wave_fp:
                record = None
            limit = rollout.concurrency(w)
            active = [members[k] for k in wi.active]
            queued = [members[k] for k in sorted(wi.queued)]
            # The slots go to the clusters admitted in the record first; a cluster that is
            # only started (NodePlans for its targets, no admission: its admission ended
            # when it was complete and it has work again, or the record was lost) comes
            # after them, and goes through the record when it may dispatch again.
            active.sort(key=lambda m: (admitted.get(m.cid) != m.facts.fingerprint,
                                       m.progress.key))
            newly: set[ClusterKey] = set()
            verdicts: dict[ClusterKey, tuple[ClusterPhase, str]] = {}
            for i, m in enumerate(active):
                c = m.progress
                if c.foreign:
                    verdicts[c.key] = (m.phase, FOREIGN)  # counted against the limit
                    continue
                hold = fleet_hold or self._cluster_hold(c, now, wakeups)
                if hold is None and i >= limit:
                    # A failed cluster retried, or a started one with work again, while
                    # others took the slots.
                    hold = (f"wave {w.name}: clusters upgrading exceed "
                            f"maxConcurrentClusters {limit}; waiting for one to finish")
                if hold is None:
                    allowed.add(c.key)
                    verdicts[c.key] = (m.phase, "")
                    if admitted.get(m.cid) != m.facts.fingerprint and m.facts.needs_dispatch:
                        admitted[m.cid] = m.facts.fingerprint
                        newly.add(c.key)
                else:
                    verdicts[c.key] = (m.phase, hold)
            slots = limit - len(active) - len(wi.failing)
            held_by_waves = blocker if blocker is None or open_before is None \
                else f"waiting for wave {open_before} to complete"
            for m in queued:  # this replica's own (another's: settled in _judge)
                c = m.progress
                if fleet_hold is not None:
                    verdicts[c.key] = (m.phase, fleet_hold)
                elif held_by_waves is not None:
                    verdicts[c.key] = (m.phase, held_by_waves)
                elif slots <= 0:
                    verdicts[c.key] = (m.phase, f"wave {w.name}: maxConcurrentClusters "
                                                f"{limit} clusters upgrading; waiting for "
                                                "one to finish")
                elif (hold := self._cluster_hold(c, now, wakeups)) is not None:
                    verdicts[c.key] = (m.phase, hold)
                else:
                    allowed.add(c.key)
                    newly.add(c.key)
                    admitted[m.cid] = m.facts.fingerprint
                    verdicts[c.key] = (ClusterPhase.UPGRADING, "")
                    slots -= 1
            for key, (verdict, reason) in verdicts.items():
                m = members[key]
                if reason:
                    reasons[key] = reason
                else:
                    reasons.pop(key, None)
                gate = ClusterGate(key, w.name, verdict, not reason, reason,
                                   admitted_now=key in newly, paused=m.facts.pause,
                                   foreign=m.progress.foreign)
                if gates.get(key) != gate:
                    gates[key] = gate
                    self._gates_moved.add(key)

            # The wave's own record and phase.
            n = len(wi.members)
            upgrading = wi.counts[ClusterPhase.UPGRADING] + sum(
                1 for k in newly if members[k].phase is ClusterPhase.QUEUED)
            failed_n = wi.counts[ClusterPhase.FAILED]
            done_n = wi.counts[ClusterPhase.COMPLETE]
            complete = done_n == n
            open_before = w.name if n and not complete else None
            if not n:
                statuses.append(WaveStatus(
                    name=w.name, index=index_no, canary=w.canary, phase=WavePhase.COMPLETE,
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
                    message = f"{done_n}/{n} clusters complete"
                if blocker is None:
                    blocker = f"waiting for wave {w.name} to complete"
            if record is not None:
                records[w.name] = record
            statuses.append(WaveStatus(
                name=w.name, index=index_no, canary=w.canary, phase=phase,
                clusters=wi.sorted_keys(), complete=done_n, upgrading=upgrading,
                failed=failed_n, tolerated_failures=w.tolerated_failures(n),
                max_concurrent=limit, soak=w.soak,
                started_at=record.started_at if record else None,
                completed_at=record.completed_at if record else None,
                soak_until=soak_until, message=message))

        wave_names = {w.name for w in waves}
        new_state = RolloutState(
            waves={n: r for n, r in records.items() if n in wave_names},
            paused=_transition(state.paused, pause, now),
            halted=_transition(state.halted, halted, now),
            stopped=_transition(state.stopped, stop, now),
            admitted=admitted,
        ) if view.fleet_writer else replace(state, admitted=admitted)
        future = [t for t in wakeups if t > now]
        return GateDecision(
            now=now, allowed_clusters=frozenset(allowed), reasons=dict(reasons),
            held_objects=dict(self._held), next_wakeup=min(future, default=None),
            waves=tuple(statuses), clusters=self._clusters_out(), state=new_state,
            previous=state,
            halted=halted, paused=pause, emergency_stop=stop)


def _transition(old: Transition | None, reason: str | None, now: datetime) -> Transition | None:
    if reason is None:
        return None
    if old is not None and old.reason == reason:
        return old
    return Transition(old.since if old is not None else now, reason)


__all__ = [
    "ClusterGate",
    "ClusterPhase",
    "DecisionHold",
    "FleetControls",
    "FleetView",
    "GateDecision",
    "RolloutGate",
    "WavePhase",
    "WaveStatus",
]
