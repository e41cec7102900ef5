"""Pure helpers of the UpdateMachine service: role, owner, node name, download policy."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from fleet.config import DownloadSettings
from fleet.extension.update import (
    ArtifactError,
    ArtifactRequest,
    ConfigArtifacts,
    machine_owner,
    machine_role,
    node_name_of,
)

DIGEST = "a" * 64


def machine(labels: dict[str, str] | None = None, refs: list[dict[str, object]] | None = None,
            node: str | None = None) -> dict[str, object]:
    m: dict[str, object] = {"metadata": {"name": "m1", "namespace": "ns", "labels": labels or {},
                                         "ownerReferences": refs or []},
                            "spec": {"clusterName": "c1"}}
    if node:
        m["status"] = {"nodeRef": {"name": node}}
    return m


def test_role_owner_and_node_name() -> None:
    worker = machine({"cluster.x-k8s.io/deployment-name": "md-0"},
                     [{"kind": "MachineSet", "name": "md-0-abc", "controller": True}])
    assert machine_role(worker) == "worker"
    assert machine_owner(worker) == ("MachineDeployment", "md-0")
    cp = machine({"cluster.x-k8s.io/control-plane": ""},
                 [{"kind": "K0sControlPlane", "name": "cp", "controller": True}])
    assert machine_role(cp) == "controller"
    assert machine_owner(cp) == ("K0sControlPlane", "cp")
    lone = machine(refs=[{"kind": "MachineSet", "name": "ms", "controller": True}])
    assert machine_owner(lone) == ("MachineSet", "ms")
    assert machine_owner(machine()) == ("", "")
    assert node_name_of(machine(node="ip-10-0-0-1")) == "ip-10-0-0-1"
    assert node_name_of(machine()) == "m1"


def req(arch: str | None = "amd64") -> ArtifactRequest:
    return ArtifactRequest(machine={}, version="v1.32.1-k0s.0", role="worker", architecture=arch)


@pytest.mark.anyio
async def test_config_artifacts_follow_the_fleet_download_policy() -> None:
    with pytest.raises(ArtifactError, match="no sha256"):
        await ConfigArtifacts()(req())
    pinned = ConfigArtifacts(DownloadSettings(digests={"v1.32.1+k0s.0": {"arm64": DIGEST}}))
    a = await pinned(req("arm64"))
    assert a.url == "https://get.k0sproject.io/v1.32.1+k0s.0/k0s-v1.32.1+k0s.0-arm64"
    assert a.sha256 == DIGEST and not a.allow_unverified
    with pytest.raises(ArtifactError, match="architecture"):
        await pinned(req("riscv64"))
    loose = await ConfigArtifacts(DownloadSettings(allow_unverified=True))(req(None))
    assert loose.sha256 is None and loose.allow_unverified and loose.url.endswith("-amd64")

    async def fetch(url: str) -> Mapping[str, str]:
        assert url == "https://example.com/v1.32.1+k0s.0/sha256sums.txt"
        return {"k0s-v1.32.1+k0s.0-amd64": DIGEST}

    listed = ConfigArtifacts(DownloadSettings(
        digest_manifest_url="https://example.com/{version}/sha256sums.txt"), fetch)
    assert (await listed(req())).sha256 == DIGEST

    async def broken(url: str) -> Mapping[str, str]:
        raise OSError("connection refused")

    with pytest.raises(ArtifactError, match="connection refused"):
        await ConfigArtifacts(DownloadSettings(
            digest_manifest_url="https://example.com/{version}/sha256sums.txt"), broken)(req())
