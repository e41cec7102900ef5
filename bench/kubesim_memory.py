"""kubesim's memory and CPU per connected workload cluster, without a management side.

```sh
.venv/bin/python bench/kubesim_memory.py --clusters 300 [--idle-seconds 60] [--json out.json]
```

Starts kubesim (``python -m fleet.testing.kubesim``) seeded as ``bench/scale.py`` seeds it
(N clusters of 3 control-plane + 7 worker Nodes of realistic size), reads its RSS, then
connects to every cluster as a controller replica does (``KubeClient.for_many``: a Node
Reflector with ``keep_objects=False`` plus the two watches of the autopilot CRDs'
absence, ControlNodes and Plans: three open watches per cluster), waits until every
Node watch is synced and every watch is open on kubesim's side, and reads kubesim's RSS
and its CPU over an idle window. The clients run in this process; only kubesim's
process is measured. ``bench/scale.py`` measures the same with a real replica.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import secrets
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.request import Request, urlopen

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import anyio  # noqa: E402

from bench.scale import V1, node_names, proc_usage  # noqa: E402
from bench.stats import report  # noqa: E402
from fleet.kube import KubeClient  # noqa: E402
from fleet.kube.resources import NODES  # noqa: E402
from fleet.kube.watch import Reflector, WatchEvent, crd_established  # noqa: E402
from fleet.testing.world import kill_group  # noqa: E402

OPTIONAL_CRDS = ("controlnodes.autopilot.k0sproject.io", "plans.autopilot.k0sproject.io")


def start(workdir: Path, n: int, token: str) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    seed = {"clusters": [{"name": f"c{i:05d}", "nodes": [
        {"name": name, "version": V1, "controlPlane": cp}
        for name, cp in node_names(f"c{i:05d}")]} for i in range(n)]}
    (workdir / "seed.json").write_text(json.dumps(seed))
    log = (workdir / "kubesim.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleet.testing.kubesim", "--workdir", str(workdir),
         "--seed", str(workdir / "seed.json")], stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, cwd=str(REPO),
        env={**os.environ, "KUBESIM_TOKEN": token, "PYTHONPATH": str(REPO)})
    log.close()
    ready = workdir / "ready.json"
    deadline = time.monotonic() + 600
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_group(proc)
            raise RuntimeError(f"kubesim did not come up; see {workdir}")
        time.sleep(0.1)
    return proc, json.loads(ready.read_text())


def stats(port: int, token: str, ca: str) -> dict[str, Any]:
    ctx = ssl.create_default_context(cafile=ca)
    req = Request(f"https://127.0.0.1:{port}/kubesim/stats",
                  headers={"Authorization": f"Bearer {token}"})
    with urlopen(req, context=ctx, timeout=60) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def kubeconfig(port: int, cluster: str, token: str, ca_pem: bytes) -> dict[str, Any]:
    import base64  # noqa: PLC0415

    return {"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": cluster, "cluster": {
                "server": f"https://127.0.0.1:{port}/clusters/{cluster}",
                "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
            "users": [{"name": "admin", "user": {"token": token}}],
            "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": "admin"}}],
            "current-context": cluster}


async def connect(n: int, info: dict[str, Any], token: str, ca_pem: bytes, *, idle: float,
                  proc_pid: int) -> dict[str, Any]:
    port = int(info["port"])
    clients = [await KubeClient.for_many(kubeconfig(port, f"c{i:05d}", token, ca_pem),
                                         name=f"c{i:05d}") for i in range(n)]
    reflectors: list[Reflector] = []

    async def ignore(_: WatchEvent) -> None:
        return None

    async def absent_crd(client: KubeClient, name: str) -> None:
        while not await crd_established(client, name, timeout_seconds=600):
            pass

    out: dict[str, Any] = {}
    t0 = time.monotonic()
    async with anyio.create_task_group() as tg:
        for c in clients:
            r = Reflector(c, NODES, listener=ignore, keep_objects=False, watch_timeout=600)
            reflectors.append(r)
            tg.start_soon(r.run)
            for crd in OPTIONAL_CRDS:
                tg.start_soon(absent_crd, c, crd)
        for r in reflectors:
            await r.synced.wait()
        want = 3 * n
        while True:  # every watch open on kubesim's side (an older kubesim: requested)
            s = await asyncio.to_thread(stats, port, token, info["ca"])
            opened = s["watches"] if "watches" in s else sum(
                r["count"] for r in s["requests"] if r["verb"] == "watch")
            if opened >= want:
                break
            await anyio.sleep(0.5)
        out["connect_s"] = round(time.monotonic() - t0, 1)
        u0 = proc_usage(proc_pid)
        t1 = time.monotonic()
        await anyio.sleep(idle)
        u1 = proc_usage(proc_pid)
        window = time.monotonic() - t1
        s = await asyncio.to_thread(stats, port, token, info["ca"])
        assert u0 is not None and u1 is not None
        out.update({"rss_mib": round(u1["rss_mib"], 1),
                    "peak_rss_mib": round(u1["peak_rss_mib"], 1),
                    "idle_window_s": round(window, 1),
                    "idle_cpu_s_per_min": round((u1["cpu_s"] - u0["cpu_s"]) / window * 60, 3),
                    "watches": s.get("watches"), "connections": s.get("connections")})
        tg.cancel_scope.cancel()
    for c in clients:
        await c.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--clusters", type=int, default=100)
    p.add_argument("--idle-seconds", type=float, default=60.0)
    p.add_argument("--json", help="write the result here")
    args = p.parse_args()
    token = secrets.token_hex(16)
    result: dict[str, Any] = {"clusters": args.clusters,
                              "command": " ".join(sys.argv),
                              "python": platform.python_version(),
                              "loadavg_start": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="kubesim-memory-") as tmp:
        proc, info = start(Path(tmp), args.clusters, token)
        try:
            time.sleep(2.0)  # let the seeding's garbage settle
            seeded = proc_usage(proc.pid)
            assert seeded is not None
            result["seeded"] = {k: round(v, 1) for k, v in seeded.items()}
            result["connected"] = anyio.run(functools.partial(
                connect, args.clusters, info, token, Path(info["ca"]).read_bytes(),
                idle=args.idle_seconds, proc_pid=proc.pid))
        finally:
            kill_group(proc)
    result["loadavg_end"] = os.getloadavg()
    c, s = result["connected"], result["seeded"]
    result["per_connected_cluster_mib"] = round((c["rss_mib"] - s["rss_mib"])
                                                / args.clusters, 3)
    return report(result, args.json, indent=2)


if __name__ == "__main__":
    sys.exit(main())
