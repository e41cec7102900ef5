"""The node agent's state machine, driven by one watch on its own Node (or ControlNode).

Nothing is polled while idle: a Reflector watches exactly one object (field selector
``metadata.name=<node>``) and every change wakes the dispatcher, which classifies the
signal (:func:`fleet.agents.state.classify`) and starts, keeps or cancels the one worker.

The worker runs the step the recorded state names (the state is written *before* its
step runs, so a recorded state means "this step is in progress or about to be"), then
records the next state. "Recorded" means in the agent's own durable record of the
request (``<state-dir>/<request>.journal``, :class:`fleet.agents.state.Journal`); the
status on the object mirrors it and is never obeyed: one the agent did not write is
ignored and reported (:func:`fleet.agents.state.corroborate`). Every step is idempotent
and rediscovers its progress from the disk, which is what makes killing the agent at
any instant safe: the next agent resumes the recorded step. Every status write is a
merge patch with a resourceVersion precondition (``patch_with_retry``) whose mutation
re-reads the signal and declines unless it is still the same request with the status the
worker last saw; a replaced request is abandoned, never written to.

Only one agent acts per host: an exclusive lock in the state directory (the kernel
drops it when a holder dies, even by SIGKILL).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc
from opentelemetry import trace

from fleet.agents import drain, swap
from fleet.agents.download import DownloadPolicy, FinalDownloadError, ensure_staged
from fleet.agents.files import partial_path, unlink_quiet, write_durably
from fleet.agents.hostfault import HostFaults, describe, failure_state
from fleet.agents.restart import K0sProbe, Restarter, RestartError, read_marker, restart_once
from fleet.agents.settings import CRASH_ENV, AgentSettings
from fleet.agents.state import (
    Decision,
    Idle,
    Journal,
    Reject,
    RequestKey,
    Work,
    classify,
    cordon_patch,
    cordoned_by_agent,
    corroborate,
    first_status,
    holds_cordon,
    next_status,
    node_ready,
    policy_problem,
    rejection_value,
    request_id,
    same_status,
    uncordon_patch,
)
from fleet.agents.verify import wait_running
from fleet.contract.signal import (
    RUNNING_VERSION_KEY,
    SIGNAL_DATA_KEY,
    SIGNAL_REJECTED_KEY,
    DrainTimeoutAction,
    InvalidSignalError,
    SignalData,
    SignalState,
    SignalStatus,
    drain_outcomes,
    parse_signal,
    replace_status,
    utcnow,
)
from fleet.contract.tracecontext import K8S_NODE_NAME, DurableSpan, get_tracer
from fleet.kube import KubeClient, KubeError, KubeObject, patch_with_retry
from fleet.kube.backoff import Backoff
from fleet.kube.resources import CONTROL_NODES, NODES
from fleet.kube.watch import Reflector, WatchEvent

log = logging.getLogger(__name__)

# Test-only fault injection: CRASH_ENV holds a comma-separated list of crash points (e.g.
# "ApplyingUpdate:after"); reaching one kills the agent with SIGKILL. Unset in production.
MIN_STEP_SECONDS = 1.0
# Steps before the binary is replaced: the request is judged against the agent's policy
# again in each of them.
BEFORE_THE_SWAP = frozenset({SignalState.DOWNLOADING, SignalState.CORDONING,
                             SignalState.APPLYING_UPDATE})


def crash_point(name: str) -> None:
    spec = os.environ.get(CRASH_ENV)
    if spec and name in {p.strip() for p in spec.split(",")}:
        log.critical("crash point %s reached: SIGKILL", name)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)


NodeChange = Callable[[KubeObject], dict[str, Any] | None]


class RequestReplacedError(Exception):
    """The request this worker serves is no longer on the object."""


class StateMovedError(Exception):
    """Someone else changed this request's status; re-derive where we are."""


@dataclass
class _Worker:
    key: RequestKey
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)


class Agent:
    def __init__(self, settings: AgentSettings, client: KubeClient, *,
                 tracer: trace.Tracer | None = None) -> None:
        self.s = settings
        self.client = client
        self.res = NODES if settings.has_node else CONTROL_NODES
        self.name = settings.node_name
        self.binary = settings.k0s_binary
        self.probe = K0sProbe(settings)
        self.restarter = Restarter(settings)
        self.tracer = tracer or get_tracer("fleet.agents")
        self.policy = DownloadPolicy(
            attempts=settings.download_attempts,
            stall_timeout=settings.download_stall_timeout,
            overall_timeout=settings.download_timeout,
            backoff_initial=settings.download_backoff_initial,
            backoff_max=settings.download_backoff_max,
            max_bytes=settings.max_binary_bytes,
            free_space_margin=settings.free_space_margin_bytes,
            file_url_roots=settings.file_url_roots,
            url_prefixes=settings.allowed_url_prefixes,
        )
        self.ready = anyio.Event()
        self._latest: KubeObject | None = None
        self._changed = anyio.Event()
        self._worker: _Worker | None = None
        # requests this process drove to a terminal status (their cached object may lag)
        self._ended: set[RequestKey] = set()
        self._cleaned: set[RequestKey] = set()
        self._aux_backoff = Backoff(initial=0.5, maximum=30.0)
        # the request whose Cordoning write (by this process) also cordoned the node
        self._cordoned_with: RequestKey | None = None
        # the status on the object of the worker's request, as last read or written: what
        # the next write must still find there (the agent's own view is in the journal)
        self._seen: SignalStatus | None = None
        # statuses this agent did not write that it reported already (request, status)
        self._reported: set[tuple[RequestKey, str]] = set()
        self.foreign_statuses = 0  # how many it ignored and reported
        # the statuses this process wrote, for its last few requests
        self._wrote: dict[RequestKey, list[SignalStatus]] = {}

    # -- main loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            unlink_quiet(partial_path(self.binary))  # a download a killed agent left behind
        except OSError as e:  # a read-only binary directory: requests will say so
            log.warning("cannot remove a leftover download: %s", describe(e))
        self.s.state_dir.mkdir(parents=True, exist_ok=True)
        async with anyio.create_task_group() as tg:
            reflector = Reflector(self.client, self.res,
                                  field_selector=f"metadata.name={self.name}",
                                  listener=self._on_event)
            tg.start_soon(reflector.run)
            await reflector.synced.wait()
            log.info("watching %s %s", self.res.kind, self.name)
            self.ready.set()
            self._changed.set()
            while True:
                await self._changed.wait()
                self._changed = anyio.Event()
                await self._dispatch(tg)

    async def _on_event(self, event: WatchEvent) -> None:
        self._latest = None if event.type == "DELETED" else event.object
        self._changed.set()

    def _annotations(self, obj: KubeObject | None) -> dict[str, str]:
        return dict(((obj or {}).get("metadata") or {}).get("annotations") or {})

    async def _dispatch(self, tg: anyio.abc.TaskGroup) -> None:
        obj = self._latest
        decision = classify(self._annotations(obj)) if obj is not None else Idle("no object")
        decision = self._second_opinion(decision)
        worker = self._worker
        if isinstance(decision, Work):
            if worker is not None and worker.key == decision.key:
                return
            if decision.key in self._ended:
                # This process wrote that request's terminal status already: the cached
                # object predates that write (the watch lags). Driving it again would
                # repeat a step (a second download, a second restart); wait for the watch.
                return
            if worker is not None:
                log.info("request replaced; abandoning %s", worker.key[0])
                worker.scope.cancel()
            self._start_worker(tg, decision.signal, after=worker)
            return
        if worker is not None:
            finished_same = isinstance(decision, Idle) and decision.signal is not None \
                and decision.signal.request_key == worker.key
            if not finished_same:
                log.info("request %s withdrawn; stopping", worker.key[0])
                worker.scope.cancel()
            return  # housekeeping waits until the worker is gone (it re-dispatches)
        try:
            if isinstance(decision, Reject):
                await self._reject(decision)
            elif obj is not None:
                await self._housekeep(obj, decision)
            self._aux_backoff.reset()
        except Exception as e:
            delay = self._aux_backoff.next_delay()
            log.warning("%s; retrying in %.1fs", e, delay)
            tg.start_soon(self._poke_after, delay)

    def _second_opinion(self, decision: Decision) -> Decision:
        """The status on the object is data: weigh it against the agent's own record.

        A status that contradicts the record of a request the agent is driving (a forged
        ``Completed``, another step, another timestamp) makes it go on from its record
        (the worker writes that record back first); a status on a request it has no
        record of is ignored and reported, never resumed from."""
        sig = decision.signal if isinstance(decision, (Work, Idle)) else None
        if sig is None or (isinstance(decision, Idle) and sig.status is None):
            return decision
        if self._worker is not None and self._worker.key == sig.request_key:
            return decision  # the worker judges the status itself, before its next write
        if sig.request_key in self._ended:
            # Ended here (its record cleaned up): a stale copy of one of its own writes is
            # no news; anything else is reported. The dispatcher drives neither.
            if not any(same_status(sig.status, w) for w in self._wrote.get(sig.request_key, ())):
                self._report_foreign(sig, f"status {sig.status.status if sig.status else None}"
                                     " on a request this agent ended")
            return decision
        judged = corroborate(self._read_journal(sig.request_key), sig.status)
        if judged.foreign is None:
            return decision
        if judged.known:
            return Work(sig)
        self._report_foreign(sig, judged.foreign)
        return Idle(f"ignored: {judged.foreign}")

    def _report_foreign(self, sig: SignalData, why: str) -> None:
        """Log (once per request and status) and count a status this agent did not write."""
        status = sig.status.model_dump_json() if sig.status is not None else ""
        mark = (sig.request_key, status)
        if mark in self._reported:
            return
        if len(self._reported) > 64:
            self._reported.clear()
        self._reported.add(mark)
        self.foreign_statuses += 1
        log.warning("%s: ignoring a status this agent did not write: %s", sig.planId, why)
        trace.get_current_span().add_event("k0s_fleet.foreign_status", {
            "k0s_fleet.nodeplan": sig.planId, "k0s_fleet.reason": why})

    def _journal_path(self, key: RequestKey) -> Path:
        return self.s.state_dir / f"{request_id(key)}.journal"

    def _read_journal(self, key: RequestKey) -> Journal | None:
        try:
            data = self._journal_path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("cannot read the record of a request: %s", describe(e))
            return None
        return Journal.from_json(data)

    async def _write_journal(self, key: RequestKey, journal: Journal) -> None:
        await anyio.to_thread.run_sync(write_durably, self._journal_path(key),
                                       journal.to_json())

    async def _record(self, key: RequestKey, journal: Journal, status: SignalStatus) -> None:
        """Write the request's record; a host that refuses it (full, read-only) stops
        every step but the end: a terminal status needs no record to resume from, so
        it is written anyway (the record is dropped: one that still named an earlier
        step would be resumed from)."""
        try:
            await self._write_journal(key, journal)
        except OSError as e:
            if not status.status.terminal:
                raise
            log.warning("cannot record %s for the request: %s", status.status, describe(e))
            with contextlib.suppress(OSError):
                unlink_quiet(self._journal_path(key))

    async def _resume_point(self, seen: SignalData) -> SignalData | None:
        """The request as the agent's own record has it (None: not to be driven).

        ``seen`` is the request as on the object; its status is only what the next write
        must find there. A status that is not the agent's is reported; the agent's own
        record is written back over it before anything else happens."""
        self._seen = seen.status
        judged = corroborate(self._read_journal(seen.request_key), seen.status)
        if judged.foreign is not None:
            self._report_foreign(seen, judged.foreign)
            if not judged.known:
                return None
            if judged.own is not None:
                return await self._transition(seen.model_copy(update={"status": judged.own}),
                                              judged.own)
        elif not judged.act and judged.own is None:
            return None
        return seen.model_copy(update={"status": judged.own})

    async def _poke_after(self, delay: float) -> None:
        await anyio.sleep(delay)
        self._changed.set()

    def _start_worker(self, tg: anyio.abc.TaskGroup, sig: SignalData,
                      after: _Worker | None) -> None:
        worker = _Worker(sig.request_key)
        self._worker = worker
        tg.start_soon(self._run_worker, worker, sig, after)

    async def _run_worker(self, worker: _Worker, sig: SignalData, after: _Worker | None) -> None:
        try:
            if after is not None:
                await after.done.wait()  # never two workers on the same disk
            with worker.scope:
                await self._drive(sig)
        finally:
            worker.done.set()
            if self._worker is worker:
                self._worker = None
            self._changed.set()

    # -- the walk ----------------------------------------------------------------------------
    async def _drive(self, sig: SignalData) -> None:
        backoff = Backoff(initial=0.5, maximum=30.0)
        faults = HostFaults()
        resolved = False  # sig's status is the agent's own (else: as read from the object)
        while True:
            try:
                if not resolved:
                    own = await self._resume_point(sig)
                    if own is None:
                        return
                    sig, resolved = own, True
                sig = await self._step(sig)
                backoff.reset()
                faults.reset()
                if sig.status is not None and sig.status.status.terminal:
                    self._ended.add(sig.request_key)
                    crash_point(f"{sig.status.status}:after")
                    await self._cleanup_request(sig, ended_here=True)
                    return
            except RequestReplacedError:
                log.info("request %s is no longer on %s; abandoned", sig.planId, self.name)
                return
            except StateMovedError:
                fresh = await self.client.get(self.res, self.name)
                self._latest = fresh
                try:
                    moved = parse_signal(self._annotations(fresh))
                except InvalidSignalError:
                    return
                if moved is None or not moved.same_request(sig):
                    return
                log.info("status of %s changed under us (now %s); judging it against "
                         "this agent's record", sig.planId,
                         moved.status.status if moved.status else None)
                sig, resolved = moved, False
            except OSError as e:  # the host's filesystem: read-only, full, vanished
                state = sig.status.status if sig.status else None
                if faults.give_up(state, e):
                    sig = await self._host_fault(sig, e)
                    continue
                delay = backoff.next_delay()
                log.warning("step %s of %s: host fault %s; retrying in %.1fs",
                            state or "start", sig.planId, describe(e), delay)
                await anyio.sleep(delay)
            except KubeError as e:  # the API server is unreachable, throttling, ...
                delay = backoff.next_delay()
                log.warning("step %s of %s: %s; retrying in %.1fs",
                            sig.status.status if sig.status else "start", sig.planId, e, delay)
                await anyio.sleep(delay)
            except Exception:  # a bug or an unforeseen local failure: never a crash loop
                delay = backoff.next_delay()
                log.exception("step %s of %s failed; retrying in %.1fs",
                              sig.status.status if sig.status else "start", sig.planId, delay)
                await anyio.sleep(delay)

    async def _host_fault(self, sig: SignalData, e: OSError) -> SignalData:
        """End the request in the failure state for where it is, naming path and errno.

        The installed binary is intact: an apply either replaced it atomically or not at
        all; from Restarting on (the new binary may be in place, k0s not yet restarted
        onto it) the previous binary is put back first. The cordon is undone by
        housekeeping once the failure is recorded."""
        state = sig.status.status if sig.status else None
        why = f"host fault in {state or 'Start'}: {describe(e)}"
        log.error("%s: %s", sig.planId, why)
        if state is SignalState.RESTARTING:
            try:
                restored = await anyio.to_thread.run_sync(swap.restore, self.binary)
                why += "; previous binary restored" if restored else "; no rollback copy"
            except swap.ApplyError as again:
                why += f"; restoring the previous binary failed too: {again}"
        if sig.status is None:  # not even Downloading recorded: record the start first
            # (unless the host cannot even record that: then the failure alone)
            with contextlib.suppress(OSError):
                sig = await self._transition(sig, first_status(sig.command.k0supdate, None,
                                                               utcnow()))
        if sig.status is None:
            return await self._transition(sig, SignalStatus(
                status=failure_state(state), timestamp=utcnow(), reason=why))
        return await self._transition(sig, self._status(sig, failure_state(state),
                                                        reason=why))

    async def _step(self, sig: SignalData) -> SignalData:
        state = sig.status.status if sig.status is not None else None
        handlers: dict[SignalState | None, Callable[[SignalData, trace.Span], Any]] = {
            None: self._start,
            SignalState.DOWNLOADING: self._download,
            SignalState.CORDONING: self._cordon_and_drain,
            SignalState.APPLYING_UPDATE: self._apply,
            SignalState.RESTARTING: self._restart,
            SignalState.VERIFYING: self._verify,
            SignalState.UNCORDONING: self._uncordon,
        }
        handler = handlers.get(state)
        if handler is None:  # terminal: nothing to do
            return sig
        if state is None:
            await self._begin_upgrade_trace(sig)
        with self._span(str(state) if state else "Start", sig) as span:
            if state is not None:
                crash_point(f"{state}:before")
            if state in BEFORE_THE_SWAP:
                # The request's URL and digest are judged again at every step before the
                # binary is replaced: whatever the status says, nothing this agent's policy
                # refuses is downloaded or installed.
                problem = self._policy_problem(sig)
                if problem:
                    log.warning("refusing request %s in %s: %s", sig.planId, state, problem)
                    return await self._transition(sig, self._status(
                        sig, failure_state(state), reason=f"refused in {state}: {problem}"))
            result: SignalData = await handler(sig, span)
            return result

    def _policy_problem(self, sig: SignalData) -> str | None:
        return policy_problem(sig.command.k0supdate, allow_unverified=self.s.allow_unverified,
                              file_url_roots=tuple(str(r) for r in self.s.file_url_roots),
                              url_prefixes=self.s.allowed_url_prefixes)

    def _upgrade(self, sig: SignalData) -> DurableSpan:
        """The request's upgrade span: a child of the controller's dispatch span (the
        request's traceparent), with an id every agent process derives alike."""
        return DurableSpan.derive(self._rid(sig), sig.traceparent)

    @contextlib.contextmanager
    def _span(self, step: str, sig: SignalData) -> Iterator[trace.Span]:
        attrs = {K8S_NODE_NAME: self.name,
                 "k0s_fleet.node": self.name, "k0s_fleet.version": sig.command.k0supdate.version,
                 "k0s_fleet.nodeplan": sig.planId, "k0s_fleet.step": step}
        t0 = time.monotonic()
        with self.tracer.start_as_current_span(
                f"agent.{step}", context=self._upgrade(sig).child_context(),
                attributes=attrs) as span:
            try:
                yield span
            finally:
                seconds = time.monotonic() - t0
                span.set_attribute("k0s_fleet.step.seconds", seconds)
                log.info("step %s of %s took %.3fs", step, sig.planId, seconds)

    def _trace_marker(self, sig: SignalData) -> Path:
        return self._marker(sig, "trace")

    async def _begin_upgrade_trace(self, sig: SignalData) -> None:
        """Remember when this node's upgrade began (the upgrade span's start)."""
        marker = self._trace_marker(sig)
        if not marker.exists():
            await anyio.to_thread.run_sync(write_durably, marker, json.dumps(
                {"start_unix_nano": time.time_ns()}).encode())

    def _end_upgrade_trace(self, sig: SignalData, *, ended_here: bool) -> None:
        """Record the upgrade span, once, when the request has ended: from the start this
        agent noted (else the request's creation) to now when this process just wrote the
        terminal status (its last step span has ended), else to that status's time."""
        marker = self._trace_marker(sig)
        try:
            start = int(json.loads(marker.read_bytes())["start_unix_nano"])
        except FileNotFoundError:
            return  # recorded already, or never begun here
        except (OSError, ValueError, KeyError, TypeError):
            start = int(sig.created.timestamp() * 1e9)
        status = sig.status
        end = time.time_ns() if ended_here or status is None \
            else int(status.timestamp.timestamp() * 1e9)
        cmd = sig.command.k0supdate
        attrs: dict[str, str | bool] = {
            K8S_NODE_NAME: self.name,
            "k0s_fleet.node": self.name, "k0s_fleet.nodeplan": sig.planId,
            "k0s_fleet.version": cmd.version, "k0s_fleet.executor": "agent",
            "k0s_fleet.signal_object": str(self.s.signal_object),
            "k0s_fleet.outcome": str(status.status) if status is not None else "",
        }
        if status is not None and status.previousversion:
            attrs["k0s_fleet.previous_version"] = status.previousversion
        span = self._upgrade(sig).start(self.tracer, "agent.upgrade",
                                        start_time=min(start, end), attributes=attrs)
        if status is not None and status.status is not SignalState.COMPLETED:
            span.set_attribute("k0s_fleet.failure_reason", status.reason)
            span.set_status(trace.Status(trace.StatusCode.ERROR,
                                         f"{status.status}: {status.reason}"))
        span.end(end_time=max(start, end))
        unlink_quiet(marker)

    async def _transition(self, sig: SignalData, status: SignalStatus,
                          extra: dict[str, str | None] | None = None, *,
                          node_change: NodeChange | None = None) -> SignalData:
        """Record ``status`` for exactly this request, in exactly the state we last saw.

        ``node_change`` (cordon, uncordon) goes into the same write, judged on the same
        object: one request where there were two, and no instant where the node shows
        one without the other.

        The agent's own record of the request (its journal) names ``status`` as pending
        before the write and as current once a terminal write landed; what the write
        compares against is the status last seen on the object (``self._seen``)."""
        seen = self._seen
        moved = False

        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            nonlocal moved
            ann = self._annotations(obj)
            raw = ann.get(SIGNAL_DATA_KEY)
            try:
                current = parse_signal(ann)
            except InvalidSignalError:
                return None
            if raw is None or current is None or not current.same_request(sig):
                return None
            moved = not same_status(current.status, seen)
            if moved:
                return None
            patch: dict[str, Any] = {"metadata": {"annotations": {
                SIGNAL_DATA_KEY: replace_status(raw, status), **(extra or {})}}}
            change = node_change(obj) if node_change is not None else None
            if change:
                patch["metadata"]["annotations"].update(
                    (change.get("metadata") or {}).get("annotations") or {})
                if "spec" in change:
                    patch["spec"] = change["spec"]
            return patch

        key = sig.request_key
        await self._record(key, Journal(current=sig.status, pending=status), status)
        # The watch cache saves a GET when it is current; when it is behind (it has not
        # delivered our own last write yet, say), judge again on a fresh read.
        obj = await patch_with_retry(self.client, self.res, self.name, mutate,
                                     current=self._latest)
        if obj is None and moved:
            obj = await patch_with_retry(self.client, self.res, self.name, mutate)
        if obj is None:
            if moved:
                raise StateMovedError()
            raise RequestReplacedError()
        self._seen = status
        if key not in self._wrote and len(self._wrote) >= 8:
            del self._wrote[next(iter(self._wrote))]
        self._wrote.setdefault(key, []).append(status)
        if status.status.terminal:  # an ended request stays ended, whatever is written later
            await self._record(key, Journal(current=status), status)
        log.info("%s: %s -> %s%s", sig.planId, seen.status if seen else "(new)", status.status,
                 f" ({status.reason})" if status.reason else "")
        if status.status.terminal and status.status is not SignalState.COMPLETED:
            span = trace.get_current_span()
            span.set_attribute("k0s_fleet.failure_reason", status.reason)
            span.set_status(trace.Status(trace.StatusCode.ERROR,
                                         f"{status.status}: {status.reason}"))
        return sig.with_status(status)

    def _status(self, sig: SignalData, state: SignalState, *, reason: str = "",
                **changes: Any) -> SignalStatus:
        assert sig.status is not None
        return next_status(sig.status, state, utcnow(), reason=reason, **changes)

    def _remaining(self, sig: SignalData, timeout: float) -> float:
        """What is left of a step's timeout that started when its state was recorded."""
        assert sig.status is not None
        elapsed = (utcnow() - sig.status.timestamp).total_seconds()
        return max(timeout - max(elapsed, 0.0), min(MIN_STEP_SECONDS, timeout))

    def _rid(self, sig: SignalData) -> str:
        return request_id(sig.request_key)

    def _marker(self, sig: SignalData, kind: str) -> Path:
        return self.s.state_dir / f"{self._rid(sig)}.{kind}"

    def _node_ready_check(self) -> Callable[[], bool] | None:
        if not (self.s.has_node and self.s.require_node_ready):
            return None
        return lambda: node_ready(self._latest)

    # -- steps -------------------------------------------------------------------------------
    async def _start(self, sig: SignalData, span: trace.Span) -> SignalData:
        cmd = sig.command.k0supdate
        problem = self._policy_problem(sig)
        if problem:
            log.warning("refusing request %s: %s", sig.planId, problem)
            return await self._transition(sig, SignalStatus(
                status=SignalState.INVALID_REQUEST, timestamp=utcnow(), reason=problem))
        running = await self.probe.current_version()
        # A request starts from a clean slate: no other request's rollback copy or markers.
        await anyio.to_thread.run_sync(swap.discard_rollback, self.binary)
        self._clear_markers(keep=self._rid(sig))
        status = first_status(cmd, running, utcnow())
        span.set_attribute("k0s_fleet.previous_version", running or "")
        extra: dict[str, str | None] | None = {RUNNING_VERSION_KEY: running} if running else None
        return await self._transition(sig, status, extra)

    async def _download(self, sig: SignalData, span: trace.Span) -> SignalData:
        cmd = sig.command.k0supdate
        try:
            result = await ensure_staged(cmd.url, cmd.sha256, self.binary, self.policy)
        except FinalDownloadError as e:
            return await self._transition(
                sig, self._status(sig, SignalState.FAILED_DOWNLOAD, reason=str(e)))
        span.set_attributes({"k0s_fleet.download.bytes": result.bytes,
                             "k0s_fleet.download.attempts": result.attempts,
                             "k0s_fleet.download.reused": result.reused})
        crash_point("Downloading:after")
        what = "reused the staged binary" if result.reused else \
            f"downloaded {result.bytes} bytes in {result.seconds:.2f}s"
        # Entering Cordoning cordons in the same write (a resumed request, whose write
        # may predate that, is cordoned by the step itself).
        owner = f"k0s-fleet-agent:{sig.planId}"
        new = await self._transition(sig, self._status(
            sig, SignalState.CORDONING, reason=what, sha256=result.sha256),
            node_change=(lambda obj: cordon_patch(obj, owner)) if self.s.has_node else None)
        self._cordoned_with = new.request_key
        return new

    async def _cordon_and_drain(self, sig: SignalData, span: trace.Span) -> SignalData:
        reason = ""
        outcomes: tuple[str, ...] | None = None
        if not self.s.has_node:
            reason = "no Node (pure controller): nothing to cordon or drain"
        else:
            if self._cordoned_with != sig.request_key:
                await drain.cordon(self.client, self.name, f"k0s-fleet-agent:{sig.planId}",
                                   current=self._latest)
            if self.s.drain:
                pol = self.s.policy_for(sig.command.k0supdate.policy)
                result = await drain.drain(self.client, self.name,
                                           timeout=self._remaining(sig, pol.drain_timeout),
                                           force=pol.force,
                                           delete_emptydir_data=pol.delete_empty_dir_data,
                                           skip_pods=pol.skip_pods,
                                           rules=pol.drain_rules)
                span.set_attributes({"k0s_fleet.drain.evicted": len(result.evicted),
                                     "k0s_fleet.drain.timed_out": result.timed_out,
                                     "k0s_fleet.drain.refused": len(result.refused)})
                outcomes = drain_outcomes(result.outcomes())
                if result.refused:
                    # as kubectl drain: nothing more is evicted; the cordon is undone by
                    # housekeeping once the failure is recorded
                    return await self._transition(
                        sig, self._status(sig, SignalState.FAILED_DRAIN,
                                          reason=result.refusal(), drain=outcomes))
                if result.timed_out:
                    msg = f"drain did not finish within {pol.drain_timeout:g}s: " \
                          f"{result.summary()}"
                    if pol.drain_timeout_action is DrainTimeoutAction.FAIL:
                        # the cordon is undone by housekeeping once the failure is recorded
                        return await self._transition(
                            sig, self._status(sig, SignalState.FAILED_DRAIN, reason=msg,
                                              drain=outcomes))
                    reason = f"{msg}; proceeding (drain timeout outcome: proceed)"
                else:
                    reason = f"drained: {result.summary()}"
            else:
                reason = "cordoned (drain disabled)"
        crash_point("Cordoning:after")
        return await self._transition(sig, self._status(sig, SignalState.APPLYING_UPDATE,
                                                        reason=reason, drain=outcomes))

    async def _apply(self, sig: SignalData, span: trace.Span) -> SignalData:
        cmd = sig.command.k0supdate
        assert sig.status is not None
        # The request's digest; only a request that allowed an unverified download uses
        # the one this agent computed while downloading (its own record, not the object's).
        expected = cmd.sha256 or sig.status.sha256
        if expected is None:
            return await self._transition(sig, self._status(
                sig, SignalState.FAILED_APPLY, reason="no digest recorded for the staged binary"))
        try:
            with anyio.CancelScope(shield=True):
                try:
                    result = await anyio.to_thread.run_sync(swap.apply, self.binary, expected)
                except swap.StagedMissingError:
                    log.warning("staged binary missing; downloading it again")
                    await ensure_staged(cmd.url, expected, self.binary, self.policy)
                    result = await anyio.to_thread.run_sync(swap.apply, self.binary, expected)
        except FinalDownloadError as e:
            return await self._transition(
                sig, self._status(sig, SignalState.FAILED_DOWNLOAD, reason=str(e)))
        except swap.ApplyError as e:
            return await self._transition(
                sig, self._status(sig, SignalState.FAILED_APPLY, reason=str(e)))
        span.set_attribute("k0s_fleet.apply.action", str(result.action))
        crash_point("ApplyingUpdate:after")  # renamed, status not yet written: k0s issue 7703
        new = await self._transition(sig, self._status(
            sig, SignalState.RESTARTING, reason=f"binary {result.action}"))
        # only now that the write landed may the staged file go
        await anyio.to_thread.run_sync(swap.discard_staged, self.binary)
        return new

    async def _restart(self, sig: SignalData, span: trace.Span) -> SignalData:
        await anyio.to_thread.run_sync(swap.discard_staged, self.binary)
        try:
            with anyio.CancelScope(shield=True):
                outcome = await restart_once(
                    self._marker(sig, "restart"), self._rid(sig), self.probe, self.restarter,
                    grace=self.s.restart_grace,
                    crash_point=lambda p: crash_point(f"Restarting:{p}"))
        except RestartError as e:
            return await self._rollback(sig, f"restart failed: {e}")
        span.set_attributes({"k0s_fleet.restart.issued": outcome.issued,
                             "k0s_fleet.restart.detail": outcome.detail})
        crash_point("Restarting:after")
        return await self._transition(sig, self._status(
            sig, SignalState.VERIFYING, reason=outcome.detail, restarted=True))

    async def _verify(self, sig: SignalData, span: trace.Span) -> SignalData:
        rollback = self._marker(sig, "rollback")
        if rollback.exists():
            return await self._rollback(sig, None)
        cmd = sig.command.k0supdate
        restart = read_marker(self._marker(sig, "restart"))
        result = await wait_running(
            self.probe, cmd.version,
            timeout=self._remaining(sig, self.s.policy_for(cmd.policy).verify_timeout),
            node_ready=self._node_ready_check(),
            replaced_pid=restart.pid if restart is not None else None)
        span.set_attribute("k0s_fleet.verify.ok", result.ok)
        if not result.ok:
            return await self._rollback(sig, f"{cmd.version} {result.reason}")
        crash_point("Verifying:after")
        return await self._transition(sig, self._status(
            sig, SignalState.UNCORDONING, reason=result.reason))

    async def _uncordon(self, sig: SignalData, span: trace.Span) -> SignalData:
        # The uncordon and Completed are one write: the node is schedulable again exactly
        # when it says it is done (our cordon only: uncordon_patch leaves others' alone).
        crash_point("UnCordoning:after")
        version = sig.command.k0supdate.version
        return await self._transition(
            sig, self._status(sig, SignalState.COMPLETED, reason=f"running {version}"),
            {RUNNING_VERSION_KEY: version},
            node_change=uncordon_patch if self.s.has_node else None)

    async def _rollback(self, sig: SignalData, why: str | None) -> SignalData:
        """Put the previous binary back, restart once more, and report how that went."""
        marker = self._marker(sig, "rollback")
        if why is not None and not marker.exists():
            log.warning("rolling back %s: %s", sig.planId, why)
            await anyio.to_thread.run_sync(write_durably, marker,
                                           json.dumps({"reason": why}).encode())
            sig = await self._transition(sig, self._status(
                sig, SignalState.VERIFYING, reason=f"rolling back: {why}", restarted=True))
        else:
            try:
                why = str(json.loads(marker.read_bytes())["reason"])
            except (OSError, ValueError, KeyError, TypeError):
                why = why or "verification failed"
        crash_point("rollback:marked")
        assert sig.status is not None
        previous = sig.status.previousversion
        with self._span("RollingBack", sig) as span:
            span.set_attribute("k0s_fleet.rollback.reason", why)
            try:
                with anyio.CancelScope(shield=True):
                    restored = await anyio.to_thread.run_sync(swap.restore, self.binary)
                    if not restored:
                        return await self._transition(sig, self._status(
                            sig, SignalState.FAILED_VERIFY,
                            reason=f"{why}; no rollback copy to restore"))
                    outcome = await restart_once(
                        self._marker(sig, "rollback-restart"), self._rid(sig), self.probe,
                        self.restarter, grace=self.s.restart_grace,
                        crash_point=lambda p: crash_point(f"rollback-restart:{p}"))
                crash_point("rollback:restarted")
            except (swap.ApplyError, RestartError) as e:
                return await self._transition(sig, self._status(
                    sig, SignalState.FAILED_VERIFY, reason=f"{why}; rollback failed: {e}"))
            result = await wait_running(
                self.probe, previous, timeout=self.s.rollback_timeout,
                node_ready=self._node_ready_check(), replaced_pid=outcome.marker.pid)
            back_to = previous or "the previous binary"
            if result.ok:
                return await self._transition(
                    sig, self._status(sig, SignalState.ROLLED_BACK,
                                      reason=f"{why}; rolled back to {back_to}"),
                    {RUNNING_VERSION_KEY: result.version} if result.version else None)
            return await self._transition(sig, self._status(
                sig, SignalState.FAILED_VERIFY,
                reason=f"{why}; rollback to {back_to} did not recover: {result.reason}"))

    # -- outside a request -------------------------------------------------------------------
    async def _reject(self, rej: Reject) -> None:
        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            if self._annotations(obj).get(SIGNAL_DATA_KEY) != rej.raw:
                return None
            return {"metadata": {"annotations": {
                SIGNAL_REJECTED_KEY: rejection_value(rej, utcnow())}}}

        if await patch_with_retry(self.client, self.res, self.name, mutate,
                                  current=self._latest) is not None:
            log.warning("rejected the signal on %s: %s", self.name, rej.reason)

    async def _housekeep(self, obj: KubeObject, decision: Idle) -> None:
        sig = decision.signal
        state = sig.status.status if sig is not None and sig.status is not None else None
        if (self.s.has_node and cordoned_by_agent(obj) and not holds_cordon(state)
                and await drain.uncordon(self.client, self.name, current=obj)):
            log.info("uncordoned %s (%s)", self.name, state or decision.why)
        if sig is not None and sig.request_key not in self._cleaned:
            await self._cleanup_request(sig)

    async def _cleanup_request(self, sig: SignalData, *, ended_here: bool = False) -> None:
        """Files a finished request leaves behind (idempotent, best effort: a host that
        cannot even delete them - read-only, vanished - must not undo the outcome);
        records its upgrade span."""
        state = sig.status.status if sig.status is not None else None
        self._end_upgrade_trace(sig, ended_here=ended_here)
        try:
            await anyio.to_thread.run_sync(swap.discard_staged, self.binary)
            if state is not SignalState.FAILED_VERIFY:
                # a node that failed even its rollback keeps the copy for a human
                await anyio.to_thread.run_sync(swap.discard_rollback, self.binary)
                self._clear_markers(keep=None)
        except OSError as e:
            log.warning("%s: cannot clean up after the request: %s", sig.planId, describe(e))
        self._cleaned.add(sig.request_key)

    def _clear_markers(self, keep: str | None) -> None:
        for path in self.s.state_dir.glob("*.*"):
            if path.name == LOCK_NAME or (keep is not None and path.name.startswith(keep)):
                continue
            unlink_quiet(path)


# -- process entry -------------------------------------------------------------------------------
LOCK_NAME = "agent.lock"


def _open_lock(state_dir: Path) -> IO[bytes]:
    state_dir.mkdir(parents=True, exist_ok=True)
    return open(state_dir / LOCK_NAME, "ab")  # held for the process lifetime


async def hold_host_lock(state_dir: Path) -> IO[bytes]:
    """Exclusive lock: one acting agent per host (a DaemonSet update may overlap two)."""
    fh = _open_lock(state_dir)
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.warning("another agent holds %s; waiting for it", state_dir / LOCK_NAME)
        await anyio.to_thread.run_sync(fcntl.flock, fh.fileno(), fcntl.LOCK_EX,
                                       abandon_on_cancel=True)
    return fh


async def serve(settings: AgentSettings, tracer: trace.Tracer | None = None) -> None:
    """Run the agent until SIGTERM/SIGINT."""
    lock = await hold_host_lock(settings.state_dir)
    try:
        if settings.kubeconfig is not None:
            client = await KubeClient.from_kubeconfig_file(
                str(settings.kubeconfig), name=settings.node_name, transport="light")
        else:
            client = KubeClient.in_cluster(name=settings.node_name, transport="light")
        async with client, anyio.create_task_group() as tg:
            tg.start_soon(_stop_on_signal, tg.cancel_scope)
            await Agent(settings, client, tracer=tracer).run()
    finally:
        lock.close()


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("%s: stopping", signal.Signals(signum).name)
            scope.cancel()
            return
