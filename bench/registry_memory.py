"""Memory of the workload side of one controller: N workload clusters' clients, watches and
caches (the ClusterRegistry), each cluster holding realistic Nodes.

One real kube-apiserver + etcd (the test world, autopilot CRDs installed so each cluster
has its Node, ControlNode and Plan watches, as a k0s cluster has) serves N kubeconfigs;
every cluster sees the same ``--nodes`` Nodes of about 14 KB of JSON each (40 images,
managedFields, kubelet conditions), each cached per cluster as the controller would.
A child process runs the registry alone (no planner, no management caches) and reports
its steady RSS, the objects the garbage collector tracks and the time to the first
complete sync of every cluster. The slope per cluster is (RSS(N) - RSS(0)) / N.

    .venv/bin/python bench/registry_memory.py --clusters 0 100 300
    # against another checkout's code (e.g. before a change):
    PYTHONPATH=/work/main .venv/bin/python bench/registry_memory.py --clusters 0 100

This measures the ingest/cache/transport layers in isolation; bench/scale.py (the scale
harness) measures the whole controller.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

IMAGES = 40


def realistic_node(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the Node to create, its status) as a kubelet would publish them."""
    node = {"metadata": {
        "name": name,
        "labels": {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux",
                   "kubernetes.io/hostname": name, "node.k0sproject.io/role": "worker",
                   "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                   "topology.kubernetes.io/zone": "zone-a"},
        "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                        "fleet.k0s-fleet.io/k0s-version": "v1.31.2+k0s.0"}},
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]}}
    now = "2026-01-01T00:00:00Z"
    status = {
        "capacity": {"cpu": "4", "memory": "16331164Ki", "pods": "110",
                     "ephemeral-storage": "102687672Ki", "hugepages-2Mi": "0"},
        "allocatable": {"cpu": "4", "memory": "16228764Ki", "pods": "110",
                        "ephemeral-storage": "94636958904", "hugepages-2Mi": "0"},
        "conditions": [
            {"type": t, "status": "False", "reason": f"KubeletHasSufficient{t}",
             "message": f"kubelet has sufficient {t}", "lastHeartbeatTime": now,
             "lastTransitionTime": now}
            for t in ("MemoryPressure", "DiskPressure", "PIDPressure")] + [
            {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
             "lastTransitionTime": now}],
        "addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                      {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": "0" * 32, "systemUUID": "1" * 36, "bootID": "2" * 36,
                     "kernelVersion": "6.1.0-18-amd64", "osImage": "Debian GNU/Linux 12",
                     "containerRuntimeVersion": "containerd://1.7.20",
                     "kubeletVersion": "v1.31.2+k0s", "kubeProxyVersion": "v1.31.2+k0s",
                     "operatingSystem": "linux", "architecture": "amd64"},
        "images": [{"names": [f"quay.io/example/team-{i}/image-{i}@sha256:{i:064x}",
                              f"quay.io/example/team-{i}/image-{i}:v{i}.2.3"],
                    "sizeBytes": 120_000_000 + i} for i in range(IMAGES)],
    }
    return node, status


async def _prepare(world: Any, nodes: int) -> None:
    from fleet.kube.resources import NODES  # noqa: PLC0415

    await world.install_crds()
    async with await world["wl"].client() as c:
        for i in range(nodes):
            node, status = realistic_node(f"node-{i}")
            await c.create(NODES, node)
            await c.patch(NODES, node["metadata"]["name"], {"status": status},
                          subresource="status")
        listed = await c.list(NODES)
        sizes = [len(json.dumps(o)) for o in listed.items]
        print(f"{len(sizes)} Nodes of {min(sizes)}-{max(sizes)} bytes of JSON", file=sys.stderr)


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def _child(n: int, kubeconfig: dict[str, Any], settle: float) -> dict[str, Any]:
    from fleet.kube.cache import ObjectCache  # noqa: PLC0415
    from fleet.world.clusters import ClusterRegistry, kubeconfig_secret  # noqa: PLC0415

    secrets = ObjectCache("Secret")
    for i in range(n):
        secrets.observe({**kubeconfig_secret(f"c{i}-kubeconfig", "fleet", f"c{i}", kubeconfig),
                         "metadata": {"name": f"c{i}-kubeconfig", "namespace": "fleet",
                                      "resourceVersion": "1"}})
    registry = ClusterRegistry(secrets, on_change=lambda: None, unreachable_after=3600)
    t0 = time.monotonic()
    async with anyio.create_task_group() as tg:
        await tg.start(registry.run)
        registry.want({("fleet", f"c{i}"): f"c{i}-kubeconfig" for i in range(n)})
        while not all(wc.observed and wc.control_nodes.synced and wc.plans.synced
                      for wc in registry.clusters.values()):
            await anyio.sleep(0.2)
        synced = time.monotonic() - t0
        await anyio.sleep(settle)
        gc.collect()
        out = {"clusters": n, "rss_mib": round(_rss_mib(), 1),
               "gc_tracked": len(gc.get_objects()), "sync_s": round(synced, 1),
               "nodes_cached": sum(len(wc.nodes) for wc in registry.clusters.values())}
        tg.cancel_scope.cancel()
    return out


def _run_child(n: int, kubeconfig: dict[str, Any], settle: float) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(n), "--settle", str(settle)],
        input=json.dumps(kubeconfig), capture_output=True, text=True, check=False,
        env={**os.environ})
    if proc.returncode != 0:
        raise RuntimeError(f"child with {n} clusters failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clusters", type=int, nargs="+", default=[0, 100])
    p.add_argument("--nodes", type=int, default=9)
    p.add_argument("--settle", type=float, default=10.0)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        kubeconfig = json.loads(sys.stdin.read())
        print(json.dumps(asyncio.run(_child(args.child, kubeconfig, args.settle))))
        return
    from fleet.testing.world import World  # noqa: PLC0415

    # a stopped benchmark still stops its API server and etcd (the World's __exit__)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with World(["wl"]) as world:
        anyio.run(_prepare, world, args.nodes)
        kubeconfig = world["wl"].kubeconfig()
        results = []
        for n in args.clusters:
            r = _run_child(n, kubeconfig, args.settle)
            results.append(r)
            print(json.dumps(r), flush=True)
    base = next((r for r in results if r["clusters"] == 0), None)
    if base is not None:
        for r in results:
            if r["clusters"]:
                slope = (r["rss_mib"] - base["rss_mib"]) / r["clusters"]
                print(f"N={r['clusters']}: {slope * 1024:.0f} KiB RSS per cluster, "
                      f"{(r['gc_tracked'] - base['gc_tracked']) / r['clusters']:.0f} "
                      "tracked objects per cluster", flush=True)


if __name__ == "__main__":
    main()
