"""Small durable-filesystem helpers shared by download and swap."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

CHUNK = 1024 * 1024


def sha256_file(path: Path) -> str | None:
    """Hex sha256 of a file, or None when it does not exist."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
    except FileNotFoundError:
        return None
    return h.hexdigest()


def _named(e: OSError, path: Path) -> OSError:
    """``e`` naming ``path`` (write/fsync errors name no file), for a failure reason."""
    if e.filename is not None:
        return e
    return type(e)(e.errno, e.strerror, str(path))


def fsync_dir(directory: Path) -> None:
    """Make renames and unlinks in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as e:
        raise _named(e, directory) from e
    finally:
        os.close(fd)


def link_replace(src: Path, dst: Path) -> None:
    """Make ``dst`` another name of ``src``'s inode, atomically, keeping ``src``.

    Hard-links to a temporary name next to ``dst``, then renames over ``dst``: a reader
    of ``dst`` sees the old file or the new one, never a missing or partial one.
    Both paths must be in the same filesystem (the same directory, here).
    """
    tmp = dst.with_name(f"{dst.name}.fleet-new")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.link(src, tmp)
    os.replace(tmp, dst)


def unlink_quiet(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True


def write_durably(path: Path, data: bytes) -> None:
    """Write a small file so that after a crash it holds either nothing or ``data``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()  # no half-written marker left behind
        raise _named(e, tmp) from e
    os.replace(tmp, path)
    fsync_dir(path.parent)


def staged_path(binary: Path) -> Path:
    """Where a downloaded, verified binary waits to be applied."""
    return binary.with_name(f".{binary.name}.fleet-staged")


def partial_path(binary: Path) -> Path:
    """The download in progress (hidden, same directory, so the final rename is atomic)."""
    return binary.with_name(f".{binary.name}.fleet-part")


def rollback_path(binary: Path) -> Path:
    """The binary that was installed before this request's apply (a hard link)."""
    return binary.with_name(f".{binary.name}.fleet-rollback")
