"""`k0s-fleet controller` (the real entry point) serves the runtime extension over TLS."""

from __future__ import annotations

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
