"""Wait, within a deadline, until the restarted k0s runs the expected version.

"Verified" means: the running k0s reports exactly the expected version (through its
status API, or ``k0s version`` of the installed binary while a restarted process stays
up, per configuration) and, when the node has one, the Node is Ready. This polls the
local k0s only while a verification is running (there is no push API to wait on); the
Node's readiness comes from the agent's watch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from fleet.agents.restart import K0sProbe
from fleet.agents.settings import VersionSource
from fleet.contract.versions import same_version

POLL_SECONDS = 0.25


@dataclass(frozen=True, slots=True)
class VerifyResult:
    ok: bool
    reason: str
    version: str | None
    seconds: float


async def wait_running(probe: K0sProbe, expected: str | None, *, timeout: float,
                       node_ready: Callable[[], bool] | None,
                       replaced_pid: int | None = None) -> VerifyResult:
    """Wait until k0s runs ``expected`` (any version when None) and the Node is Ready.

    ``replaced_pid``: the process the restart replaced; with the binary version source
    the new process must differ from it and stay up for ``verify_stable_seconds``.
    """
    settings = probe.settings
    by_binary = settings.version_source is VersionSource.BINARY
    t0 = time.monotonic()
    why = "k0s has not answered yet"
    version: str | None = None
    stable_pid: int | None = None
    stable_since = 0.0
    with anyio.move_on_after(timeout):
        while True:
            running = await probe.running()
            ready = node_ready() if node_ready is not None else True
            if running is None:
                why, version, stable_pid = "k0s is not running (or not answering)", None, None
            else:
                version = running.version
                if by_binary and running.pid != stable_pid:
                    stable_pid, stable_since = running.pid, time.monotonic()
                if by_binary and running.pid is not None and running.pid == replaced_pid:
                    why = f"k0s pid {running.pid} has not been restarted"
                elif expected is not None and not same_version(version, expected):
                    why = f"k0s runs {version or 'an unknown version'}, expected {expected}"
                elif by_binary and time.monotonic() - stable_since < settings.verify_stable_seconds:
                    why = f"k0s pid {running.pid} up for less than " \
                          f"{settings.verify_stable_seconds:g}s"
                elif not ready:
                    why = "the Node is not Ready"
                else:
                    return VerifyResult(True, f"k0s {version} running", version,
                                        time.monotonic() - t0)
            await anyio.sleep(POLL_SECONDS)
    return VerifyResult(False, f"not verified within {timeout:g}s: {why}", version,
                        time.monotonic() - t0)
