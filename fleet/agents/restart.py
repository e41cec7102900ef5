"""Find the running k0s, and restart it exactly once per request.

Observing k0s (:class:`K0sProbe`): its status API (HTTP over the unix socket, as
autopilot reads it) gives the running Version and Pid; failing that, a pid file or
systemd's MainPID gives the pid and ``<binary> version`` the installed version.

Restarting (:class:`Restarter`): ``systemd`` (``systemctl restart k0s<role>``, via
``nsenter`` into the host's namespaces when the agent runs in a container), ``signal``
(SIGTERM to the k0s pid and let the init system start the new binary, as autopilot
does) or ``command`` (a configured command line).

Exactly once (:func:`restart_once`): see :func:`fleet.agents.state.restart_action`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from fleet.agents.files import unlink_quiet, write_durably
from fleet.agents.settings import AgentSettings, HostNamespace, RestartStrategy, VersionSource
from fleet.agents.state import RestartAction, RestartMarker, restart_action
from fleet.kube.http import HttpClient

log = logging.getLogger(__name__)

NSENTER = ("nsenter", "-t", "1", "-m", "-u", "-i", "-n", "-p", "--")


class RestartError(Exception):
    """The restart could not be issued."""


@dataclass(frozen=True, slots=True)
class RunningK0s:
    pid: int | None
    version: str | None


async def run_command(argv: list[str], *, timeout: float = 60.0) -> tuple[int, str]:
    """Run a command; (exit code, combined output). Never raises for a non-zero exit."""
    try:
        with anyio.fail_after(timeout):
            done = await anyio.run_process(argv, check=False, stderr=subprocess.STDOUT)
    except TimeoutError:
        return 124, f"{argv[0]}: timed out after {timeout:g}s"
    except OSError as e:
        return 127, f"{argv[0]}: {e.strerror or e}"
    return done.returncode, done.stdout.decode("utf-8", "replace").strip()


def in_container() -> bool:
    """True when our mount namespace is not the host's (pid 1's): a pod with hostPID."""
    try:
        return os.readlink("/proc/self/ns/mnt") != os.readlink("/proc/1/ns/mnt")
    except OSError:
        return False


def host_prefix(mode: HostNamespace) -> tuple[str, ...]:
    if mode is HostNamespace.ALWAYS or (mode is HostNamespace.AUTO and in_container()):
        return NSENTER
    return ()


async def binary_version(binary: Path) -> str | None:
    """What ``<binary> version`` prints, or None when it cannot run."""
    code, out = await run_command([str(binary), "version"], timeout=15.0)
    if code != 0 or not out:
        return None
    return out.splitlines()[0].strip()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill(0); it is not running k0s
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


class K0sProbe:
    """Where the running k0s is found, per configuration."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings

    async def status(self) -> dict[str, Any] | None:
        """k0s's status API answer, or None when k0s does not answer."""
        sock = self.settings.status_socket
        if sock is None:
            return None
        http = HttpClient("http://localhost", unix_socket=str(sock), connect_timeout=3.0,
                          pool_size=0)
        try:
            with anyio.fail_after(3.0):
                resp = await http.request("GET", "/status", read_timeout=3.0)
                try:
                    if resp.status != 200:
                        return None
                    data: Any = json.loads(await resp.read(max_bytes=1024 * 1024))
                finally:
                    resp.release()
        except (OSError, TimeoutError, ValueError):
            return None
        finally:
            await http.close()
        return data if isinstance(data, dict) else None

    async def pid(self) -> int | None:
        if self.settings.status_socket is not None:
            st = await self.status()
            pid = st.get("Pid") if st else None
            if isinstance(pid, int) and pid > 0:
                return pid
            if self.settings.pid_file is None and \
                    self.settings.restart_strategy is not RestartStrategy.SYSTEMD:
                return None
        if self.settings.pid_file is not None:
            try:
                pid = int(self.settings.pid_file.read_text().strip())
            except (OSError, ValueError):
                return None
            return pid if pid > 0 and pid_alive(pid) else None
        if self.settings.restart_strategy is RestartStrategy.SYSTEMD:
            code, out = await run_command([
                *host_prefix(self.settings.host_namespace), "systemctl", "show",
                "--property=MainPID", "--value", self.settings.unit,
            ])
            try:
                pid = int(out) if code == 0 else 0
            except ValueError:
                pid = 0
            return pid or None
        return None

    async def running(self) -> RunningK0s | None:
        """The running k0s (pid and version), or None when none is running."""
        if self.settings.version_source is VersionSource.STATUS_SOCKET:
            st = await self.status()
            if st is None:
                return None
            pid = st.get("Pid")
            version = st.get("Version")
            return RunningK0s(pid=pid if isinstance(pid, int) else None,
                              version=version if isinstance(version, str) else None)
        pid = await self.pid()
        if pid is None:
            return None
        return RunningK0s(pid=pid, version=await binary_version(self.settings.k0s_binary))

    async def current_version(self) -> str | None:
        """The running version if k0s answers, else the installed binary's."""
        running = await self.running()
        if running is not None and running.version:
            return running.version
        return await binary_version(self.settings.k0s_binary)


class Restarter:
    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings

    async def restart(self, pid: int | None) -> str:
        """Issue the restart; returns what was done, raises RestartError."""
        s = self.settings
        if s.restart_strategy is RestartStrategy.SIGNAL:
            if pid is None:
                return "k0s is not running; the init system starts the new binary"
            sig = signal.Signals[s.restart_signal.upper()]
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return f"pid {pid} already gone"
            except PermissionError as e:
                raise RestartError(f"cannot signal k0s pid {pid}: {e.strerror}") from e
            return f"sent {sig.name} to k0s pid {pid}"
        if s.restart_strategy is RestartStrategy.SYSTEMD:
            argv = [*host_prefix(s.host_namespace), "systemctl", "restart", s.unit]
        else:
            assert s.restart_command is not None  # settings validation
            argv = [*host_prefix(s.host_namespace), *shlex.split(s.restart_command)]
        code, out = await run_command(argv, timeout=s.restart_timeout)
        if code != 0:
            raise RestartError(f"{shlex.join(argv)} exited {code}: {out[-300:]}")
        return f"ran {shlex.join(argv)}"


@dataclass(frozen=True, slots=True)
class RestartOutcome:
    issued: bool  # False: an earlier run of the agent already issued it
    detail: str
    marker: RestartMarker


def read_marker(path: Path) -> RestartMarker | None:
    try:
        return RestartMarker.from_json(path.read_bytes())
    except FileNotFoundError:
        return None


async def restart_once(marker_path: Path, request: str, probe: K0sProbe, restarter: Restarter,
                       *, grace: float, crash_point: Any = None) -> RestartOutcome:
    """Restart k0s unless this request's restart was already issued (see the module doc)."""
    marker = read_marker(marker_path)
    if marker is not None and marker.request != request:
        unlink_quiet(marker_path)
        marker = None
    current = await probe.pid()
    action = restart_action(marker, current)
    if action is RestartAction.DONE:
        assert marker is not None
        return RestartOutcome(False, f"restart already issued (k0s pid was {marker.pid}, "
                                     f"now {current})", marker)
    if action is RestartAction.WAIT_THEN_REISSUE:
        assert marker is not None
        with anyio.move_on_after(grace):
            while await probe.pid() == marker.pid:
                await anyio.sleep(0.2)
            return RestartOutcome(False, f"restart already issued (pid {marker.pid} exited)",
                                  marker)
        log.warning("k0s pid %s still running %gs after the recorded restart; issuing again",
                    marker.pid, grace)
    marker = RestartMarker(request=request, pid=current)
    await anyio.to_thread.run_sync(write_durably, marker_path, marker.to_json())
    if crash_point is not None:
        crash_point("marked")
    detail = await restarter.restart(current)
    log.info("restart: %s", detail)
    return RestartOutcome(True, detail, marker)
