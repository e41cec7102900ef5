"""The binary swap on a real filesystem (tmp_path), including every interrupted order."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from fleet.agents import swap
from fleet.agents.files import rollback_path, sha256_file, staged_path
from fleet.agents.state import ApplyAction

OLD = b"#!/bin/sh\necho old\n"
NEW = b"#!/bin/sh\necho new\n"
NEW_SHA = hashlib.sha256(NEW).hexdigest()
OLD_SHA = hashlib.sha256(OLD).hexdigest()


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    b = tmp_path / "k0s"
    b.write_bytes(OLD)
    b.chmod(0o755)
    staged_path(b).write_bytes(NEW)
    return b


def test_apply_keeps_rollback_and_staged(binary: Path) -> None:
    inode_before = binary.stat().st_ino
    result = swap.apply(binary, NEW_SHA)
    assert result.action is ApplyAction.INSTALL and result.kept_rollback
    assert binary.read_bytes() == NEW
    assert os.access(binary, os.X_OK)
    assert rollback_path(binary).stat().st_ino == inode_before  # a hard link, not a copy
    assert staged_path(binary).exists()  # removed only after the status write lands
    assert staged_path(binary).stat().st_ino == binary.stat().st_ino
    assert not any(p.name.endswith(".fleet-new") for p in binary.parent.iterdir())


def test_apply_twice_is_already_applied_and_keeps_the_old_rollback(binary: Path) -> None:
    swap.apply(binary, NEW_SHA)
    again = swap.apply(binary, NEW_SHA)
    assert again.action is ApplyAction.ALREADY_APPLIED
    assert rollback_path(binary).read_bytes() == OLD


def test_k0s_7703_staged_file_gone_after_rename(binary: Path) -> None:
    """Renamed, staged file removed, status never written: the retry must not loop."""
    swap.apply(binary, NEW_SHA)
    swap.discard_staged(binary)
    again = swap.apply(binary, NEW_SHA)
    assert again.action is ApplyAction.ALREADY_APPLIED
    assert rollback_path(binary).read_bytes() == OLD


def test_interrupted_between_rollback_link_and_rename(binary: Path) -> None:
    # first half of apply only: the rollback copy exists, the binary is still old
    swap._keep_rollback(binary)
    result = swap.apply(binary, NEW_SHA)
    assert result.action is ApplyAction.INSTALL
    assert binary.read_bytes() == NEW and rollback_path(binary).read_bytes() == OLD


def test_leftover_temporary_link_is_harmless(binary: Path) -> None:
    binary.with_name("k0s.fleet-new").write_bytes(b"junk")
    swap.apply(binary, NEW_SHA)
    assert binary.read_bytes() == NEW


def test_missing_or_wrong_staged_file(binary: Path) -> None:
    staged_path(binary).write_bytes(b"something else")
    with pytest.raises(swap.StagedMissingError):
        swap.apply(binary, NEW_SHA)
    staged_path(binary).unlink()
    with pytest.raises(swap.StagedMissingError):
        swap.apply(binary, NEW_SHA)
    assert binary.read_bytes() == OLD


def test_forced_reinstall_of_identical_bytes_keeps_a_rollback(tmp_path: Path) -> None:
    b = tmp_path / "k0s"
    b.write_bytes(NEW)
    result = swap.apply(b, NEW_SHA)
    assert result.action is ApplyAction.ALREADY_APPLIED and result.kept_rollback
    assert rollback_path(b).read_bytes() == NEW


def test_restore(binary: Path) -> None:
    assert not swap.restore(binary)  # nothing kept yet
    swap.apply(binary, NEW_SHA)
    assert swap.restore(binary)
    assert binary.read_bytes() == OLD
    assert swap.restore(binary)  # idempotent
    assert sha256_file(binary) == OLD_SHA


def test_unwritable_target_is_an_apply_error(binary: Path) -> None:
    # a directory squatting on the temporary name defeats even root
    squat = binary.with_name(rollback_path(binary).name + ".fleet-new")
    squat.mkdir()
    (squat / "x").write_bytes(b"")
    with pytest.raises(swap.ApplyError, match="cannot replace"):
        swap.apply(binary, NEW_SHA)
    assert binary.read_bytes() == OLD


def test_discards_are_idempotent(binary: Path) -> None:
    swap.discard_staged(binary)
    swap.discard_staged(binary)
    swap.discard_rollback(binary)
    assert not staged_path(binary).exists()
