"""Sequencing, the second job of a planning pass: which nodes of each K0sControlPlane and
MachineDeployment to start now (budgets, ordering, failure budgets, the policy's hold,
the version writer), and the rollout status written on those objects."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fleet.contract.skew import SkewRefusal, check_control_plane_move, check_worker_move
from fleet.contract.versions import K0sVersion, valid_version
from fleet.planner import conditions as C
from fleet.planner.actions import (
    CreateNodePlan,
    Decision,
    HaltObject,
    PatchMachineSetVersion,
    PatchMachineVersion,
    PauseObject,
    RecordWrittenVersion,
    ReleasePause,
    ReportNotInPlace,
    ReportOtherDriver,
    ReportVersionConflict,
    RolloutCounts,
    SetRolloutStatus,
)
from fleet.planner.state import (
    PassState,
    PlanView,
    deployment_budget,
    nodeplan_name,
)
from fleet.planner.writer import (
    ExtensionDrives,
    OtherDriver,
    TemplateStep,
    VersionStep,
    other_driver,
    release_pause,
    template_step,
    version_step,
)
from fleet.world.budget import UnavailabilityBudget
from fleet.world.eligibility import (
    Eligibility,
    as_recorded,
    as_recorded_control_plane,
    control_plane_eligibility,
    kubelet_form,
    machine_deployment_eligibility,
    same_version,
)
from fleet.world.model import (
    ANN_RETRY,
    ROLE_CONTROLLER,
    ClusterInfo,
    ClusterKey,
    Condition,
    ControlPlaneInfo,
    MachineDeploymentInfo,
    MachineInfo,
    MachineSetInfo,
    NodeInfo,
    ObjectRef,
    RolloutStatus,
    truncate,
)

CONTROL_PLANE_BUSY = "another control plane is being upgraded"


def hosted_wait(kcp: ControlPlaneInfo, target: str | None) -> str:
    """Why a hosted control plane is not done yet (what its workers are held for)."""
    return (f"waiting for k0smotron to run hosted control plane {kcp.ref.name} on {target} "
            f"with every replica ready (it reports {kcp.status_version or 'no version'}, "
            f"{kcp.ready_replicas}/{kcp.replicas} ready)")


def _held(step: VersionStep, driver: OtherDriver | None, policy_hold: str | None) -> str:
    """Why no node starts although one could: the version writer waits, another driver
    holds the cluster, or the fleet policy does ("" when none of them)."""
    if step.waiting:
        return step.waiting
    if driver is not None:
        return f"held: {driver.message}"
    if policy_hold is not None:
        return f"held: {policy_hold or 'paused'}"
    return ""


def _with_template(step: VersionStep, tstep: TemplateStep) -> VersionStep:
    """The MD's writer decision with its bootstrap template's: a template someone else
    changed holds the MD's nodes and is reported like the MD's own version."""
    if step.conflict or step.writer is None:
        return step
    if tstep.conflict:
        return dataclasses.replace(step, waiting=tstep.conflict, conflict=True, writer=(
            "False", C.R_CHANGED_BY_OTHER, tstep.conflict))
    if tstep.note and step.writer[0] == "True":
        return dataclasses.replace(step, writer=(
            step.writer[0], step.writer[1], f"{step.writer[2]}; {tstep.note}"))
    return step


@dataclass(slots=True)
class OwnerState:
    """What sequencing knows about one K0sControlPlane or MachineDeployment this pass."""

    ns: str
    ckey: ClusterKey
    cluster: ClusterInfo | None
    nodes: dict[str, NodeInfo] | None
    machines: list[MachineInfo]
    target: str
    live: list[MachineInfo]
    elig: dict[str, Eligibility]
    updated: int
    unavailable: dict[str, str]
    missing: int
    failed: list[PlanView]
    halted: bool
    not_in_place: dict[str, Eligibility]
    in_flight: list[str]


class Sequencing(PassState):
    # -- sequencing --------------------------------------------------------------------
    def _has_plan_for(self, m: MachineInfo, target: str) -> bool:
        return (m.ref.namespace, nodeplan_name(m.ref.name, target)) in self.views

    def _failed_for(self, owner: ObjectRef, target: str | None) -> list[PlanView]:
        return [v for v in self.views_by_owner.get((owner.namespace, owner.kind, owner.name), ())
                if v.failed and not v.plan.deleting and same_version(v.plan.version, target)]

    def _owner_state(self, owner: ControlPlaneInfo | MachineDeploymentInfo,
                     eligibility: Callable[[MachineInfo], Eligibility]) -> OwnerState | None:
        """What a KCP's or MD's sequencing starts from; None (status written) when its
        target is no k0s version."""
        ns = owner.ref.namespace
        ckey: ClusterKey = (ns, owner.cluster)
        machines = [m for m in self.machines_by_owner.get(owner.ref, [])
                    if m.cluster == owner.cluster]
        target = valid_version(owner.version)
        if target is None:
            self._invalid_target(owner.ref, owner.version, owner.status, len(machines))
            return None
        nodes = self.nodes(ckey)
        live = [m for m in machines if not m.deleting]
        elig = {m.ref.name: eligibility(m) for m in live}
        failed = self._failed_for(owner.ref, target)
        return OwnerState(
            ns=ns, ckey=ckey, cluster=self.cluster(*ckey), nodes=nodes, machines=machines,
            target=target, live=live, elig=elig,
            updated=sum(1 for e in elig.values() if e.up_to_date),
            unavailable={m.ref.name: r for m in machines
                         if (r := self._machine_unavailable(m, target, nodes)) is not None},
            missing=max(0, owner.replicas - len(live)), failed=failed,
            halted=len(failed) >= max(1, self.settings.halt_at_failures),
            not_in_place={n: e for n, e in elig.items() if not e.up_to_date and not e.in_place},
            in_flight=[m.ref.name for m in machines if any(
                v.in_flight for v in self.by_machine.get((ns, m.ref.name), []))])

    def _report(self, owner: ControlPlaneInfo | MachineDeploymentInfo, st: OwnerState,
                budget: UnavailabilityBudget, *, dispatched: list[str], waiting: str,
                budget_problem: tuple[str, str] | None, step: VersionStep,
                driver: OtherDriver | None, done_note: str = "",
                total: int | None = None) -> None:
        """The object's rollout status and this pass' decision for it. ``total``: how many
        it counts when not its Machines (a hosted control plane's replicas)."""
        # This pass adopts the object's version (RecordWrittenVersion): its conditions
        # change again once that lands ("adopting" -> written), a pass later; its status
        # and the Events that go with a status change are written once, then (a fresh
        # fleet: one status write per object, not two).
        adopting = any(isinstance(a, RecordWrittenVersion) for a in step.actions)
        counts = RolloutCounts(
            target_version=st.target, updated=st.updated,
            total=len(st.live) if total is None else total,
            in_flight=len(st.in_flight), failed=len(st.failed),
            unavailable=len(st.unavailable) + st.missing + len(dispatched),
            max_unavailable=budget.limit, not_in_place=len(st.not_in_place), halted=st.halted)
        self._rollout_status(owner.ref, owner.status, counts, not_in_place=st.not_in_place,
                             failed=st.failed, waiting=waiting, in_flight=st.in_flight,
                             budget_problem=budget_problem, unreachable=self._unreachable(st.ckey),
                             extra=self._writer_conditions(owner.ref, owner.status, step, driver,
                                                           report=not adopting),
                             done_note=done_note, adopting=adopting)
        self.decisions.append(Decision(owner.ref, st.target, st.updated, len(st.live),
                                       counts.unavailable, budget.limit, tuple(dispatched),
                                       waiting))

    def _hosted_control_plane(self, kcp: ControlPlaneInfo) -> None:
        """A K0smotronControlPlane: k0smotron runs the control plane as pods and rolls them
        itself. k0s-fleet writes its version (unpaused, as the cluster's control-plane
        step, when the rollout policy admits the cluster and k0s's skew rules allow it) and
        then waits for k0smotron to report it with every replica ready; the cluster's
        workers are held until then (:meth:`_workers_blocked`)."""
        st = self._owner_state(kcp, lambda m: control_plane_eligibility(m, kcp))
        if st is None:
            return
        cluster = st.cluster
        blocked = (f"Cluster {kcp.cluster} not found" if cluster is None
                   else f"Cluster {kcp.cluster} is paused" if cluster.paused else "")
        policy_hold = self.hold(st.ckey, kcp.ref)
        if isinstance(policy_hold, ExtensionDrives):
            policy_hold = policy_hold.inner
        step = version_step(kcp, hold=policy_hold, write_blocked=blocked, pause=False,
                            skew=self._skew(kcp, st.target))
        self.emit(*step.actions)
        done = kcp.hosted_on(st.target)
        st.updated = kcp.replicas if done else 0
        waiting = step.waiting or ("" if done else hosted_wait(kcp, st.target))
        self._report(kcp, st, UnavailabilityBudget.one(), dispatched=[], waiting=waiting,
                     budget_problem=None, step=step, driver=None, total=kcp.replicas)

    def _control_plane(self, kcp: ControlPlaneInfo) -> None:
        if kcp.hosted:
            self._hosted_control_plane(kcp)
            return
        # A Completed NodePlan counts while its Machine's spec.version write lands.
        st = self._owner_state(kcp, lambda m: control_plane_eligibility(
            as_recorded_control_plane(m, kcp, self.completed.get((m.ref.namespace,
                                                                  m.ref.name))), kcp))
        if st is None:
            return
        (ns, ckey, cluster, nodes, target, live, elig, unavailable, missing, halted, in_flight) = (
            st.ns, st.ckey, st.cluster, st.nodes, st.target, st.live, st.elig, st.unavailable,
            st.missing, st.halted, st.in_flight)
        budget = UnavailabilityBudget.one()

        blocked = (f"Cluster {kcp.cluster} not found" if cluster is None
                   else self._unreachable(ckey) or f"workload cluster {kcp.cluster} unreachable"
                   if nodes is None
                   else f"Cluster {kcp.cluster} is paused" if cluster.paused
                   else "halted: failure budget exceeded" if halted else "")
        policy_hold = self.hold(ckey, kcp.ref)
        if isinstance(policy_hold, ExtensionDrives):
            # CAPI's in-place updates (our extension) are for workers; control planes are
            # k0s-fleet's own (paused executor).
            policy_hold = policy_hold.inner
        step = version_step(kcp, hold=policy_hold, write_blocked=blocked,
                            skew=self._skew(kcp, target))
        self.emit(*step.actions)
        driver = other_driver(kcp, live, autopilot_plan=self.s.autopilot_plans.get(ckey))
        release = release_pause(kcp, live, in_flight=bool(in_flight))
        if release is not None:
            self.emit(release)

        waiting = ""
        dispatched: list[str] = []
        candidates = [m for m in live if elig[m.ref.name].in_place
                      and not self._has_plan_for(m, target)]
        if candidates:
            if cluster is None or nodes is None or blocked:
                waiting = blocked
            elif held := _held(step, driver, policy_hold):
                waiting = held
            elif self._control_plane_busy(ns, kcp.cluster):
                waiting = CONTROL_PLANE_BUSY
            elif unavailable or missing:
                why = ", ".join(f"{n} {r}" for n, r in sorted(unavailable.items()))
                if missing:
                    why = ", ".join(x for x in (why, f"{missing} replica(s) missing") if x)
                waiting = f"waiting for every control plane to be available ({why})"
            else:
                m = candidates[0]
                node = nodes.get(m.node_name)
                assert node is not None  # available implies present
                self.emit(CreateNodePlan(
                    cluster=ckey, owner=kcp.ref, machine=m.ref, node=node.name,
                    node_kind=node.kind, role=ROLE_CONTROLLER, version=target,
                    executor=cluster.executor, reason="oldest out-of-date control plane"))
                dispatched.append(m.ref.name)
                in_flight.append(m.ref.name)
                if len(candidates) > 1:
                    # What the next pass says of the others once this NodePlan is seen:
                    # the status is written once per control plane, not twice (issue #13,
                    # bench/README.md "Fewer status writes per rolled cluster").
                    waiting = CONTROL_PLANE_BUSY
        self._report(kcp, st, budget, dispatched=dispatched, waiting=waiting,
                     budget_problem=None, step=step, driver=driver)

    def _skew(self, owner: ControlPlaneInfo | MachineDeploymentInfo, target: str
              ) -> SkewRefusal | None:
        """k0s's version skew rules for moving ``owner`` to ``target``, given the versions
        the Machines of its cluster say (fleet/contract/skew.py): one minor at a time, no downgrade,
        workers never newer than the oldest control plane nor more than one minor older.
        Control planes hosted outside the cluster's Machines are not counted here."""
        if same_version(owner.object_version, target):
            return None
        ckey = (owner.ref.namespace, owner.cluster)
        mine, cps, workers = [owner.written_version], [], []
        if isinstance(owner, ControlPlaneInfo) and owner.hosted:
            mine.append(owner.status_version)
        cps += [k.status_version for k in self.kcps_by_cluster.get(ckey, ()) if k.hosted]
        for m in self.machines_by_cluster.get(ckey, ()):
            if m.deleting or not m.version:
                continue
            if m.owner == owner.ref:
                mine.append(m.version)
            if m.role == ROLE_CONTROLLER:
                cps.append(m.version)
            else:
                workers.append(m.version)
        if isinstance(owner, ControlPlaneInfo):
            return check_control_plane_move(mine, workers, target,
                                            what=f"K0sControlPlane {owner.ref.name}")
        return check_worker_move(mine, cps, target,
                                 what=f"MachineDeployment {owner.ref.name}")

    def _workers_blocked(self, ns: str, cluster: str, target: str) -> str:
        """Why workers of this cluster must wait for its control planes ('' = they need not).

        A control plane whose node this pass found Completed on the target (its NodePlan
        Completed, or being recorded so: the node runs the version and is Ready) counts as
        on it, as it does for its K0sControlPlane: the completion's two writes (the
        NodePlan's status, the Machine's version) land at different moments, and a pass
        in between made the workers wait one more round trip for what is already known
        (bench/README.md "A planning pass in proportion to what moved")."""
        cps = self.kcps_by_cluster.get((ns, cluster), [])
        oldest: K0sVersion | None = None
        for kcp in cps:
            kt = valid_version(kcp.version)
            if kcp.hosted:
                if kt is None or not kcp.hosted_on(kt) or not same_version(
                        kcp.object_version, kt):
                    return hosted_wait(kcp, kt or kcp.version)
                v = K0sVersion.parse(kt)
                oldest = v if oldest is None or v < oldest else oldest
                continue
            for m in self.machines_by_owner.get(kcp.ref, []):
                if m.deleting:
                    continue
                on_target = kt is not None and (same_version(m.version, kt)
                                                or self._completed_on(m, kt))
                if kt is None or not on_target:
                    # Names the K0sControlPlane, not the Machine: the same words for the
                    # whole control-plane phase, so the MD's status is written once for
                    # it, not once per control plane (the KCP's status names the node).
                    return (f"control planes of {kcp.ref.name} are not yet all on "
                            f"{kt or kcp.version}")
                v = K0sVersion.parse(kt)
                oldest = v if oldest is None or v < oldest else oldest
        if self._control_plane_busy(ns, cluster, recording=False):
            return "a control plane is being upgraded"
        if oldest is not None and K0sVersion.parse(target) > oldest:
            return f"workers may not run a newer version ({target}) than control planes ({oldest})"
        return ""

    def _completed_on(self, machine: MachineInfo, version: str) -> bool:
        """The controller's NodePlan for ``machine`` on ``version`` is Completed (observed,
        or found so by this pass and being recorded)."""
        done = self.completed.get((machine.ref.namespace, machine.ref.name))
        return done is not None and done.source == "controller" and not done.deleting \
            and done.machine == machine.ref.name and same_version(done.version, version)

    def _deployment(self, md: MachineDeploymentInfo) -> None:
        # A worker is judged by what its node reports too (never by spec.version alone).
        # A worker's Completed NodePlan is its record until the paused sequence ends.
        st = self._owner_state(md, lambda m: machine_deployment_eligibility(
            as_recorded(m, md, self.completed.get((m.ref.namespace, m.ref.name))), md,
            self.s.machine_sets.get((md.ref.namespace, m.machine_set or "")),
            self.node((md.ref.namespace, md.cluster), m.node_name)))
        if st is None:
            return
        (ns, ckey, cluster, nodes, machines, target, live, elig, unavailable, missing, halted,
         in_flight) = (
            st.ns, st.ckey, st.cluster, st.nodes, st.machines, st.target, st.live, st.elig,
            st.unavailable, st.missing, st.halted, st.in_flight)
        budget, budget_problem = deployment_budget(md)
        candidates = [m for m in live if elig[m.ref.name].in_place
                      and not self._has_plan_for(m, target) and m.ref.name not in unavailable]
        blocked_nodes = [m for m in live if elig[m.ref.name].in_place
                         and not self._has_plan_for(m, target) and m.ref.name in unavailable]

        sets = self.sets_by_deployment.get((ns, md.ref.name), [])
        elsewhere = (f"Cluster {md.cluster} not found" if cluster is None
                     else self._unreachable(ckey) or f"workload cluster {md.cluster} unreachable"
                     if nodes is None
                     else f"{'Cluster' if cluster.paused else 'MachineDeployment'} is paused"
                     if cluster.paused or md.paused
                     else "halted: failure budget exceeded" if halted else "")
        blocked = budget_problem[1] if budget_problem is not None else elsewhere
        policy_hold = self.hold(ckey, md.ref)
        capi_drives = isinstance(policy_hold, ExtensionDrives)
        write_hold = policy_hold.inner if isinstance(policy_hold, ExtensionDrives) \
            else policy_hold
        # OnDelete, as Cluster API defines it: the version is written (when the policy
        # admits the cluster) unpaused; CAPI replaces each Machine someone deletes, and
        # k0s-fleet takes none down in place.
        on_delete = md.strategy == "OnDelete"
        # The worker bootstrap template's version, kept in step with the MD's.
        tstep = template_step(md)
        self.emit(*tstep.actions)
        step = version_step(md, hold=write_hold, write_blocked=(
            elsewhere if on_delete else blocked) or (
            self._workers_blocked(ns, md.cluster, target))
            or tstep.hold_write or tstep.conflict,
            pause=not capi_drives and not on_delete, skew=self._skew(md, target))
        self.emit(*step.actions)
        step = _with_template(step, tstep)
        self._finish_paused_deployment(md, target, live, sets, elig,
                                       in_flight=bool(in_flight) or missing > 0,
                                       own_executor=not capi_drives and not on_delete)
        # Where Cluster API drives the workers through our extension, its MachineSets and
        # in-place annotations are the intended driver, not another one.
        driver = None if capi_drives else other_driver(
            md, machines, sets, autopilot_plan=self.s.autopilot_plans.get(ckey))

        waiting = ""
        dispatched: list[str] = []
        if candidates or blocked_nodes:
            if budget_problem is not None:
                waiting = budget_problem[1]
            elif cluster is None:
                waiting = f"Cluster {md.cluster} not found"
            elif nodes is None:
                waiting = self._unreachable(ckey) or f"workload cluster {md.cluster} unreachable"
            elif cluster.paused or md.paused:
                waiting = f"{'Cluster' if cluster.paused else 'MachineDeployment'} is paused"
            elif halted:
                waiting = "halted: failure budget exceeded"
            elif held := _held(step, driver, policy_hold):
                waiting = held
            elif blocked := self._workers_blocked(ns, md.cluster, target):
                waiting = blocked
            else:
                room = budget.room(len(unavailable) + missing)
                for m in candidates[:room]:
                    node = nodes.get(m.node_name)
                    assert node is not None
                    self.emit(CreateNodePlan(
                        cluster=ckey, owner=md.ref, machine=m.ref, node=node.name,
                        node_kind=node.kind, role=m.role, version=target,
                        executor=cluster.executor, reason="within maxUnavailable"))
                    dispatched.append(m.ref.name)
                    in_flight.append(m.ref.name)
                if len(candidates) > room:
                    waiting = (f"{len(unavailable) + missing + len(dispatched)} unavailable of "
                               f"maxUnavailable {budget.limit}")
                elif not candidates:
                    waiting = "waiting for nodes to become available: " + ", ".join(
                        f"{m.ref.name} {unavailable[m.ref.name]}" for m in blocked_nodes)
        self._report(md, st, budget, dispatched=dispatched, waiting=waiting,
                     budget_problem=budget_problem, step=step, driver=driver,
                     done_note=C.CAPI_UP_TO_DATE_NOTE.format(
                         kubelet=kubelet_form(st.target), target=st.target))

    def _finish_paused_deployment(self, md: MachineDeploymentInfo, target: str,
                                  live: list[MachineInfo], sets: list[MachineSetInfo],
                                  elig: dict[str, Eligibility], *, in_flight: bool,
                                  own_executor: bool = True) -> None:
        """The end of the paused in-place sequence of an MD, once every node runs the
        target: pause the Machines' MachineSet (its controller would re-apply the old
        Machine versions from a reconcile in flight), move the MachineSet's template and
        the Machines' versions to the target, then release both pauses; each step waits
        until the previous one is observed (the MachineSet's pause until Cluster API
        reports it, ``MachineSetInfo.paused_reported``).

        After the release the same steps repair a Machine whose ``spec.version`` went back
        to the old version although k0s-fleet upgraded its node (running-version
        annotation) and the MD is ours at the target: CAPI's MachineSet controller
        force-applies each Machine's version from its cache (no resourceVersion), so a
        reconcile that read the Machine before our write (in flight when the MachineSet
        was paused, or on a cache that lags after the unpause) writes the old one back."""
        if in_flight or not same_version(md.object_version, target):
            return
        paused_by_us = md.paused_for is not None and md.capi_paused
        released = (own_executor and not md.capi_paused and md.paused_for is None
                    and same_version(md.written_version, target))
        if not paused_by_us and not released:
            return
        if not all(elig[m.ref.name].up_to_date for m in live):
            return
        owning = {m.machine_set for m in live}
        mine = [ms for ms in sets if ms.ref.name in owning]
        behind = [m for m in live if not same_version(m.version, target)]
        if released:
            # only what k0s-fleet itself upgraded in place: its completion is recorded
            behind = [m for m in behind if same_version(m.running_version_annotation, target)]
        sets_behind = [ms for ms in mine if not same_version(ms.version, target)]
        if released and sets_behind:
            return  # a MachineSet not on the released target is Cluster API's rollout
        if behind or sets_behind:
            unpaused = [ms for ms in mine if not ms.capi_paused]
            if unpaused:  # paused, and its template's version moved, in one write
                self.emit(*(PauseObject(ms.ref, target, template_version=ms in sets_behind)
                            for ms in unpaused))
                return
            if any(ms.paused_for is None for ms in mine):
                return  # a MachineSet paused by someone else: not ours to move
            if any(ms.paused_reported is False for ms in mine):
                # Not before Cluster API reports the pause: a MachineSet reconcile begun
                # before it still runs, and would force-apply the Machines' old version
                # after our writes (CAPI v1.12.1 did, 0.8 s after the pause). Its Paused
                # condition turns True in the first reconcile begun after the pause, and
                # controller-runtime runs one reconcile of an object at a time.
                return
            for m in behind:  # with its running-version record (completion_deferred)
                self.emit(PatchMachineVersion(m.ref, target, record_running=True))
            for ms in sets_behind:
                self.emit(PatchMachineSetVersion(ms.ref, target))
            return
        for ms in mine:
            if ms.paused_for is not None:
                self.emit(ReleasePause(ms.ref, target))
        release = release_pause(md, live, in_flight=in_flight, machine_sets=mine)
        if release is not None:
            self.emit(release)

    def _writer_conditions(self, ref: ObjectRef, status: RolloutStatus, step: VersionStep,
                           driver: OtherDriver | None, *, report: bool = True
                           ) -> tuple[Condition, ...]:
        """VERSION_WRITER (enrolled objects) and OTHER_DRIVER, with their Events (unless
        ``report`` is False: the status that records them is not written this pass)."""
        out: list[Condition] = []
        if step.writer is not None:
            w = Condition(C.VERSION_WRITER, *step.writer[:2], truncate(step.writer[2]))
            if report and w.status == "False" and \
                    not w.same_as(status.condition(C.VERSION_WRITER)):
                self.emit(ReportVersionConflict(ref, w.message))
            out.append(w)
        if driver is not None:
            d = Condition(C.OTHER_DRIVER, "True", driver.reason, truncate(driver.message))
            if report and not d.same_as(status.condition(C.OTHER_DRIVER)):
                self.emit(ReportOtherDriver(ref, driver.reason, d.message))
            out.append(d)
        elif step.writer is not None or status.condition(C.OTHER_DRIVER) is not None:
            out.append(Condition(C.OTHER_DRIVER, "False", C.R_NO_OTHER_DRIVER, ""))
        return tuple(out)

    # -- status ------------------------------------------------------------------------
    def _invalid_target(self, ref: ObjectRef, version: str | None, status: RolloutStatus,
                        total: int) -> None:
        message = f"target version {version!r} is not a k0s version"
        conds = (
            Condition(C.UP_TO_DATE, "False", C.R_INVALID_VERSION, message),
            Condition(C.PROGRESSING, "False", C.R_INVALID_VERSION, message),
            Condition(C.HALTED, "False", C.R_WITHIN_BUDGET, ""),
            Condition(C.IN_PLACE, "False", C.R_INVALID_VERSION, message),
        )
        counts = RolloutCounts(str(version or ""), 0, total, 0, 0, 0, 0, total, False)
        self._set_status(ref, status, conds, counts)
        if not conds[3].same_as(status.condition(C.IN_PLACE)):
            self.emit(ReportNotInPlace(ref, C.R_INVALID_VERSION, message))

    def _rollout_status(self, ref: ObjectRef, status: RolloutStatus, counts: RolloutCounts, *,
                        not_in_place: dict[str, Eligibility], failed: list[PlanView],
                        waiting: str, in_flight: Iterable[str],
                        budget_problem: tuple[str, str] | None,
                        extra: tuple[Condition, ...] = (),
                        unreachable: str | None = None, done_note: str = "",
                        adopting: bool = False) -> None:
        target, done = counts.target_version, counts.updated == counts.total
        waiting = unreachable or waiting
        summary = f"{counts.updated}/{counts.total} machines on {target}"
        if done:
            up = Condition(C.UP_TO_DATE, "True", C.R_UP_TO_DATE,
                           truncate(f"{summary} ({done_note})" if done_note else summary))
        elif counts.halted:
            up = Condition(C.UP_TO_DATE, "False", C.R_HALTED, summary)
        elif counts.in_flight:
            up = Condition(C.UP_TO_DATE, "False", C.R_UPGRADING, summary)
        else:
            up = Condition(C.UP_TO_DATE, "False", C.R_WAITING,
                           truncate(f"{summary}; {waiting}" if waiting else summary))
        names = sorted(set(in_flight))
        if names:
            prog = Condition(C.PROGRESSING, "True", C.R_NODES_UPGRADING,
                             truncate("upgrading " + ", ".join(names)
                                       + (f"; {waiting}" if waiting else "")))
        else:
            prog = Condition(C.PROGRESSING, "False", C.R_WAITING if waiting else C.R_IDLE,
                             truncate(waiting))
        if unreachable is not None:
            # Nothing is known of its nodes now: say so in both, whatever was last seen.
            prog = Condition(C.PROGRESSING, prog.status, C.R_CLUSTER_UNREACHABLE,
                             truncate(unreachable))
            if not done:
                up = Condition(C.UP_TO_DATE, "False", C.R_CLUSTER_UNREACHABLE,
                               truncate(f"{summary}; {unreachable}"))
        if counts.halted:
            failed_names = ", ".join(sorted(v.plan.ref.name for v in failed))
            halt_msg = truncate(
                f"{len(failed)} failed node upgrade(s) reached the failure budget of "
                f"{self.settings.halt_at_failures}: {failed_names}; annotate the object or the "
                f"NodePlans with {ANN_RETRY}=<anything> to retry, or delete the NodePlans")
            halt = Condition(C.HALTED, "True", C.R_HALTED, halt_msg)
        else:
            halt = Condition(C.HALTED, "False", C.R_WITHIN_BUDGET, "")
        if budget_problem is not None and not done:
            inplace = Condition(C.IN_PLACE, "False", budget_problem[0],
                                truncate(budget_problem[1]))
        elif not_in_place:
            text = "; ".join(f"{n}: {e.reason}" for n, e in sorted(not_in_place.items()))
            inplace = Condition(C.IN_PLACE, "False", C.R_NOT_IN_PLACE,
                                truncate(f"not in-place (left to Cluster API): {text}"))
        else:
            inplace = Condition(C.IN_PLACE, "True", C.R_IN_PLACE, "")
        conds = (up, prog, halt, inplace, *extra)
        if adopting:
            return  # written once the adoption landed (see _report)
        self._set_status(ref, status, conds, counts)
        if halt.status == "True" and not halt.same_as(status.condition(C.HALTED)):
            self.emit(HaltObject(ref, failed=len(failed), budget=self.settings.halt_at_failures,
                                 message=halt.message))
        if inplace.status == "False" and not inplace.same_as(status.condition(C.IN_PLACE)):
            self.emit(ReportNotInPlace(ref, inplace.reason, inplace.message))

    def _set_status(self, ref: ObjectRef, status: RolloutStatus, conds: tuple[Condition, ...],
                    counts: RolloutCounts) -> None:
        if any(v.recording for v in self.views_by_owner.get(
                (ref.namespace, ref.kind, ref.name), ())):
            # A node's completion is being recorded by this pass: its counts change again
            # once that lands (and the next node starts), a pass later; write them once.
            return
        same_conds = all(c.same_as(status.condition(c.type)) for c in conds)
        # status.k0sFleet only survives where the CRD keeps unknown status fields (Cluster
        # API's own CRDs prune it); then only a condition change is worth a write, and the
        # UpToDate message carries updated/total.
        if same_conds and (not status.counts or dict(status.counts) == counts.as_status()):
            return
        self.emit(SetRolloutStatus(ref, conds, counts))
