"""Where the pinned Go-built binaries (kube-apiserver, etcd, helm) are found."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


class MissingBinaryError(RuntimeError):
    pass


def bin_dir() -> Path:
    env = os.environ.get("K0S_FLEET_BIN")
    if env:
        return Path(env)
    cache = os.environ.get("K0S_FLEET_CACHE") or str(Path.home() / ".cache" / "k0s-fleet")
    return Path(cache) / "bin"


def binary(name: str) -> Path:
    path = bin_dir() / name
    if not os.access(path, os.X_OK):
        raise MissingBinaryError(
            f"{name} not found at {path}; build the test world with `make testenv` "
            "(hack/testenv/build.sh)"
        )
    return path
