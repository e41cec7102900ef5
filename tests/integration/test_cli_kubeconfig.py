"""`k0s-fleet upgrade` as a real subprocess against the test world with nothing but the
environment a kubectl user has (#31): only $KUBECONFIG set (a merged list), --context, and
-n/--namespace naming a namespace no controller runs in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from fleet.cli.exit import Exit
from fleet.kube import KubeClient
from fleet.kube.resources import CONFIGMAPS, FLEET_UPGRADES
from fleet.rollout.annotations import ROLLOUT_CONFIGMAP
from fleet.testing.binaries import REPO_ROOT
from fleet.testing.world import World

VERSION = "v1.31.3+k0s.0"


def kubectl_env(home: Path, kubeconfig: str) -> dict[str, str]:
    """The caller's environment minus anything k0s-fleet or client-go would read besides
    $KUBECONFIG (no fleet YAML, no K0S_FLEET_* overrides, not in a Pod, an empty home)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("K0S_FLEET_", "KUBERNETES_SERVICE_")) and k != "KUBECONFIG"}
    return {**env, "HOME": str(home), "KUBECONFIG": kubeconfig, "COLUMNS": "200"}


async def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    return await anyio.run_process([sys.executable, "-m", "fleet.cli", *args],
                                   cwd=REPO_ROOT, check=False, env=env)


async def mark_controller_namespace(mgmt: KubeClient, namespace: str) -> None:
    """What a running controller leaves in its namespace (fleet/rollout/coordinator.py)."""
    await mgmt.create(CONFIGMAPS, {
        "metadata": {"name": ROLLOUT_CONFIGMAP, "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "k0s-fleet"}},
        "data": {}}, namespace)


def broken_kubeconfig() -> dict[str, Any]:
    """A kubeconfig whose current context points at nothing (port 1 on loopback)."""
    return {"apiVersion": "v1", "kind": "Config", "current-context": "broken",
            "clusters": [{"name": "broken", "cluster": {"server": "https://127.0.0.1:1"}}],
            "users": [{"name": "broken", "user": {"token": "nothing"}}],
            "contexts": [{"name": "broken", "context": {"cluster": "broken",
                                                        "user": "broken"}}]}


@pytest.mark.anyio
async def test_upgrade_with_only_kubeconfig_env(world: World, mgmt: KubeClient,
                                                namespace: str, tmp_path: Path) -> None:
    await mark_controller_namespace(mgmt, namespace)
    # A two-file $KUBECONFIG: the first file missing (skipped, as kubectl does).
    kc = world["mgmt"].write_kubeconfig(tmp_path / "mgmt.yaml")
    env = kubectl_env(tmp_path, os.pathsep.join([str(tmp_path / "absent.yaml"), str(kc)]))
    r = await cli(env, "upgrade", VERSION, "-n", namespace, "--no-wait")
    assert r.returncode == Exit.OK, r.stderr.decode()
    assert f"in {namespace}" in r.stderr.decode()
    fu = await mgmt.get(FLEET_UPGRADES, "upgrade-v1.31.3-k0s.0", namespace)
    assert fu["spec"]["version"] == VERSION
    # plan and status the same way, as YAML.
    for command in (["plan"], ["status", "--once"]):
        r = await cli(env, *command, "-n", namespace, "-o", "yaml")
        assert r.returncode == Exit.OK, r.stderr.decode()
        doc = yaml.safe_load(r.stdout)
        assert isinstance(doc, dict) and doc, r.stdout.decode()
    # Following it with no controller to move it: --timeout passes, exit 3 (not 4,
    # which is the controller's lost Lease), each status as a YAML document.
    r = await cli(env, "upgrade", VERSION, "-n", namespace, "--timeout", "1s", "-o", "yaml")
    assert r.returncode == 3, r.stderr.decode()
    assert "not complete after 1s" in r.stderr.decode()


@pytest.mark.anyio
async def test_upgrade_into_a_namespace_without_controller_exits_2(
        world: World, mgmt: KubeClient, namespace: str, tmp_path: Path) -> None:
    kc = world["mgmt"].write_kubeconfig(tmp_path / "mgmt.yaml")
    env = kubectl_env(tmp_path, str(kc))
    r = await cli(env, "upgrade", VERSION, "-n", namespace, "--no-wait")
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert f"no k0s-fleet controller in namespace {namespace!r}" in err
    assert "-n/--namespace" in err and "--force" in err
    assert (await mgmt.list(FLEET_UPGRADES, namespace)).items == []
    # --force writes it anyway.
    r = await cli(env, "upgrade", VERSION, "-n", namespace, "--no-wait", "--force")
    assert r.returncode == Exit.OK, r.stderr.decode()
    assert len((await mgmt.list(FLEET_UPGRADES, namespace)).items) == 1


@pytest.mark.anyio
async def test_context_selects_the_context(world: World, mgmt: KubeClient, namespace: str,
                                           tmp_path: Path) -> None:
    await mark_controller_namespace(mgmt, namespace)
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(broken_kubeconfig()))
    real = world["mgmt"].write_kubeconfig(tmp_path / "mgmt.yaml")
    # The merged list's current-context is the first file's: the broken one.
    env = kubectl_env(tmp_path, os.pathsep.join([str(broken), str(real)]))
    r = await cli(env, "upgrade", VERSION, "-n", namespace, "--no-wait")
    assert r.returncode == Exit.FAILED, r.stderr.decode()
    assert (await mgmt.list(FLEET_UPGRADES, namespace)).items == []
    r = await cli(env, "upgrade", VERSION, "-n", namespace, "--no-wait",
                  "--context", world["mgmt"].name)
    assert r.returncode == Exit.OK, r.stderr.decode()
    assert len((await mgmt.list(FLEET_UPGRADES, namespace)).items) == 1
    # An unknown context is bad input.
    r = await cli(env, "upgrade", VERSION, "-n", namespace, "--context", "nope")
    assert r.returncode == Exit.BAD_CONFIG, r.stderr.decode()
    assert "nope" in r.stderr.decode()
