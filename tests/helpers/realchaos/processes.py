"""The real processes of a chaos trial: controller replicas and node agents, supervised.

A supervisor restarts whatever exits, as a Deployment (controller) or systemd (agent)
would, and records every exit: an exit that no fault explains (anything but SIGKILL by
the trial, the controller's "lost my Lease" code, or a clean stop) is a violation.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import yaml

from fleet.cli.exit import Exit
from fleet.kube import KubeClient, KubeError
from fleet.kube.resources import LEASES
from fleet.testing.binaries import REPO_ROOT
from fleet.testing.simnode import SimNode
from fleet.testing.world import free_port

LEASE_SECONDS = 6
LEASE_NAME = "k0s-fleet-controller"


def log_tail(path: Path, chars: int = 2500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@dataclass
class Replica:
    identity: str
    proc: anyio.abc.Process
    port: int
    log: Path
    killed: bool = False  # SIGKILLed by the trial
    paused: bool = False


@dataclass
class Controllers:
    """``replicas`` controller processes with leader election, kept at that number."""

    workdir: Path
    config: dict[str, Any]  # the fleet config (status.port set per replica)
    # the management kubeconfig of a replica (each authenticates as its own user, so
    # that the audit log tells the replicas' writes apart: tests.helpers.realchaos.fencing)
    kubeconfig: Callable[[str], dict[str, Any]]
    mgmt: KubeClient
    namespace: str
    replicas: int = 2
    running: dict[str, Replica] = field(default_factory=dict)
    exits: list[tuple[str, int]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    started: int = 0
    stopping: bool = False

    async def start(self) -> Replica:
        identity = f"ctl-{self.started}"
        self.started += 1
        port = free_port()
        cfg = self.workdir / f"{identity}.yaml"
        cfg.write_text(yaml.safe_dump({**self.config, "status": {"port": port}}))
        kubeconfig = self.workdir / f"{identity}-kubeconfig.yaml"
        kubeconfig.write_text(yaml.safe_dump(self.kubeconfig(identity)))
        log = self.workdir / f"{identity}.log"
        with log.open("wb") as fh:
            proc = await anyio.open_process(
                [sys.executable, "-m", "fleet.cli", "controller", "--config", str(cfg),
                 "--kubeconfig", str(kubeconfig), "--identity", identity,
                 "--lease-seconds", str(LEASE_SECONDS), "--log-level", "INFO"],
                stdout=subprocess.DEVNULL, stderr=fh, cwd=str(REPO_ROOT),
                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, start_new_session=True)
        replica = Replica(identity, proc, port, log)
        self.running[identity] = replica
        return replica

    async def supervise(self) -> None:
        """Restart exited replicas (forever; cancel to stop)."""
        while len(self.running) < self.replicas:
            await self.start()
        while True:
            for identity, r in list(self.running.items()):
                if r.proc.returncode is None:
                    continue
                rc = r.proc.returncode
                self.exits.append((identity, rc))
                del self.running[identity]
                expected = rc == Exit.LOST_LEADERSHIP or (r.killed and rc == -signal.SIGKILL)
                if not expected:
                    self.violations.append(f"controller {identity} exited {rc}:\n"
                                           f"{log_tail(r.log)}")
            while len(self.running) < self.replicas and not self.stopping:
                await self.start()
            await anyio.sleep(0.3)

    async def leader(self, timeout: float = 10.0) -> Replica | None:
        """The running replica holding the Lease (None: none, or the server stalls)."""
        with anyio.move_on_after(timeout):
            with contextlib.suppress(KubeError):
                lease = await self.mgmt.get(LEASES, LEASE_NAME, self.namespace)
                holder = (lease.get("spec") or {}).get("holderIdentity")
                r = self.running.get(str(holder))
                return r if r is not None and r.proc.returncode is None else None
        return None

    async def wait_leader(self, timeout: float) -> Replica | None:
        """A running replica holding the Lease, waiting for one to take it over (a
        replica that lost it exits without releasing it: the Lease runs out first)."""
        with anyio.move_on_after(timeout):
            while (r := await self.leader()) is None:
                await anyio.sleep(0.5)
            return r
        return None

    @staticmethod
    def kill(r: Replica) -> None:
        r.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(r.proc.pid, signal.SIGKILL)

    @staticmethod
    def pause(r: Replica) -> None:
        r.paused = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(r.proc.pid, signal.SIGSTOP)

    @staticmethod
    def resume(r: Replica) -> None:
        r.paused = False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(r.proc.pid, signal.SIGCONT)

    async def healthz(self, r: Replica) -> int:
        def get() -> int:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{r.port}/healthz",
                                            timeout=10) as resp:
                    return int(resp.status)
            except urllib.error.HTTPError as e:
                return int(e.code)
            except OSError:
                return 0
        return await anyio.to_thread.run_sync(get)

    async def stop(self) -> None:
        """SIGTERM every replica (a clean stop exits 0; anything else is recorded)."""
        self.stopping = True
        for r in list(self.running.values()):
            self.resume(r)
        # A replica still starting has no SIGTERM handler yet and dies of the signal (seen:
        # a replica started 16 s before the stop, still importing on a loaded machine,
        # exited -15 with an empty log). Its status port is served only once the handler
        # is in place: wait until it answers (any status), for a bounded time.
        with anyio.move_on_after(60):
            for starting in list(self.running.values()):
                while starting.proc.returncode is None and await self.healthz(starting) == 0:
                    await anyio.sleep(0.2)
        for replica in list(self.running.values()):
            with contextlib.suppress(ProcessLookupError):
                replica.proc.send_signal(signal.SIGTERM)
        for identity, r in list(self.running.items()):
            with anyio.move_on_after(30):
                await r.proc.wait()
            if r.proc.returncode is None:
                self.violations.append(f"controller {identity} did not stop within 30s of "
                                       f"SIGTERM:\n{log_tail(r.log)}")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(r.proc.pid, signal.SIGKILL)
                await r.proc.wait()
            rc = r.proc.returncode
            assert rc is not None  # waited for above
            self.exits.append((identity, rc))
            # A replica on its way out after losing the Lease (its signal handler gone)
            # dies of the SIGTERM: the exit it was making anyway.
            leaving = rc == -signal.SIGTERM and "could not renew lease" in log_tail(r.log)
            if rc not in (Exit.OK, Exit.LOST_LEADERSHIP) and not leaving:
                self.violations.append(f"controller {identity} exited {rc} on SIGTERM:\n"
                                       f"{log_tail(r.log)}")
        self.running.clear()


@dataclass
class Agents:
    """Restarts each node's agent when it exits (systemd's Restart=always)."""

    nodes: dict[str, SimNode]
    exits: list[tuple[str, int]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    killed: set[int] = field(default_factory=set)  # pids SIGKILLed by the trial

    async def supervise(self, name: str) -> None:
        node = self.nodes[name]
        while True:
            proc = node.agent
            if proc is None:
                await anyio.sleep(0.2)
                continue
            rc = await proc.wait()
            self.exits.append((name, rc))
            crash = node.agent_runs == 1 and "crash point" in node.log_text()
            if rc != -signal.SIGKILL or not (proc.pid in self.killed or crash):
                self.violations.append(f"agent of {name} exited {rc}:\n"
                                       f"{node.log_text()[-2500:]}")
            await anyio.sleep(0.3)
            await node.start_agent()

    def kill(self, name: str) -> bool:
        proc = self.nodes[name].agent
        if proc is None or proc.returncode is not None:
            return False
        self.killed.add(proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return True


__all__ = ["LEASE_NAME", "LEASE_SECONDS", "Agents", "Controllers", "Replica", "log_tail"]
