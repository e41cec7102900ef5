"""`k0s-fleet controller` (the real entry point) serves the runtime extension over TLS."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import anyio
import pytest
import yaml

from fleet.extension.catalog import DISCOVERY_PATH
from fleet.extension.selfsigned import make_cert_pair
from fleet.testing.binaries import REPO_ROOT
from fleet.testing.world import World, free_port

pytestmark = pytest.mark.anyio

DISCOVERY = {"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
             "kind": "DiscoveryRequest"}


async def test_controller_process_serves_hooks_over_tls_only(
        world: World, namespace: str, tmp_path: Path) -> None:
    kubeconfig = world["mgmt"].write_kubeconfig(tmp_path / "mgmt.yaml")
    cert, key, ca = make_cert_pair(["localhost", "127.0.0.1"]).write(tmp_path / "tls")
    ext_port, status_port = free_port(), free_port()
    cfg_file = tmp_path / "fleet.yaml"
    cfg_file.write_text(yaml.safe_dump({
        "management": {"namespace": namespace, "kubeconfig": str(kubeconfig)},
        "clusters": {"namespaces": [namespace]},
        "status": {"port": status_port},
        "extension": {"enabled": True, "port": ext_port, "certFile": str(cert),
                      "keyFile": str(key)}}))
    log = (tmp_path / "controller.log").open("wb")
    proc = await anyio.open_process(
        [sys.executable, "-m", "fleet.cli", "controller", "--config", str(cfg_file),
         "--no-leader-elect"], cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=log)
    tls = ssl.create_default_context(cafile=str(ca))
    try:
        async with aiohttp.ClientSession() as s:
            with anyio.fail_after(30):
                while True:
                    try:
                        async with s.post(f"https://localhost:{ext_port}{DISCOVERY_PATH}",
                                          json=DISCOVERY, ssl=tls) as r:
                            doc = await r.json()
                            break
                    except aiohttp.ClientConnectionError:
                        assert proc.returncode is None, (tmp_path / "controller.log").read_text()
                        await anyio.sleep(0.1)
            assert doc["status"] == "Success"
            hooks = {h["requestHook"]["hook"] for h in doc["handlers"]}
            assert hooks == {"CanUpdateMachine", "CanUpdateMachineSet", "UpdateMachine"}
            # The same port refuses plain HTTP.
            with pytest.raises(aiohttp.ClientError):
                async with s.post(f"http://127.0.0.1:{ext_port}{DISCOVERY_PATH}",
                                  json=DISCOVERY) as r:
                    await r.read()
    finally:
        proc.terminate()
        with anyio.fail_after(15):
            await proc.wait()
        log.close()


@pytest.mark.parametrize("endpoint", ["status", "extension"])
async def test_a_port_already_taken_is_named_and_the_controller_exits(
        world: World, namespace: str, tmp_path: Path, endpoint: str) -> None:
    """Another process holds the endpoint's port: the controller exits (1) with one line
    naming the endpoint, its setting and the address, not a task group's traceback."""
    kubeconfig = world["mgmt"].write_kubeconfig(tmp_path / "mgmt.yaml")
    cert, key, _ = make_cert_pair(["localhost", "127.0.0.1"]).write(tmp_path / "tls")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        ports = {"status": port if endpoint == "status" else free_port(),
                 "extension": port if endpoint == "extension" else free_port()}
        cfg_file = tmp_path / "fleet.yaml"
        cfg_file.write_text(yaml.safe_dump({
            "management": {"namespace": namespace, "kubeconfig": str(kubeconfig)},
            "clusters": {"namespaces": [namespace]},
            "status": {"port": ports["status"]},
            "extension": {"enabled": True, "port": ports["extension"],
                          "certFile": str(cert), "keyFile": str(key)}}))
        with anyio.fail_after(60):
            done = await anyio.run_process(
                [sys.executable, "-m", "fleet.cli", "controller", "--config", str(cfg_file),
                 "--no-leader-elect"], cwd=REPO_ROOT, check=False)
    err = done.stderr.decode()
    assert done.returncode == 1, err
    setting = "status.port" if endpoint == "status" else "extension.port"
    lines = [line for line in err.splitlines() if setting in line]
    assert len(lines) == 1, err
    assert f"cannot listen on 0.0.0.0:{port} ({setting})" in lines[0]
    assert "in use" in lines[0]
    assert "Traceback" not in err
