"""Where the pinned Go-built binaries (kube-apiserver, etcd, helm, CAPI managers) are found."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PINS_FILE = REPO_ROOT / "hack" / "testenv" / "pins.env"


class MissingBinaryError(RuntimeError):
    pass


def cache_dir() -> Path:
    cache = os.environ.get("K0S_FLEET_CACHE") or str(Path.home() / ".cache" / "k0s-fleet")
    return Path(cache)


def bin_dir() -> Path:
    env = os.environ.get("K0S_FLEET_BIN")
    if env:
        return Path(env)
    return cache_dir() / "bin"


def binary(name: str) -> Path:
    path = bin_dir() / name
    if not os.access(path, os.X_OK):
        raise MissingBinaryError(
            f"{name} not found at {path}; build the test world with `make testenv` "
            "(hack/testenv/build.sh)"
        )
    return path


def pins() -> dict[str, str]:
    """The ``NAME=value`` lines of hack/testenv/pins.env."""
    out: dict[str, str] = {}
    for raw in PINS_FILE.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def capi_data_dir(version: str) -> Path:
    """The CRDs (``crds/``) and webhook configurations (``webhook/``) of CAPI ``version``,
    copied from its Go module by hack/testenv/build.sh."""
    path = cache_dir() / "capi" / version
    if not (path / "crds").is_dir():
        raise MissingBinaryError(
            f"Cluster API {version} CRDs not found at {path}; build the test world with "
            "`make testenv` (hack/testenv/build.sh)")
    return path
