"""Host-fault classification (fleet.agents.hostfault); the faults themselves are injected
through the real filesystem in tests/integration/test_agent_host_faults.py."""

from __future__ import annotations

import errno
import os

import pytest

from fleet.agents.hostfault import ATTEMPTS, HostFaults, describe, failure_state
from fleet.contract.signal import SignalState


def test_describe_names_path_and_errno() -> None:
    e = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/var/lib/x/marker")
    assert describe(e) == "/var/lib/x/marker: ENOSPC (No space left on device)"
    two = OSError(errno.EXDEV, os.strerror(errno.EXDEV), "/a", None, "/b")
    assert describe(two).startswith("/a -> /b: EXDEV")
    assert "(no path reported)" in describe(OSError(errno.EIO, "I/O error"))


@pytest.mark.parametrize(("state", "failure"), [
    (None, SignalState.FAILED_DOWNLOAD),
    (SignalState.DOWNLOADING, SignalState.FAILED_DOWNLOAD),
    (SignalState.CORDONING, SignalState.FAILED_APPLY),
    (SignalState.APPLYING_UPDATE, SignalState.FAILED_APPLY),
    (SignalState.RESTARTING, SignalState.FAILED_APPLY),
    (SignalState.VERIFYING, SignalState.FAILED_VERIFY),
])
def test_failure_state_by_step(state: SignalState | None, failure: SignalState) -> None:
    assert failure_state(state) is failure


def test_persistent_errors_fail_at_once_others_after_a_few_attempts() -> None:
    faults = HostFaults()
    assert faults.give_up(SignalState.DOWNLOADING, OSError(errno.EROFS, "ro"))
    full = OSError(errno.ENOSPC, "full")
    results = [faults.give_up(SignalState.RESTARTING, full) for _ in range(ATTEMPTS)]
    assert results == [False] * (ATTEMPTS - 1) + [True]
    faults.reset()  # a step that went through starts the count again
    assert not faults.give_up(SignalState.RESTARTING, full)
