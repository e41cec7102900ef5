"""Watch requests in steady state against a real kube-apiserver (issue #13, leftover).

    .venv/bin/python bench/watches.py [--minutes 10]

A test world of its own (etcd + one kube-apiserver, idle but for this), and Reflectors on
Nodes, ConfigMaps and CRDs side by side with the workload watches' settings
(fleet.world.clusters.ClusterRegistry: server timeout WORKLOAD_WATCH_TIMEOUT less up to half of
it at random, idle bound 150 s) and the settings every watch had before (server timeout
120 s less up to a fifth, read timeout 150 s). Printed per resource and setting: watch
requests opened, of them resumed after an idle bound, lists, failures, over the window.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import anyio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleet.kube.resources import CONFIGMAPS, CRDS, NODES  # noqa: E402
from fleet.kube.watch import Reflector  # noqa: E402
from fleet.testing.world import World  # noqa: E402
from fleet.world.clusters import WORKLOAD_WATCH_TIMEOUT  # noqa: E402


async def measure(world: World, minutes: float) -> dict[str, dict[str, float]]:
    async with await world["bench"].client() as client:
        await client.create(NODES, {"metadata": {"name": "n1"}})
        reflectors: dict[str, Reflector] = {}
        for res in (NODES, CONFIGMAPS, CRDS):
            reflectors[f"workload {res.plural}"] = Reflector(
                client, res, watch_timeout=WORKLOAD_WATCH_TIMEOUT, spread=0.5,
                idle_timeout=150)
            reflectors[f"before {res.plural}"] = Reflector(client, res, watch_timeout=120)
        t0 = time.monotonic()
        with anyio.move_on_after(minutes * 60):
            async with anyio.create_task_group() as tg:
                for r in reflectors.values():
                    tg.start_soon(r.run)
        took = (time.monotonic() - t0) / 60
        return {name: {"minutes": round(took, 1), "watches": r.watches,
                       "idle_resumes": r.idle_resumes, "lists": r.relists,
                       "failures": r.reconnects}
                for name, r in sorted(reflectors.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    args = parser.parse_args()
    world = World(["bench"])
    with world:
        result = anyio.run(measure, world, args.minutes)
    for name, row in result.items():
        print(f"{name:34} {json.dumps(row)}")


if __name__ == "__main__":
    main()
