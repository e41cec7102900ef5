"""Exactly-once restart with a fake k0s process, and verification deadlines."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from fleet.agents.restart import K0sProbe, Restarter, RunningK0s, read_marker, restart_once
from fleet.agents.settings import AgentSettings
from fleet.agents.verify import wait_running

pytestmark = pytest.mark.anyio


class FakeK0s:
    """A k0s whose pid changes when restarted; the probe and the restarter in one."""

    def __init__(self, tmp: Path) -> None:
        self.settings = AgentSettings(node_name="n", state_dir=tmp, status_socket=tmp / "s")
        self.pid: int | None = 100
        self.version = "v1.31.3+k0s.0"
        self.restarts = 0
        self.apply_restart = True

    async def pid_(self) -> int | None:
        return self.pid

    async def restart(self, pid: int | None) -> str:
        self.restarts += 1
        if self.apply_restart:
            self.pid = (self.pid or 100) + 1
        return "restarted"

    async def running(self) -> RunningK0s | None:
        return None if self.pid is None else RunningK0s(self.pid, self.version)


def wire(fake: FakeK0s) -> tuple[K0sProbe, Restarter]:
    probe = K0sProbe(fake.settings)
    probe.pid = fake.pid_  # type: ignore[method-assign]
    probe.running = fake.running  # type: ignore[method-assign]
    restarter = Restarter(fake.settings)
    restarter.restart = fake.restart  # type: ignore[method-assign]
    return probe, restarter


async def test_restart_is_issued_once(tmp_path: Path) -> None:
    fake = FakeK0s(tmp_path)
    probe, restarter = wire(fake)
    marker = tmp_path / "r.restart"
    first = await restart_once(marker, "r", probe, restarter, grace=0.1)
    assert first.issued and fake.restarts == 1
    assert read_marker(marker) is not None and read_marker(marker).pid == 100  # type: ignore[union-attr]
    again = await restart_once(marker, "r", probe, restarter, grace=0.1)
    assert not again.issued and fake.restarts == 1


async def test_killed_after_marker_before_restart(tmp_path: Path) -> None:
    fake = FakeK0s(tmp_path)
    probe, restarter = wire(fake)
    marker = tmp_path / "r.restart"

    def die(point: str) -> None:
        raise SystemExit(point)

    with pytest.raises(SystemExit, match="marked"):
        await restart_once(marker, "r", probe, restarter, grace=0.1, crash_point=die)
    assert fake.restarts == 0
    # same process still running after the grace period: the restart is issued now
    out = await restart_once(marker, "r", probe, restarter, grace=0.1)
    assert out.issued and fake.restarts == 1


async def test_slow_shutdown_is_waited_for_not_repeated(tmp_path: Path) -> None:
    fake = FakeK0s(tmp_path)
    fake.apply_restart = False  # the signal was sent; the process takes a while to go
    probe, restarter = wire(fake)
    marker = tmp_path / "r.restart"
    await restart_once(marker, "r", probe, restarter, grace=5)

    async def exits_later() -> None:
        await anyio.sleep(0.3)
        fake.pid = 101

    async with anyio.create_task_group() as tg:
        tg.start_soon(exits_later)
        out = await restart_once(marker, "r", probe, restarter, grace=5)
    assert not out.issued and fake.restarts == 1


async def test_k0s_down_counts_as_restarted(tmp_path: Path) -> None:
    fake = FakeK0s(tmp_path)
    probe, restarter = wire(fake)
    marker = tmp_path / "r.restart"
    await restart_once(marker, "r", probe, restarter, grace=0.1)
    fake.pid = None  # crash-looping new binary: nothing runs at this instant
    out = await restart_once(marker, "r", probe, restarter, grace=0.1)
    assert not out.issued and fake.restarts == 1


async def test_marker_of_another_request_is_ignored(tmp_path: Path) -> None:
    fake = FakeK0s(tmp_path)
    probe, restarter = wire(fake)
    marker = tmp_path / "x.restart"
    await restart_once(marker, "old", probe, restarter, grace=0.1)
    out = await restart_once(marker, "new", probe, restarter, grace=0.1)
    assert out.issued and fake.restarts == 2


async def test_verify_waits_for_version_and_readiness(tmp_path: Path) -> None:
    fake = FakeK0s(tmp_path)
    probe, _ = wire(fake)
    ready = False

    async def upgrade_later() -> None:
        nonlocal ready
        await anyio.sleep(0.3)
        fake.version = "v1.32.1+k0s.0"
        await anyio.sleep(0.3)
        ready = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(upgrade_later)
        res = await wait_running(probe, "v1.32.1", timeout=5, node_ready=lambda: ready)
    assert res.ok and res.version == "v1.32.1+k0s.0" and res.seconds >= 0.5


async def test_verify_deadline_says_why(tmp_path: Path) -> None:
    fake = FakeK0s(tmp_path)
    probe, _ = wire(fake)
    res = await wait_running(probe, "v1.32.1", timeout=0.5, node_ready=None)
    assert not res.ok and "expected v1.32.1" in res.reason and "0.5s" in res.reason
    fake.pid = None
    res = await wait_running(probe, "v1.32.1", timeout=0.3, node_ready=None)
    assert not res.ok and "not running" in res.reason
    fake.pid, fake.version = 7, "v1.32.1+k0s.0"
    res = await wait_running(probe, "v1.32.1", timeout=0.3, node_ready=lambda: False)
    assert not res.ok and "not Ready" in res.reason
