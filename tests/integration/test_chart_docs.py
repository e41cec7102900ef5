"""docs/operations.md, run: every block marked ``<!-- exercised: mgmt|workload -->`` is
executed verbatim with bash, in document order, against the test world (helm is the
pinned one; kubectl is whatever the machine has), and the state after each section is
checked through the client layer.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
import yaml

from fleet.kube import KubeClient
from fleet.kube.resources import (
    CONFIGMAPS,
    FLEET_UPGRADES,
    K0S_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    NAMESPACES,
    NODE_PLANS,
)
from fleet.rollout.annotations import ANN_PAUSED, ROLLOUT_CONFIGMAP, switch
from fleet.testing.binaries import REPO_ROOT, binary
from fleet.testing.capi import K0S_CONFIG_SPEC, infrastructure_template_ref
from fleet.testing.world import World
from fleet.world.model import ANN_RETRY
from tests.helpers.charts import DAEMONSETS, DEPLOYMENTS, helm_env, kubeconfig_file

pytestmark = pytest.mark.anyio

DOC = REPO_ROOT / "docs" / "operations.md"
MARK = re.compile(r"^## (?P<section>[^\n]+)$|<!-- exercised: (?P<where>mgmt|workload) -->\n"
                  r"```sh\n(?P<code>.*?)```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    section: str
    where: str
    code: str


def exercised_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    section = ""
    for m in MARK.finditer(text):
        if m["section"]:
            section = m["section"].strip()
        else:
            blocks.append(Block(section, m["where"], m["code"]))
    return blocks


def test_the_guide_marks_its_blocks() -> None:
    sections = [b.section for b in exercised_blocks(DOC.read_text())]
    for expected in ("Install the controller (management cluster)",
                     "Install the agent (each workload cluster)", "Configure the fleet YAML",
                     "Roll a version", "Watch it", "Pause", "Recover from a failed node",
                     "Uninstall"):
        assert expected in sections


async def _md_and_kcp(mgmt: KubeClient) -> None:
    """The CAPI objects the guide's examples name (as CAPI would have created them)."""
    await mgmt.create(NAMESPACES, {"metadata": {"name": "fleet-prod"}})
    await mgmt.create(MACHINE_DEPLOYMENTS, {
        "metadata": {"name": "edge-01-workers", "namespace": "fleet-prod"},
        "spec": {"clusterName": "edge-01", "replicas": 2,
                 "selector": {"matchLabels": {"md": "edge-01-workers"}},
                 "template": {"metadata": {"labels": {"md": "edge-01-workers"}},
                              "spec": {"clusterName": "edge-01", "version": "v1.31.3+k0s.0",
                                       "bootstrap": {"configRef": {
                                           "apiGroup": "bootstrap.cluster.x-k8s.io",
                                           "kind": "K0sWorkerConfigTemplate",
                                           "name": "edge-01-workers"}},
                                       "infrastructureRef": {
                                           "apiGroup": "infrastructure.k0s-fleet.test",
                                           "kind": "SimMachineTemplate",
                                           "name": "edge-01-workers"}}}}})
    await mgmt.create(K0S_CONTROL_PLANES, {
        "metadata": {"name": "edge-01", "namespace": "fleet-prod"},
        "spec": {"version": "v1.31.3+k0s.0", "replicas": 3,
                 "machineTemplate": {"infrastructureRef": infrastructure_template_ref(
                     "edge-01")},
                 "k0sConfigSpec": K0S_CONFIG_SPEC}})


async def test_operations_guide_runs(crds_installed: World, mgmt: KubeClient,
                                     wl2: KubeClient, tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; the guide's helm commands are exercised by "
                    "test_chart_install.py")
    await _md_and_kcp(mgmt)
    work = tmp_path / "work"
    work.mkdir()
    (work / "charts").symlink_to(REPO_ROOT / "charts")
    configs = {"mgmt": kubeconfig_file(crds_installed["mgmt"], tmp_path),
               "workload": kubeconfig_file(crds_installed["wl2"], tmp_path)}
    base_env = {**helm_env(), "HOME": str(tmp_path / "home"),
                "PATH": f"{binary('helm').parent}{os.pathsep}{os.environ['PATH']}"}

    async def controller_installed() -> None:
        d = await mgmt.get(DEPLOYMENTS, "k0s-fleet", "k0s-fleet-system")
        assert d["spec"]["replicas"] == 2
        cm = await mgmt.get(CONFIGMAPS, "k0s-fleet", "k0s-fleet-system")
        fleet = yaml.safe_load(cm["data"]["fleet.yaml"])
        assert [w["name"] for w in fleet["rollout"]["waves"]] == ["canary", "production"]
        # What the controller does first when it starts (there is no kubelet to run it).
        await mgmt.create(CONFIGMAPS, {"metadata": {"name": ROLLOUT_CONFIGMAP}},
                          "k0s-fleet-system")

    async def agent_installed() -> None:
        ds = await wl2.get(DAEMONSETS, "k0s-fleet-agent", "k0s-fleet-agent")
        assert ds["spec"]["template"]["spec"]["hostPID"] is True

    async def reconfigured() -> None:
        cm = await mgmt.get(CONFIGMAPS, "k0s-fleet", "k0s-fleet-system")
        assert yaml.safe_load(cm["data"]["fleet.yaml"])["rollout"]["maxConcurrentClusters"] == 3

    async def version_asked() -> None:
        fu = await mgmt.get(FLEET_UPGRADES, "k0s-v1-32-1", "k0s-fleet-system")
        assert fu["spec"] == {"version": "v1.32.1+k0s.0"}
        # Nobody edits the objects' versions by hand any more (the controller writes them).
        md = await mgmt.get(MACHINE_DEPLOYMENTS, "edge-01-workers", "fleet-prod")
        assert md["spec"]["template"]["spec"]["version"] == "v1.31.3+k0s.0"
        kcp = await mgmt.get(K0S_CONTROL_PLANES, "edge-01", "fleet-prod")
        assert kcp["spec"]["version"] == "v1.31.3+k0s.0"

    async def nodeplans_listable() -> None:
        await mgmt.list(NODE_PLANS, "fleet-prod")

    async def paused() -> None:
        cm = await mgmt.get(CONFIGMAPS, ROLLOUT_CONFIGMAP, "k0s-fleet-system")
        assert switch(cm["metadata"]["annotations"], ANN_PAUSED) == "change freeze until Monday"
        md = await mgmt.get(MACHINE_DEPLOYMENTS, "edge-01-workers", "fleet-prod")
        assert switch(md["metadata"]["annotations"], ANN_PAUSED) == ""

    async def retried() -> None:
        md = await mgmt.get(MACHINE_DEPLOYMENTS, "edge-01-workers", "fleet-prod")
        assert md["metadata"]["annotations"][ANN_RETRY].isdigit()

    async def uninstalled() -> None:
        assert await mgmt.get_or_none(DEPLOYMENTS, "k0s-fleet", "k0s-fleet-system") is None
        assert await wl2.get_or_none(DAEMONSETS, "k0s-fleet-agent", "k0s-fleet-agent") is None

    checks: dict[str, Callable[[], Awaitable[None]]] = {
        "Install the controller (management cluster)": controller_installed,
        "Install the agent (each workload cluster)": agent_installed,
        "Configure the fleet YAML": reconfigured,
        "Roll a version": version_asked,
        "Watch it": nodeplans_listable,
        "Recover from a failed node": retried,
        "Pause": paused,
        "Uninstall": uninstalled,
    }
    blocks = exercised_blocks(DOC.read_text())
    for i, block in enumerate(blocks):
        env = {**base_env, "KUBECONFIG": str(configs[block.where])}
        proc = await anyio.to_thread.run_sync(lambda b=block, e=env: subprocess.run(  # type: ignore[misc]
            ["bash", "-euo", "pipefail", "-c", b.code], cwd=work, env=e, capture_output=True,
            text=True, timeout=120, check=False))
        assert proc.returncode == 0, (
            f"docs/operations.md, '{block.section}' block:\n{block.code}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        last_of_section = i + 1 == len(blocks) or blocks[i + 1].section != block.section
        if last_of_section:
            await checks[block.section]()
