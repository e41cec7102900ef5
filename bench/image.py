"""The image's size, and the controller's start-up inside it next to the same controller
started directly on the host.

    make image                                   # builds build/image/k0s-fleet-<v>.oci.tar
    .venv/bin/python bench/image.py --runs 5 [--json out.json]

Setup (tests/image/test_image.py's): a test world with one management API server, the
controller chart installed there by helm, its ServiceAccount's token. Each run, alternately:

- **container**: ``podman run`` of the chart's controller container as
  ``tests/image/pod.py`` translates the stored Deployment (uid 65532, read-only root, no
  capabilities, seccomp, memory limit, in-cluster ServiceAccount files, host network);
- **host**: ``python -m fleet.cli controller`` from the project's virtualenv with the same
  args and environment, the token in a kubeconfig.

Start-up = process/container launch -> ``/readyz`` answers 200 (caches synced; polled
every 50 ms). Stop = SIGTERM -> exited. ``--help`` = the whole CLI round trip.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from fleet.testing.world import World  # noqa: E402
from tests.image.pod import container_args, podman_run_args  # noqa: E402
from tests.image.test_image import (  # noqa: E402
    ARCHIVE,
    REF,
    ChartController,
    chart_controller,
    podman,
    readyz,
    run_controller,
)


def wait_ready(port: int, alive: Callable[[], bool], t0: float, timeout: float = 180) -> float:
    while time.monotonic() - t0 < timeout:
        if readyz(port) == 200:
            return time.monotonic() - t0
        if not alive():
            raise RuntimeError("controller exited before it was ready")
        time.sleep(0.05)
    raise TimeoutError(f"not ready after {timeout} s")


def container_run(ctl: ChartController) -> tuple[float, float]:
    t0 = time.monotonic()
    name = run_controller(REF, ctl)
    try:
        def alive() -> bool:
            out = podman("inspect", "--format", "{{.State.Status}}", name).stdout
            return out.strip() == "running"

        ready = wait_ready(ctl.status_port, alive, t0)
        t1 = time.monotonic()
        podman("stop", name)
        stop = time.monotonic() - t1
        code = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        if code != "0":
            raise RuntimeError(f"container exited {code}: {podman('logs', name).stderr}")
        return ready, stop
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)


def host_command(ctl: ChartController, directory: Path) -> tuple[list[str], dict[str, str]]:
    args = podman_run_args(ctl.pod, ctl.run)
    env = dict(b.split("=", 1) for a, b in itertools.pairwise(args) if a == "--env")
    host, port = ctl.run.api_server or ("", 0)
    for k in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        env.pop(k)
    sa = ctl.run.service_account
    assert sa is not None
    kubeconfig = directory / "host.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "mgmt",
        "clusters": [{"name": "mgmt", "cluster": {
            "server": f"https://{host}:{port}", "certificate-authority": str(sa / "ca.crt")}}],
        "users": [{"name": "sa", "user": {"tokenFile": str(sa / "token")}}],
        "contexts": [{"name": "mgmt", "context": {"cluster": "mgmt", "user": "sa"}}]}))
    env["K0S_FLEET_CONFIG"] = str(ctl.run.volumes["config"] / "fleet.yaml")
    cmd = [sys.executable, "-m", "fleet.cli", *container_args(ctl.pod),
           "--kubeconfig", str(kubeconfig)]
    return cmd, {**os.environ, **env}


def host_run(cmd: list[str], env: dict[str, str], port: int) -> tuple[float, float]:
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        ready = wait_ready(port, lambda: proc.poll() is None, t0)
        t1 = time.monotonic()
        proc.terminate()
        code = proc.wait(60)
        if code != 0:
            raise RuntimeError(f"host controller exited {code}")
        return ready, time.monotonic() - t1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def timed(cmd: list[str]) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.monotonic() - t0


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3),
            "max": round(max(xs), 3)}


async def measure(runs: int, directory: Path) -> dict[str, Any]:
    if not ARCHIVE.exists():
        raise SystemExit(f"{ARCHIVE} missing: run `make image` first")
    podman("load", "--input", ARCHIVE)
    with World(["mgmt"]) as world:
        await world.install_crds()
        async with await world["mgmt"].client() as mgmt:
            ctl = await chart_controller(world["mgmt"], mgmt, directory)
        cmd, env = host_command(ctl, directory)
        result: dict[str, list[float]] = {k: [] for k in (
            "container_ready", "container_stop", "host_ready", "host_stop",
            "container_help", "host_help")}
        help_args = [str(REPO_ROOT / "hack" / "image" / "podman.sh"), "run", "--rm",
                     *podman_run_args(ctl.pod, ctl.run), REF, "--help"]
        for i in range(runs):
            ready, stop = container_run(ctl)
            result["container_ready"].append(ready)
            result["container_stop"].append(stop)
            ready, stop = host_run(cmd, env, ctl.status_port)
            result["host_ready"].append(ready)
            result["host_stop"].append(stop)
            result["container_help"].append(timed(help_args))
            result["host_help"].append(timed([str(Path(sys.executable).parent / "k0s-fleet"),
                                              "--help"]))
            print(f"run {i + 1}: container ready {result['container_ready'][-1]:.2f} s, "
                  f"host ready {result['host_ready'][-1]:.2f} s", file=sys.stderr)
    size = int(podman("image", "inspect", "--format", "{{.Size}}", REF).stdout)
    return {
        "image": REF, "unpacked_bytes": size, "archive_bytes": ARCHIVE.stat().st_size,
        "runs": runs, "loadavg": os.getloadavg(),
        **{k: summary(v) for k, v in result.items()}, "raw": result,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="k0s-fleet-bench-image-") as d:
        res = anyio.run(measure, a.runs, Path(d))
    print(f"{res['image']}: {res['unpacked_bytes'] / 1e6:.0f} MB unpacked, "
          f"archive {res['archive_bytes'] / 1e6:.0f} MB")
    print("| what | median | min | max |\n| --- | --- | --- | --- |")
    for k in ("container_ready", "host_ready", "container_stop", "host_stop",
              "container_help", "host_help"):
        s = res[k]
        print(f"| {k} | {s['median']:.2f} s | {s['min']:.2f} s | {s['max']:.2f} s |")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
