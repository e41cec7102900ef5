"""`k0s-fleet status` / `k0s-fleet plan` as real subprocesses against the test world, and
the controller's HTTP status serving the same document."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
import yaml
from aiohttp import web

from fleet.cli.status import fleet_status
from fleet.kube import KubeClient
from fleet.kube.resources import CONFIGMAPS, FLEET_UPGRADES, NODE_PLANS
from fleet.rollout.annotations import ROLLOUT_CONFIGMAP
from fleet.status.model import build_status
from fleet.status.server import StatusBoard, make_app, serve
from fleet.testing.binaries import REPO_ROOT
from fleet.testing.world import World, free_port
from tests.helpers.gate import CANARY as GATE_CANARY
from tests.helpers.gate import PROD, cluster, evaluate, waves_config
from tests.helpers.waves import (
    CANARY,
    T0,
    WAVES,
    RolloutDriver,
    ask_for,
    fleet_config,
    make_cluster,
)


async def _cli(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "200"}
    result = await anyio.run_process([sys.executable, "-m", "fleet.cli", *args],
                                     cwd=REPO_ROOT, check=False, env=env)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


@pytest.mark.anyio
async def test_status_and_plan_commands_and_http(  # noqa: PLR0917 (fixtures)
        world: World, mgmt: KubeClient, wl1: KubeClient, wl2: KubeClient, namespace: str,
        tmp_path: Path) -> None:
    clusters = [
        await make_cluster(mgmt, world["wl1"], wl1, namespace, "can", labels=CANARY),
        await make_cluster(mgmt, world["wl2"], wl2, namespace, "other", workers=1),
    ]
    await ask_for(mgmt, namespace)
    kubeconfig = world["mgmt"].write_kubeconfig(tmp_path / "mgmt.yaml")
    cfg_file = tmp_path / "fleet.yaml"
    cfg_file.write_text(yaml.safe_dump({
        "management": {"namespace": namespace, "kubeconfig": str(kubeconfig)},
        "clusters": {"namespaces": [namespace]}, "rollout": {"waves": WAVES},
        # the scripted nodes download nothing (without a digest the skew rules refuse the
        # FleetUpgrade's target before any write, and plan shows that instead)
        "download": {"allowUnverified": True}}))

    plan_doc = json.loads(await _cli("plan", "--config", str(cfg_file), "--output", "json",
                                     "--now", "2026-03-02T12:00:00Z"))
    assert [s["cluster"] for s in plan_doc["steps"]] == [
        f"{namespace}/can", f"{namespace}/can", f"{namespace}/other"]
    assert plan_doc["steps"][0]["unavailable"] == 1
    assert plan_doc["steps"][0]["maxUnavailable"] == 1
    # Nothing written by either command.
    assert await mgmt.get_or_none(CONFIGMAPS, ROLLOUT_CONFIGMAP, namespace) is None
    assert (await mgmt.list(NODE_PLANS, namespace)).items == []

    # The controller's passes (adopt, write the version, start a node, then one that
    # observes the NodePlan), then the status as the CLI, the library and the HTTP server
    # see it.
    config = fleet_config(namespace, str(kubeconfig), waves=WAVES)
    driver = RolloutDriver(mgmt, config, clusters)
    decision = await driver.settle()
    status = json.loads(await _cli("status", "--config", str(cfg_file), "--once",
                                   "--output", "json"))
    assert status["rollout"]["phase"] == "Progressing"
    assert status["summary"]["nodes"] == 3
    assert status["summary"]["nodesByState"]["Upgrading"] == 1
    waves = {w["name"]: w for w in status["waves"]}
    can = waves["canary"]["clusters"][0]
    assert can["phase"] == "Upgrading" and can["allowed"]
    other = waves["default"]["clusters"][0]
    assert not other["allowed"] and "waiting for wave canary" in other["reason"]
    text = await _cli("status", "--config", str(cfg_file), "--once")
    assert "wave canary" in text and f"{namespace}/other" in text

    board = StatusBoard()
    board.publish(decision, driver.progress)
    doc = board.status
    assert doc is not None
    app = make_app(board)
    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve(app, host="127.0.0.1", port=0,
                                                        task_status=task_status))
        url = f"http://127.0.0.1:{port}"
        via_url = json.loads(await _cli("status", "--url", url, "--output", "json"))
        assert via_url == doc
        async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
            metrics = await r.text()
        assert 'k0s_fleet_nodes{state="Upgrading"} 1.0' in metrics
        assert 'k0s_fleet_wave_phase{phase="Progressing",wave="canary"} 1.0' in metrics
        tg.cancel_scope.cancel()
    # The library call agrees with the controller's document on everything but time.
    again = await fleet_status(config, now=T0)
    assert again["waves"] == doc["waves"]


@pytest.mark.anyio
async def test_controller_process_serves_status_metrics_and_health(
        world: World, mgmt: KubeClient, namespace: str, tmp_path: Path) -> None:
    """`k0s-fleet controller` (the real entry point) serves the rollout status."""
    kubeconfig = world["mgmt"].write_kubeconfig(tmp_path / "mgmt.yaml")
    port = free_port()
    cfg_file = tmp_path / "fleet.yaml"
    cfg_file.write_text(yaml.safe_dump({
        "management": {"namespace": namespace, "kubeconfig": str(kubeconfig)},
        "clusters": {"namespaces": [namespace]}, "status": {"port": port},
        "rollout": {"waves": WAVES}, "download": {"allowUnverified": True}}))
    log = (tmp_path / "controller.log").open("wb")
    proc = await anyio.open_process(
        [sys.executable, "-m", "fleet.cli", "controller", "--config", str(cfg_file),
         "--no-leader-elect"], cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=log)
    try:
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as s:
            with anyio.fail_after(30):
                while True:
                    try:
                        async with s.get(f"{url}/status") as r:
                            if r.status == 200:
                                doc = await r.json()
                                break
                    except aiohttp.ClientError:
                        pass
                    await anyio.sleep(0.1)
            async with s.get(f"{url}/healthz") as r:
                assert r.status == 200
            async with s.get(f"{url}/readyz") as r:
                assert r.status == 200
            async with s.get(f"{url}/metrics") as r:
                assert "k0s_fleet_rollout_phase" in await r.text()
        assert doc["rollout"]["phase"] == "Complete"  # no clusters: nothing to do
        assert [w["name"] for w in doc["waves"]] == ["canary", "prod", "default"]
        assert await mgmt.get_or_none(CONFIGMAPS, ROLLOUT_CONFIGMAP, namespace) is not None
    finally:
        proc.terminate()
        with anyio.fail_after(15):
            await proc.wait()
        log.close()


@pytest.mark.anyio
async def test_upgrade_command_writes_the_intent_and_refuses_bad_input(
        world: World, mgmt: KubeClient, namespace: str, tmp_path: Path) -> None:
    kubeconfig = world["mgmt"].write_kubeconfig(tmp_path / "mgmt.yaml")
    cfg_file = tmp_path / "fleet.yaml"
    cfg_file.write_text(yaml.safe_dump({
        "management": {"namespace": namespace, "kubeconfig": str(kubeconfig)},
        "clusters": {"namespaces": [namespace]}}))
    # A controller's namespace (its rollout ConfigMap): k0s-fleet upgrade refuses others.
    await mgmt.create(CONFIGMAPS, {"metadata": {"name": ROLLOUT_CONFIGMAP,
                                                "namespace": namespace}}, namespace)
    await _cli("upgrade", "v1.31.3", "--config", str(cfg_file), "-l", "ring=canary,tier!=db",
               "--no-wait")
    fu = await mgmt.get(FLEET_UPGRADES, "upgrade-v1.31.3-k0s.0", namespace)
    assert fu["spec"]["version"] == "v1.31.3+k0s.0"
    assert fu["spec"]["clusterSelector"] == {
        "matchLabels": {"ring": "canary"},
        "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}
    # Asked again for another version under the same name: moved, not duplicated.
    await _cli("upgrade", "v1.31.4+k0s.0", "--name", "upgrade-v1.31.3-k0s.0",
               "--config", str(cfg_file), "--no-wait")
    fu = await mgmt.get(FLEET_UPGRADES, "upgrade-v1.31.3-k0s.0", namespace)
    assert fu["spec"] == {"version": "v1.31.4+k0s.0"}
    env = {**os.environ, "COLUMNS": "200"}
    bad = await anyio.run_process([sys.executable, "-m", "fleet.cli", "upgrade", "latest",
                                   "--config", str(cfg_file), "--no-wait"],
                                  cwd=REPO_ROOT, check=False, env=env)
    assert bad.returncode == 2 and b"not a k0s version: 'latest'" in bad.stderr


@pytest.mark.anyio
async def test_status_not_on_a_terminal_prints_a_view_per_change() -> None:
    """First hour (#31): `k0s-fleet status` piped (not a terminal) kept a live view that
    never reached the pipe. Now: plain lines, the view printed once and again only when the
    rollout changed (not for the clock), like `kubectl get --watch`."""
    cs = [cluster("can", "ug", labels=GATE_CANARY), cluster("p1", "ww", labels=PROD)]
    doc = build_status(evaluate(waves_config(), cs), cs)
    served: dict[str, Any] = {"doc": doc}
    requests = [0]
    polled = anyio.Event()

    async def status(_: web.Request) -> web.Response:
        requests[0] += 1
        if requests[0] >= 4:
            polled.set()
        return web.json_response(served["doc"])

    app = web.Application()
    app.router.add_get("/status", status)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    out = b""
    try:
        async with await anyio.open_process(
                [sys.executable, "-m", "fleet.cli", "status", "--url",
                 f"http://127.0.0.1:{port}", "--interval", "0.05s"],
                cwd=REPO_ROOT, env={**os.environ, "COLUMNS": "120"},
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
            assert proc.stdout is not None

            async def until(text: bytes) -> None:
                nonlocal out
                while text not in out:
                    assert proc.stdout is not None
                    out += await proc.stdout.receive()

            try:
                with anyio.fail_after(60):
                    await until(b"wave canary")
                    await polled.wait()  # polled again: the same rollout, a later clock
                    served["doc"] = {**doc, "generatedAt": "2030-01-01T00:00:00Z"}
                    requests[0] = 0
                    polled = anyio.Event()
                    await polled.wait()
                    served["doc"] = {**doc, "generatedAt": "2030-01-01T00:00:05Z",
                                     "rollout": {**doc["rollout"], "paused": "maintenance"}}
                    await until(b"PAUSED: maintenance")
            finally:
                proc.terminate()
    finally:
        await runner.cleanup()
    text = out.decode()
    assert "\x1b[" not in text, "terminal control sequences in a pipe"
    assert text.count("config: the controller's own") == 2, text
    assert text.count("fleet rollout") == 2, text
