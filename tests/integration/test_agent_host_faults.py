"""Agent host faults end in a state, not a loop (issue #12 item 4).

Real agent process, real Node on wl1, and faults injected through the real filesystem:
a read-only bind mount over the binary directory, and a full tmpfs under the state
directory (the restart marker cannot be written). Needs mount privileges (root with
CAP_SYS_ADMIN); skipped, saying so, where the kernel refuses.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from fleet.agents.files import sha256_file
from fleet.contract.signal import SignalState
from fleet.testing.releases import ReleaseServer
from tests.helpers.agent import (
    NEW,
    OLD,
    TERMINAL,
    uncordoned,
)

pytestmark = pytest.mark.anyio


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True, text=True)


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


@pytest.fixture(scope="module")
def can_mount(tmp_path_factory: pytest.TempPathFactory) -> None:
    probe = tmp_path_factory.mktemp("mount-probe")
    try:
        _mount("-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe))
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        pytest.skip(f"cannot mount a tmpfs here (needs CAP_SYS_ADMIN): {e}")
    _umount(probe)


@contextlib.contextmanager
def mounted(path: Path, *args: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    _mount(*args, str(path))
    try:
        yield path
    finally:
        _umount(path)


async def _agent_ready(node: Any) -> None:
    with anyio.fail_after(60):
        while not await node.agent_ready():
            await anyio.sleep(0.1)


def _fill(directory: Path) -> None:
    """Fill the filesystem of ``directory`` to the last block."""
    with open(directory / "filler", "wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 4096)


async def test_read_only_binary_directory_fails_the_download_naming_path_and_errno(
        can_mount: None, sim: Callable[..., Any], releases: ReleaseServer,
        tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    with mounted(bindir, "--bind", str(bindir)):  # its own mount, to remount read-only
        async with sim(root=tmp_path) as node:
            before = sha256_file(node.binary)
            await _agent_ready(node)
            _mount("-o", "remount,bind,ro", str(bindir))
            try:
                plan = await node.request(releases.releases[NEW])
                sig = await node.wait_for(plan, TERMINAL, timeout=60)
            finally:
                _mount("-o", "remount,bind,rw", str(bindir))
            assert sig.status is not None
            assert sig.status.status is SignalState.FAILED_DOWNLOAD, sig.status.reason
            assert "EROFS" in sig.status.reason and str(bindir) in sig.status.reason
            assert sha256_file(node.binary) == before
            assert node.restarts == 0
            await node.wait_until(uncordoned, timeout=30)


async def test_full_state_disk_fails_the_request_naming_path_and_errno(
        can_mount: None, sim: Callable[..., Any], releases: ReleaseServer,
        tmp_path: Path) -> None:
    """The agent's state directory (markers) is full: the request ends at its first marker
    write (today the trace marker at Start; before #14 the restart marker, where the
    previous binary is put back first) in a failure naming the path and ENOSPC, with the
    installed binary intact, k0s not restarted and the node not left cordoned."""
    state = tmp_path / "state"
    with mounted(state, "-t", "tmpfs", "-o", "size=256k", "tmpfs"):
        async with sim(root=tmp_path) as node:
            before = sha256_file(node.binary)
            await _agent_ready(node)
            _fill(state)
            plan = await node.request(releases.releases[NEW])
            sig = await node.wait_for(plan, TERMINAL, timeout=90)
            (state / "filler").unlink()
            assert sig.status is not None
            assert sig.status.status in (SignalState.FAILED_DOWNLOAD,
                                         SignalState.FAILED_APPLY), sig.status.reason
            assert "ENOSPC" in sig.status.reason and str(state) in sig.status.reason
            if sig.status.status is SignalState.FAILED_APPLY:
                assert "previous binary restored" in sig.status.reason
            assert sha256_file(node.binary) == before  # OLD, intact
            assert node.restarts == 0
            assert await node.running_version() == OLD
            await node.wait_until(uncordoned, timeout=60)
