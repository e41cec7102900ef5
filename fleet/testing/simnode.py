"""A simulated k0s node: a Node object, a fake k0s under a supervisor, a real agent process.

- ``root/bin/k0s``: a fake k0s release (see :mod:`fleet.testing.releases`).
- A supervisor that runs ``k0s worker`` like systemd with ``Restart=always``: it starts
  the *current* file at that path, counts starts, restarts the service whenever it
  exits, and owns the Node's Ready condition (True once the status socket answers,
  False when the process exits).
- A minimal kubelet stand-in: pods bound to the node that are being deleted (evicted)
  are removed, as a kubelet would after stopping their containers.
- The agent as a real subprocess (``python -m fleet.cli agent ...``) pointed at the
  directory and at the workload API server.
- A watch recording every state the node's signal passes through (``history``).

Use ``async with SimNode.running(...) as node``. Used by tests, the demo and benches.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc
import yaml

from fleet.contract.signal import (
    SIGNAL_DATA_KEY,
    SIGNAL_REJECTED_KEY,
    SIGNAL_VERSION,
    SIGNAL_VERSION_KEY,
    InvalidSignalError,
    NodePolicy,
    SignalData,
    SignalState,
    parse_signal,
)
from fleet.kube import KubeClient, KubeObject
from fleet.kube.errors import KubeError, NotFoundError
from fleet.kube.resources import CONTROL_NODES, NODES, PODS, Resource
from fleet.kube.watch import Reflector, WatchEvent
from fleet.testing.binaries import REPO_ROOT
from fleet.testing.providers import PRESSURE_CONDITIONS, kubelet_version
from fleet.testing.releases import Release
from fleet.world.executors import AGENT, Request

CRASH_ENV = "K0S_FLEET_AGENT_CRASH_AT"


@dataclass(frozen=True)
class Transition:
    plan_id: str
    state: str
    reason: str
    at: datetime  # the status timestamp the agent wrote


@dataclass
class SimNode:
    name: str
    root: Path
    client: KubeClient
    kubeconfig: dict[str, Any]
    signal_object: str = "node"
    agent_args: list[str] = field(default_factory=list)
    restart_delay: float = 0.1
    # download URLs the agent accepts: by default the release server of the initial release
    url_prefixes: list[str] = field(default_factory=list)
    # extra environment of the agent process (e.g. OTEL_* settings)
    agent_env: dict[str, str] = field(default_factory=dict)
    # the checkout whose fleet package the agent runs (benchmarks compare revisions)
    agent_repo: Path = REPO_ROOT
    provider_id: str | None = None  # spec.providerID, for a Node Cluster API links

    starts: int = 0
    history: list[Transition] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)
    latest: KubeObject | None = None
    agent: anyio.abc.Process | None = None
    agent_runs: int = 0
    service: anyio.abc.Process | None = None
    _changed: anyio.Event = field(default_factory=anyio.Event)
    _stopping: bool = False
    _agent_log: IO[bytes] | None = None

    # -- layout ------------------------------------------------------------------------------
    @property
    def binary(self) -> Path:
        return self.root / "bin" / "k0s"

    @property
    def socket(self) -> Path:
        return self.root / "run" / "status.sock"

    @property
    def pid_file(self) -> Path:
        return self.root / "run" / "k0s.pid"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def agent_log(self) -> Path:
        return self.root / "agent.log"

    @property
    def res(self) -> Resource:
        return NODES if self.signal_object == "node" else CONTROL_NODES

    @property
    def restarts(self) -> int:
        """Service starts after the first one."""
        return max(self.starts - 1, 0)

    # -- lifecycle ---------------------------------------------------------------------------
    @classmethod
    @asynccontextmanager
    async def running(cls, client: KubeClient, kubeconfig: dict[str, Any], root: Path,
                      initial: Release, *, name: str | None = None,
                      signal_object: str = "node", agent_args: Sequence[str] = (),
                      start_agent: bool = True, crash_at: str | None = None,
                      labels: dict[str, str] | None = None,
                      agent_env: dict[str, str] | None = None,
                      provider_id: str | None = None) -> AsyncIterator[SimNode]:
        node = cls(name=name or f"sim-{uuid.uuid4().hex[:8]}", root=root, client=client,
                   kubeconfig=kubeconfig, signal_object=signal_object,
                   agent_args=list(agent_args), agent_env=dict(agent_env or {}),
                   provider_id=provider_id)
        node.url_prefixes = [initial.url.rsplit("/", 1)[0] + "/"] \
            if initial.url.startswith("http") else []
        node._prepare(initial)
        await node._create_object(labels or {})
        async with anyio.create_task_group() as tg:
            tg.start_soon(node._supervise)
            await tg.start(node._record)
            if signal_object == "node":
                await tg.start(node._kubelet)
            try:
                await node.wait_ready()
                if start_agent:
                    await node.start_agent(crash_at=crash_at)
                yield node
            finally:
                with anyio.CancelScope(shield=True):
                    await node.stop_agent()
                    node._stopping = True
                    await node._stop_service()
                tg.cancel_scope.cancel()

    def _prepare(self, initial: Release) -> None:
        for d in ("bin", "run", "state"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.binary.write_bytes(initial.body)
        self.binary.chmod(0o755)
        kc = self.root / "kubeconfig.yaml"
        kc.write_text(yaml.safe_dump(self.kubeconfig))

    async def _create_object(self, labels: dict[str, str]) -> None:
        body: KubeObject = {"metadata": {"name": self.name, "labels": {
            "k0s-fleet.test/simnode": "true", **labels}}}
        body["spec"] = {"providerID": self.provider_id} if self.provider_id else {}
        await self.client.create(self.res, body)

    async def delete_object(self) -> None:
        with contextlib.suppress(NotFoundError):
            await self.client.delete(self.res, self.name)

    # -- the k0s service and its supervisor --------------------------------------------------
    async def _supervise(self) -> None:
        while not self._stopping:
            self.starts += 1
            logf = open(self.root / "k0s.log", "ab")  # noqa: SIM115, ASYNC230
            try:
                proc = await anyio.open_process(
                    [str(self.binary), "worker", "--status-socket", str(self.socket),
                     "--pid-file", str(self.pid_file)],
                    stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
            finally:
                logf.close()
            self.service = proc
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._mark_ready_when_up, proc)
                await proc.wait()
                tg.cancel_scope.cancel()
            self.service = None
            if self._stopping:
                return
            # Bounded: an API server that stalls must not hold the service down.
            with anyio.move_on_after(5, shield=True), contextlib.suppress(KubeError):
                await self.set_ready(False, "k0s exited")
            await anyio.sleep(self.restart_delay)

    async def _mark_ready_when_up(self, proc: anyio.abc.Process) -> None:
        while proc.returncode is None:
            if await self._status() is not None:
                # Until it lands, as a kubelet keeps posting its status: an API server
                # that is down now must not leave the Node NotReady for good.
                try:
                    await self.set_ready(True, "k0s is running")
                    break
                except KubeError:
                    await anyio.sleep(0.5)
                    continue
            await anyio.sleep(0.05)

    async def _status(self) -> dict[str, Any] | None:
        import aiohttp  # noqa: PLC0415

        try:
            conn = aiohttp.UnixConnector(path=str(self.socket))
            async with aiohttp.ClientSession(connector=conn,
                                             timeout=aiohttp.ClientTimeout(total=2)) as s, \
                    s.get("http://localhost/status") as resp:
                data: Any = json.loads(await resp.read())
                return data if isinstance(data, dict) else None
        except (aiohttp.ClientError, OSError, ValueError, TimeoutError):
            return None

    async def running_version(self) -> str | None:
        st = await self._status()
        return str(st["Version"]) if st and "Version" in st else None

    async def set_ready(self, ready: bool, message: str) -> None:
        """The Node's Ready condition; when the service is up, also the kubelet version it
        reports, as a k0s kubelet does (``v1.31.3+k0s`` for k0s ``v1.31.3+k0s.0``)."""
        if self.signal_object != "node":
            return
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        # The whole list (a merge patch replaces it): Ready, and the pressure conditions
        # a kubelet reports, which Cluster API's NodeHealthy needs.
        status: dict[str, Any] = {"conditions": [{
            "type": "Ready", "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady", "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": now}] + [{
                "type": t, "status": "False", "reason": f"KubeletHasNo{t}", "message": "",
                "lastHeartbeatTime": now, "lastTransitionTime": now}
                for t in PRESSURE_CONDITIONS]}
        running = await self.running_version() if ready else None
        if running:
            status["nodeInfo"] = {"kubeletVersion": kubelet_version(running)}
        await self.client.patch(NODES, self.name, {"status": status}, subresource="status")

    async def wait_ready(self, timeout: float = 20.0) -> None:
        with anyio.fail_after(timeout):
            while await self._status() is None:
                await anyio.sleep(0.05)

    async def _stop_service(self) -> None:
        proc = self.service
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with anyio.move_on_after(5):
                await proc.wait()

    # -- a kubelet stand-in: finish pod deletions -----------------------------------------
    async def _kubelet(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                       ) -> None:
        async def on_pod(ev: WatchEvent) -> None:
            meta = ev.object.get("metadata") or {}
            if ev.type != "DELETED" and meta.get("deletionTimestamp"):
                with contextlib.suppress(KubeError):
                    await self.client.request(
                        "DELETE", PODS.path(meta["namespace"], meta["name"]),
                        body={"apiVersion": "v1", "kind": "DeleteOptions",
                              "gracePeriodSeconds": 0})

        reflector = Reflector(self.client, PODS, field_selector=f"spec.nodeName={self.name}",
                              listener=on_pod)
        async with anyio.create_task_group() as tg:
            tg.start_soon(reflector.run)
            await reflector.synced.wait()
            task_status.started()

    # -- the signal's history ------------------------------------------------------------------
    async def _record(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                      ) -> None:
        async def on_node(ev: WatchEvent) -> None:
            if ev.type == "DELETED":
                return
            self.latest = ev.object
            ann = (ev.object.get("metadata") or {}).get("annotations") or {}
            rej = ann.get(SIGNAL_REJECTED_KEY)
            if rej and (not self.rejections or self.rejections[-1] != rej):
                self.rejections.append(rej)
            try:
                sig = parse_signal(ann)
            except InvalidSignalError:
                sig = None
            if sig is not None and sig.status is not None:
                t = Transition(sig.planId, str(sig.status.status), sig.status.reason,
                               sig.status.timestamp)
                last = self.history[-1] if self.history else None
                if last != t:
                    self.history.append(t)
            self._changed.set()
            self._changed = anyio.Event()

        reflector = Reflector(self.client, self.res, field_selector=f"metadata.name={self.name}",
                              listener=on_node)
        async with anyio.create_task_group() as tg:
            tg.start_soon(reflector.run)
            await reflector.synced.wait()
            task_status.started()

    def signal(self) -> SignalData | None:
        ann = ((self.latest or {}).get("metadata") or {}).get("annotations") or {}
        try:
            return parse_signal(ann)
        except InvalidSignalError:
            return None

    def states(self, plan_id: str) -> list[str]:
        return [t.state for t in self.history if t.plan_id == plan_id]

    async def wait_for(self, plan_id: str, states: set[SignalState] | set[str],
                       timeout: float = 60.0) -> SignalData:
        """Wait until the signal of ``plan_id`` reaches one of ``states``."""
        wanted = {str(s) for s in states}
        with anyio.fail_after(timeout):
            while True:
                changed = self._changed
                sig = self.signal()
                if sig is not None and sig.planId == plan_id and sig.status is not None \
                        and str(sig.status.status) in wanted:
                    return sig
                await changed.wait()

    async def wait_upgrade_recorded(self, timeout: float = 60.0) -> None:
        """Wait until the agent has recorded the upgrade span of the request it finished
        (it removes that request's ``.trace`` marker as it does). A terminal status on the
        object does not say so: the agent writes the status, then records the span, and
        an agent stopped in between records it at its next start instead."""
        with anyio.fail_after(timeout):
            while any(self.state_dir.glob("*.trace")):
                await anyio.sleep(0.05)

    async def wait_until(self, predicate: Any, timeout: float = 30.0) -> None:
        """Wait until ``predicate(node_object)`` holds (re-checked on every change)."""
        with anyio.fail_after(timeout):
            while True:
                changed = self._changed
                if self.latest is not None and predicate(self.latest):
                    return
                await changed.wait()

    # -- requests ------------------------------------------------------------------------------
    async def request(self, release: Release | None = None, *, version: str | None = None,
                      url: str | None = None, sha256: str | None = "release",
                      force: bool = False, allow_unverified: bool = False,
                      plan_id: str | None = None, traceparent: str | None = None,
                      policy: NodePolicy | None = None, raw: str | None = None) -> str:
        """Write a signal (a request without status) as the controller encodes it, or
        ``raw`` as given; returns its plan id."""
        plan_id = plan_id or f"plan-{uuid.uuid4().hex[:8]}"
        if raw is None:
            if sha256 == "release":
                sha256 = release.sha256 if release else None
            raw = AGENT.encode(Request(
                plan_id=plan_id, created=datetime.now(UTC), attempt=0,
                version=version or (release.version if release else ""),
                url=url or (release.url if release else ""), sha256=sha256 or "",
                allow_unverified=allow_unverified, force=force,
                traceparent=traceparent or "", policy=policy))
        await self.client.patch(self.res, self.name, {"metadata": {"annotations": {
            SIGNAL_VERSION_KEY: SIGNAL_VERSION, SIGNAL_DATA_KEY: raw}}})
        return plan_id

    # -- the agent process ---------------------------------------------------------------------
    def agent_command(self) -> list[str]:
        return [
            sys.executable, "-m", "fleet.cli", "agent",
            "--node-name", self.name,
            "--signal-object", self.signal_object,
            "--kubeconfig", str(self.root / "kubeconfig.yaml"),
            "--k0s-binary", str(self.binary),
            "--state-dir", str(self.state_dir),
            "--status-socket", str(self.socket),
            "--pid-file", str(self.pid_file),
            "--restart-strategy", "signal",
            "--download-stall-timeout", "2",
            "--download-attempts", "3",
            "--download-backoff-initial", "0.1",
            "--download-backoff-max", "0.5",
            "--drain-timeout", "20",
            "--verify-timeout", "20",
            "--rollback-timeout", "20",
            "--restart-grace", "2",
            *(a for prefix in self.url_prefixes for a in ("--allowed-url-prefix", prefix)),
            *self.agent_args,
        ]

    async def start_agent(self, *, crash_at: str | None = None,
                          extra_args: Sequence[str] = ()) -> anyio.abc.Process:
        if self.agent is not None and self.agent.returncode is None:
            raise RuntimeError(f"agent of {self.name} is already running")
        env = {**os.environ, "PYTHONPATH": str(self.agent_repo), **self.agent_env}
        env.pop(CRASH_ENV, None)
        if crash_at:
            env[CRASH_ENV] = crash_at
        self.agent_runs += 1
        logf = open(self.agent_log, "ab")  # noqa: SIM115, ASYNC230
        logf.write(f"--- agent run {self.agent_runs} (crash_at={crash_at})\n".encode())
        logf.flush()
        try:
            self.agent = await anyio.open_process(
                [*self.agent_command(), *extra_args], stdout=logf, stderr=subprocess.STDOUT,
                env=env, start_new_session=True, cwd=str(self.agent_repo))
        finally:
            logf.close()
        return self.agent

    async def wait_agent_exit(self, timeout: float = 60.0) -> int:
        assert self.agent is not None
        with anyio.fail_after(timeout):
            return await self.agent.wait()

    async def stop_agent(self) -> int | None:
        proc = self.agent
        if proc is None:
            return None
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with anyio.move_on_after(5):
                await proc.wait()
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
        return proc.returncode

    async def agent_ready(self) -> bool:
        """The current agent run has listed its object and is watching it."""
        text = self.log_text()
        run = text.rsplit(f"--- agent run {self.agent_runs} ", 1)[-1]
        return "watching " in run

    def agent_rss_kib(self) -> int | None:
        if self.agent is None or self.agent.returncode is not None:
            return None
        try:
            for line in Path(f"/proc/{self.agent.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        except OSError:
            return None
        return None

    def agent_cpu_seconds(self) -> float | None:
        if self.agent is None:
            return None
        try:
            fields = Path(f"/proc/{self.agent.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks

    def log_text(self) -> str:
        try:
            return self.agent_log.read_text(errors="replace")
        except OSError:
            return ""

