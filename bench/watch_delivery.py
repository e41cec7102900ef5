"""Does every change reach every kubesim watch, and how soon? (issue #13: a workload
cluster's Node watch went silent for 150 s in a 10 x 300 rollout bench.)

```sh
.venv/bin/python bench/watch_delivery.py [--clusters 10] [--watches 3] [--bursts 40] \
    [--burst 5] [--bookmark-seconds 0.05] [--slow-seconds 0] [--json out.json]
```

kubesim (``KubeSimThread``: its own event loop in a thread of this process) serves
``--clusters`` virtual clusters with one ConfigMap each; every cluster has ``--watches``
watches on it, each through its own client (its own TLS connection), as a controller
replica's watches are; a writer per cluster patches the ConfigMap in ``--bursts`` bursts of
``--burst`` changes through the API, pausing 0.7 x the bookmark interval between bursts
so that watches go idle and their bookmarks come due while changes arrive (kubesim's
bookmarks come every ``--bookmark-seconds`` here, every 60 s by default). A reader that
waits ``--slow-seconds`` after each event is a slow one. A watch that receives nothing for
``--silent-seconds`` while it still expects changes counts as stuck (and stops).

Reports the changes expected and delivered, the stuck watches, each change's delivery
latency (from its patch being sent to a watch receiving it: p50/p99/max) and kubesim's
own record of late deliveries where it keeps one (``/kubesim/stats``). Imports ``fleet``
as installed or from ``PYTHONPATH`` (to measure another tree's kubesim).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

import fleet
from fleet.kube import KubeClient
from fleet.kube.resources import CONFIGMAPS
from fleet.kube.watch import WatchEvent, watch_once
from fleet.testing.kubesim import KubeSimThread

NS = "default"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    sim = KubeSimThread(workdir, bookmark_seconds=args.bookmark_seconds).start()
    names = [f"c{i}" for i in range(args.clusters)]
    for name in names:
        sim.call(lambda n=name: sim.sim.add_cluster(n))
    expect = args.bursts * args.burst
    sent: dict[tuple[str, int], float] = {}
    latencies: list[float] = []
    stuck: list[dict[str, Any]] = []
    delivered = 0
    try:
        writers = {n: await KubeClient.for_many(sim.sim.kubeconfig(n), name=f"{n}-writer")
                   for n in names}
        try:
            for n in names:
                await writers[n].create(CONFIGMAPS, {
                    "metadata": {"name": "cm", "namespace": NS}, "data": {"i": "0"}}, NS)

            async def reader(n: str, k: int, rv: str, *,
                             task_status: anyio.abc.TaskStatus[None]) -> None:
                nonlocal delivered
                async with await KubeClient.for_many(sim.sim.kubeconfig(n),
                                                     name=f"{n}-watch{k}") as client:
                    events = watch_once(client, CONFIGMAPS, rv, namespace=NS,
                                        timeout_seconds=3600)
                    task_status.started()
                    got = 0
                    while got < expect:
                        try:
                            with anyio.fail_after(args.silent_seconds):
                                event = await events.__anext__()
                        except TimeoutError:
                            stuck.append({"cluster": n, "watch": k, "received": got})
                            break
                        if isinstance(event, WatchEvent) and event.type == "MODIFIED":
                            value = int(event.object["data"]["i"])
                            latencies.append(time.monotonic() - sent[(n, value)])
                            got += 1
                            delivered += 1
                            if args.slow_seconds:
                                await anyio.sleep(args.slow_seconds)
                    await events.aclose()  # type: ignore[attr-defined]

            async def write(n: str) -> None:
                value = 0
                for _ in range(args.bursts):
                    for _ in range(args.burst):
                        value += 1
                        sent[(n, value)] = time.monotonic()
                        await writers[n].patch(CONFIGMAPS, "cm", {"data": {"i": str(value)}},
                                               NS)
                    await anyio.sleep(args.bookmark_seconds * 0.7)

            t0 = time.monotonic()
            async with anyio.create_task_group() as tg:
                for n in names:
                    rv = (await writers[n].list(CONFIGMAPS, NS)).resource_version
                    for k in range(args.watches):
                        await tg.start(reader, n, k, rv)
                async with anyio.create_task_group() as wg:
                    for n in names:
                        wg.start_soon(write, n)
            took = time.monotonic() - t0
            stats = sim.call(lambda: {k: v for k, v in sim.sim.__dict__.items()
                                      if k in ("late_events", "late_max_seconds")})
        finally:
            for w in writers.values():
                await w.close()
    finally:
        sim.close()
    return {
        "fleet": str(Path(fleet.__file__).parent),
        "clusters": args.clusters, "watches": args.clusters * args.watches,
        "changes_per_watch": expect, "bookmark_seconds": args.bookmark_seconds,
        "slow_seconds": args.slow_seconds, "expected": expect * args.clusters * args.watches,
        "delivered": delivered, "stuck_watches": len(stuck), "stuck": stuck[:20],
        "latency_ms": {"p50": ms(percentile(latencies, 0.5)),
                       "p99": ms(percentile(latencies, 0.99)),
                       "max": ms(max(latencies, default=None))},
        "seconds": round(took, 1), "kubesim": stats,
        "python": platform.python_version(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clusters", type=int, default=10)
    p.add_argument("--watches", type=int, default=3, help="per cluster")
    p.add_argument("--bursts", type=int, default=40)
    p.add_argument("--burst", type=int, default=5, help="changes per burst")
    p.add_argument("--bookmark-seconds", type=float, default=0.05)
    p.add_argument("--slow-seconds", type=float, default=0.0,
                   help="a reader's pause after each event")
    p.add_argument("--silent-seconds", type=float, default=5.0,
                   help="a watch silent this long while expecting changes is stuck")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="watch-delivery-") as tmp:
        result = anyio.run(run, args, Path(tmp))
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    sys.exit(1 if result["stuck_watches"] else 0)


if __name__ == "__main__":
    main()
