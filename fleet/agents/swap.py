"""Replace the k0s binary atomically, keeping the previous one for rollback.

The k0s issue 7703 sequence (binary renamed, status write failed, retry looked for the
staged file, found none, looped forever) cannot happen here: "where am I" comes from
digests, not from which temporary files exist. The installed binary already having the
requested digest means "applied" whatever else is on disk; the staged file is removed
only after the status write that follows the apply has landed (the caller's job).
All functions are synchronous filesystem work; run them in a worker thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from fleet.agents.files import (
    fsync_dir,
    link_replace,
    rollback_path,
    sha256_file,
    staged_path,
    unlink_quiet,
)
from fleet.agents.hostfault import describe
from fleet.agents.state import ApplyAction, apply_action

log = logging.getLogger(__name__)


class ApplyError(Exception):
    """The new binary could not be put in place; the installed one is untouched."""


class StagedMissingError(ApplyError):
    """Nothing staged with the requested digest (it must be downloaded again)."""


@dataclass(frozen=True, slots=True)
class ApplyResult:
    action: ApplyAction
    kept_rollback: bool


def apply(binary: Path, expected_sha256: str) -> ApplyResult:
    """Install the staged binary over ``binary`` unless it is already there."""
    installed = sha256_file(binary)
    staged = staged_path(binary)
    staged_digest = sha256_file(staged) if installed != expected_sha256 else None
    action = apply_action(installed=installed, staged=staged_digest, expected=expected_sha256)
    if action is ApplyAction.ALREADY_APPLIED:
        kept = rollback_path(binary).exists()
        if not kept and installed is not None:
            # Only when this request never kept a copy (a forced reinstall of identical
            # bytes): the rollback copy is then the same content, which is right.
            _keep_rollback(binary)
            kept = True
        return ApplyResult(action, kept_rollback=kept)
    if action is ApplyAction.NEED_STAGED:
        raise StagedMissingError(f"no staged binary with sha256 {expected_sha256} next to {binary}")
    try:
        kept = False
        if installed is not None:
            _keep_rollback(binary)
            kept = True
        os.chmod(staged, 0o755)
        link_replace(staged, binary)  # the staged name survives until the status lands
        fsync_dir(binary.parent)
    except OSError as e:
        raise ApplyError(f"cannot replace {binary}: {describe(e)}") from e
    log.info("installed %s (sha256 %s)", binary, expected_sha256)
    return ApplyResult(action, kept_rollback=kept)


def _keep_rollback(binary: Path) -> None:
    link_replace(binary, rollback_path(binary))
    fsync_dir(binary.parent)


def restore(binary: Path) -> bool:
    """Put the rollback copy back in place; False when there is none to restore."""
    keep = rollback_path(binary)
    kept = sha256_file(keep)
    if kept is None:
        return False
    if sha256_file(binary) != kept:
        try:
            link_replace(keep, binary)
            fsync_dir(binary.parent)
        except OSError as e:
            raise ApplyError(f"cannot restore {binary} from {keep}: {describe(e)}") from e
        log.info("restored %s from %s", binary, keep)
    return True


def discard_staged(binary: Path) -> None:
    if unlink_quiet(staged_path(binary)):
        with contextlib.suppress(OSError):
            fsync_dir(binary.parent)


def discard_rollback(binary: Path) -> None:
    if unlink_quiet(rollback_path(binary)):
        with contextlib.suppress(OSError):
            fsync_dir(binary.parent)
