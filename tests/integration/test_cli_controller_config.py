"""`k0s-fleet plan`, `status` and `upgrade --dry-run` judge by the fleet YAML the controller
runs with (#31): the chart's ConfigMap, rendered by the real helm from values.fleet and
applied to the test world's management API server; a version previewed before anyone asks
for it writes nothing (no resourceVersion moves, no FleetUpgrade), shows the ladder and
every refusal of k0s's version skew policy (#30) and exits 1 when it would be refused. Only
$KUBECONFIG is set, and its context names the controller's namespace (no -n)."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from fleet.cli.exit import Exit
from fleet.contract.nodeplan import build_nodeplan
from fleet.kube import KubeClient
from fleet.kube.resources import (
    CLUSTERS,
    CONFIGMAPS,
    DEPLOYMENTS,
    FLEET_UPGRADES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    NODES,
    SECRETS,
)
from fleet.testing.binaries import REPO_ROOT
from fleet.testing.world import World
from fleet.world.model import format_time
from tests.helpers.charts import CONTROLLER_CHART, render
from tests.helpers.waves import CANARY, OLD, PROD, WAVES, FleetCluster, make_cluster
from tests.integration.test_cli_kubeconfig import (
    VERSION,
    cli,
    kubectl_env,
    mark_controller_namespace,
)

RUNG = "v1.32.4+k0s.0"  # the one v1.32 release the controller's fleet YAML offers
TWO_MINORS = "v1.33.1+k0s.0"


def context_kubeconfig(world: World, path: Path, namespace: str) -> Path:
    """The management kubeconfig with the controller's namespace set on its context."""
    kc = world["mgmt"].kubeconfig()
    kc["contexts"][0]["context"]["namespace"] = namespace
    path.write_text(yaml.safe_dump(kc))
    return path


async def install_chart_config(mgmt: KubeClient, namespace: str, tmp_path: Path
                               ) -> tuple[str, str]:
    """The chart's ConfigMap and Deployment as `helm template` renders them for a release
    in ``namespace`` (created there, as `helm install` would; no Pod runs here): the
    rollout's waves and a release list the default config does not have."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"fleet": {
        "clusters": {"namespaces": [namespace]},
        "rollout": {"waves": WAVES},
        "download": {"allowUnverified": True, "releases": [RUNG]}}}))
    manifest = render(CONTROLLER_CHART, values, release="k0s-fleet", namespace=namespace)
    (cm,) = [d for d in manifest.all("ConfigMap") if "fleet.yaml" in d.get("data", {})]
    await mgmt.create(CONFIGMAPS, cm, namespace)
    deploy = manifest.one("Deployment")
    await mgmt.create(DEPLOYMENTS, deploy, namespace)
    return str(cm["metadata"]["name"]), str(deploy["metadata"]["name"])


async def resource_versions(mgmt: KubeClient, namespace: str,
                            clusters: list[FleetCluster]) -> dict[tuple[str, str], str]:
    """Every object a dry run could touch, by (kind, name): its resourceVersion."""
    out: dict[tuple[str, str], str] = {}
    for res in (CLUSTERS, MACHINE_DEPLOYMENTS, MACHINE_SETS, MACHINES, CONFIGMAPS, SECRETS,
                FLEET_UPGRADES, NODE_PLANS):
        for o in (await mgmt.list(res, namespace)).items:
            out[(res.kind, o["metadata"]["name"])] = o["metadata"]["resourceVersion"]
    for c in clusters:
        for m in c.machines:
            node = await c.wl.get(NODES, m)
            out[("Node", m)] = node["metadata"]["resourceVersion"]
    return out


def ok(r: subprocess.CompletedProcess[bytes], code: int = Exit.OK) -> str:
    assert r.returncode == code, (r.returncode, r.stdout.decode(), r.stderr.decode())
    return r.stdout.decode()


def clusters_of(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{c['namespace']}/{c['name']}": c for w in doc["waves"] for c in w["clusters"]}


@pytest.mark.anyio
async def test_plan_status_and_dry_run_use_the_controller_s_config(  # noqa: PLR0917
        world: World, mgmt: KubeClient, wl1: KubeClient, wl2: KubeClient, namespace: str,
        tmp_path: Path) -> None:
    cm_name, deployment = await install_chart_config(mgmt, namespace, tmp_path)
    await mark_controller_namespace(mgmt, namespace)
    clusters = [
        await make_cluster(mgmt, world["wl1"], wl1, namespace, "can", labels=CANARY),
        await make_cluster(mgmt, world["wl2"], wl2, namespace, "prod", labels=PROD,
                           workers=1),
    ]
    env = kubectl_env(tmp_path, str(context_kubeconfig(world, tmp_path / "kc.yaml",
                                                       namespace)))
    source = (f"ConfigMap {namespace}/{cm_name} with the chart's settings from Deployment "
              f"{deployment} (controller's)")

    # plan: the controller's waves (the defaults have only "default"), said so.
    doc = json.loads(ok(await cli(env, "plan", "-o", "json")))
    assert doc["config"] == {"source": source, "namespace": namespace}
    assert [w["name"] for w in doc["waves"]] == ["canary", "prod", "default"]
    text = ok(await cli(env, "plan", "-o", "wide"))
    assert text.startswith(f"config: {source}; namespace {namespace} (the kubeconfig "
                           "context's namespace)"), text
    assert f"cluster {namespace}/can" in text
    assert "executor paused-in-place  step -  node -  in step -" in text, text
    r = await cli(env, "status", "--once", "-o", "wide")
    assert f"config: {source}" in ok(r)
    assert "in step" in r.stdout.decode()  # the wide columns

    # upgrade --dry-run two minors ahead: the ladder through the release the controller's
    # fleet YAML offers, node order and executors; nothing written anywhere.
    before = await resource_versions(mgmt, namespace, clusters)
    doc = json.loads(ok(await cli(env, "upgrade", TWO_MINORS, "--dry-run", "-o", "json")))
    assert doc["config"]["source"] == source
    assert doc["preview"]["clusters"] == [f"{namespace}/can", f"{namespace}/prod"]
    assert doc["refusals"] == []
    by_name = clusters_of(doc)
    for key in (f"{namespace}/can", f"{namespace}/prod"):
        assert by_name[key]["ladder"] == [RUNG, TWO_MINORS], by_name[key]
        (md,) = by_name[key]["objects"]
        assert md["executor"] == "paused-in-place" and md["executorReason"]
    # the canary wave first, one node at a time (maxUnavailable 1), then prod
    order = [(s["cluster"], n) for s in doc["steps"] for n in s["nodes"]]
    assert [c for c, _ in order][:2] == [f"{namespace}/can"] * 2, order
    assert {n for _, n in order} >= set(clusters[0].machines + clusters[1].machines)
    assert await resource_versions(mgmt, namespace, clusters) == before
    assert (await mgmt.list(FLEET_UPGRADES, namespace)).items == []

    # A missing rung is refused before any write: exit 1, the rule and the versions.
    r = await cli(env, "upgrade", "v1.34.0+k0s.0", "--dry-run")
    text = ok(r, Exit.FAILED)
    assert "refused by k0s's version skew policy" in text
    assert "MissingRung: " in text and "v1.33" in text, text
    assert "ladder" not in text
    assert "k0s's version skew policy refuses 2 cluster(s)" in r.stderr.decode()

    # A downgrade, previewed for the canary ring only (YAML).
    r = await cli(env, "upgrade", "v1.30.5+k0s.0", "--dry-run", "-l",
                  "k0s-fleet.io/ring=canary", "-o", "yaml")
    doc = yaml.safe_load(ok(r, Exit.FAILED))
    assert doc["preview"]["clusters"] == [f"{namespace}/can"]
    (refusal,) = doc["refusals"]
    assert refusal["cluster"] == f"{namespace}/can" and refusal["rule"] == "NoDowngrade"
    assert OLD in refusal["message"] and "v1.30.5+k0s.0" in refusal["message"]

    # plan --version previews the same way; a selector matching nothing exits 1.
    r = await cli(env, "plan", "--version", RUNG, "-l", "ring=nowhere")
    ok(r, Exit.FAILED)
    assert "would select no cluster" in r.stderr.decode()
    doc = json.loads(ok(await cli(env, "plan", "--version", RUNG, "-o", "json")))
    assert doc["preview"]["version"] == RUNG and doc["refusals"] == []
    assert await resource_versions(mgmt, namespace, clusters) == before
    assert (await mgmt.list(FLEET_UPGRADES, namespace)).items == []

    # --config stays for offline use, and says so.
    local = tmp_path / "fleet.yaml"
    local.write_text(yaml.safe_dump({"clusters": {"namespaces": [namespace]}}))
    doc = json.loads(ok(await cli(env, "plan", "--config", str(local), "-o", "json")))
    assert doc["config"]["source"] == f"--config {local} (local)"
    assert [w["name"] for w in doc["waves"]] == ["default"]


@pytest.mark.anyio
async def test_namespace_without_controller_config_uses_defaults_and_says_so(
        world: World, mgmt: KubeClient, namespace: str, tmp_path: Path) -> None:
    # the context names another namespace; -n wins over it
    env = {**kubectl_env(tmp_path, str(context_kubeconfig(world, tmp_path / "kc.yaml",
                                                          "elsewhere"))),
           "K0S_FLEET_CLUSTERS__NAMESPACES": f"[{namespace}]"}
    r = await cli(env, "status", "--once", "-o", "json", "-n", namespace)
    ok(r)
    assert (f"config: defaults (no controller config found in namespace {namespace!r}); "
            f"namespace {namespace} (-n/--namespace)") in r.stderr.decode()
    # the dry run checks for a controller as the upgrade does: exit 2 without one
    r = await cli(env, "upgrade", RUNG, "--dry-run", "-n", namespace)
    assert r.returncode == Exit.BAD_CONFIG, r.stderr.decode()
    assert f"no k0s-fleet controller in namespace {namespace!r}" in r.stderr.decode()


async def nodeplan(mgmt: KubeClient, namespace: str, cluster: str, machine: str,
                   status: dict[str, Any]) -> None:
    body = build_nodeplan(
        machine={"metadata": {"name": machine, "namespace": namespace,
                              "uid": str(uuid.uuid4())}, "spec": {"clusterName": cluster}},
        node_name=machine, role="worker", version=VERSION, url="https://mirror.invalid/k0s",
        sha256=None, allow_unverified=True)
    await mgmt.create(NODE_PLANS, body, namespace)
    await mgmt.patch(NODE_PLANS, body["metadata"]["name"], {"status": status}, namespace,
                     subresource="status")


@pytest.mark.anyio
async def test_upgrade_s_progress_view_as_plain_lines(world: World, mgmt: KubeClient,
                                                      namespace: str, tmp_path: Path) -> None:
    """Not on a terminal, each progress line is followed by the view's cluster lines: the
    node in flight with its step and time in it (from its NodePlan on the API server), and
    an ETA from the node time seen (another NodePlan's start to completion)."""
    await mark_controller_namespace(mgmt, namespace)
    env = kubectl_env(tmp_path, str(world["mgmt"].write_kubeconfig(tmp_path / "kc.yaml")))
    ok(await cli(env, "upgrade", VERSION, "-n", namespace, "--no-wait"))
    now = datetime.now(UTC)

    def ago(seconds: int) -> str:
        return format_time(now - timedelta(seconds=seconds))

    await nodeplan(mgmt, namespace, "c1", "c1-0", {
        "phase": "Completed", "nodeState": "Completed", "startedAt": ago(300),
        "phaseSince": ago(180), "completedAt": ago(180)})
    await nodeplan(mgmt, namespace, "c1", "c1-1", {
        "phase": "InProgress", "nodeState": "Downloading", "startedAt": ago(60),
        "phaseSince": ago(42)})
    # what the controller would have written (no controller runs here)
    await mgmt.patch(FLEET_UPGRADES, "upgrade-v1.31.3-k0s.0", {"status": {
        "observedGeneration": 1, "phase": "Progressing", "summary": "0/1", "nodesTotal": 3,
        "nodesUpToDate": 1, "clustersTotal": 1, "clustersComplete": 0,
        "waves": [{"name": "default", "phase": "Progressing", "clusters": 1, "complete": 0,
                   "upgrading": 1, "failed": 0, "message": ""}],
        "clusters": [{"namespace": namespace, "name": "c1", "wave": "default",
                      "phase": "Upgrading", "nodes": "1/3", "message": ""}]}},
        namespace, subresource="status")
    # the step's age: 42 s when written, past a minute on a loaded machine (1m00s)
    cluster_line = (rf"  {namespace}/c1  Upgrading +1/3  c1-1 Downloading (\d+m)?\d+s  "
                    r"ETA ~\d+m\d\ds")
    r = await cli(env, "upgrade", VERSION, "-n", namespace, "--timeout", "2s")
    out = ok(r, Exit.NOT_DONE).splitlines()
    assert out[0] == "Progressing: 0/1 clusters, 1/3 nodes [default Progressing 0/1]", out
    assert out[1] == "wave default Progressing 0/1", out
    assert re.fullmatch(cluster_line, out[2]), out

    # On a terminal the same view is redrawn in place, once a second: each frame after the
    # first moves the cursor back over the previous one and clears to the end.
    code, screen = await on_a_terminal(env, "upgrade", VERSION, "-n", namespace,
                                       "--timeout", "5s")
    assert code == Exit.NOT_DONE, screen
    frames = screen.split("\x1b[3F\x1b[J")
    assert len(frames) >= 2, screen
    for frame in frames:
        lines = frame.replace("\r\n", "\n").splitlines()
        assert lines[0].startswith("Progressing: 0/1 clusters, 1/3 nodes  ETA ~"), screen
        assert lines[1] == "wave default Progressing 0/1", screen
        assert re.fullmatch(cluster_line, lines[2]), screen


async def on_a_terminal(env: dict[str, str], *args: str) -> tuple[int, str]:
    """The CLI with its stdout on a pseudo-terminal: exit code and what it wrote there."""
    master, slave = pty.openpty()
    try:
        proc = await anyio.open_process([sys.executable, "-m", "fleet.cli", *args],
                                        cwd=REPO_ROOT, env={**env, "TERM": "xterm"},
                                        stdout=slave, stderr=subprocess.DEVNULL)
    finally:
        os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:  # until the child has closed its end (EIO)
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    try:
        async with proc:
            await anyio.to_thread.run_sync(drain)
            code = await proc.wait()
    finally:
        os.close(master)
    return code, b"".join(chunks).decode()
