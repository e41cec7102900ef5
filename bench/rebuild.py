"""A full snapshot rebuild from the management caches, N clusters, in this process.

The caches hold what the controller keeps of each object (fleet/world/kept.py: one bytes
object each); ``build_snapshot`` reads every object of every cluster through them, as
the controller's pass does after a FleetUpgrade's change, a re-sync or at start-up. The
first build parses every object; the next ones find every parse remembered (nothing
moved), which is what this measures: what a rebuild of unchanged objects costs. The
objects are ``bench/management_memory.py``'s (as the API server returns them, with
``--capi-status`` also with a CAPI manager's status). Works with any checkout whose
``build_snapshot`` takes ``ObjectCache`` sources: to time another one, copy this file and
management_memory.py out of every checkout (that one puts its own checkout first on the
path) and point ``PYTHONPATH`` at the checkout (bench/README.md).

    .venv/bin/python bench/rebuild.py --clusters 1000 [--capi-status] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from management_memory import cluster_objects

from fleet.config.models import FleetConfig
from fleet.kube.cache import ObjectCache
from fleet.kube.resources import (
    CLUSTERS,
    K0S_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    Resource,
)
from fleet.world.kept import projection
from fleet.world.snapshot import ManagementObjects, build_snapshot, fleet_clusters

KINDS = (CLUSTERS, K0S_CONTROL_PLANES, MACHINE_DEPLOYMENTS, MACHINE_SETS, MACHINES)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clusters", type=int, default=1000)
    p.add_argument("--capi-status", action="store_true")
    p.add_argument("--repeat", type=int, default=5, help="warm rebuilds timed")
    args = p.parse_args()
    caches: dict[Resource, ObjectCache] = {r: ObjectCache(r.kind, keep=projection(r))
                                           for r in KINDS}
    for i in range(args.clusters):
        for res, objs in cluster_objects(i, args.capi_status).items():
            if res in caches:
                for o in objs:
                    caches[res].observe(json.loads(json.dumps(o)))
    objects = ManagementObjects(
        deployments=caches[MACHINE_DEPLOYMENTS], machine_sets=caches[MACHINE_SETS],
        control_planes=caches[K0S_CONTROL_PLANES], machines=caches[MACHINES],
        nodeplans=ObjectCache("NodePlan"), fleet_upgrades=ObjectCache("FleetUpgrade"))
    clusters = fleet_clusters(FleetConfig(), caches[CLUSTERS])
    now = datetime(2026, 1, 1, tzinfo=UTC)

    def build() -> float:
        t0 = time.perf_counter()
        snap = build_snapshot(now=now, objects=objects, clusters=clusters,
                              nodes=dict.fromkeys(clusters), infra={}, autopilot_plans={})
        assert len(snap.machines) == 10 * args.clusters, len(snap.machines)
        return time.perf_counter() - t0

    cold = build()
    warm = [build() for _ in range(args.repeat)]
    print(json.dumps({"clusters": args.clusters, "capi_status": args.capi_status,
                      "cold_s": round(cold, 3), "warm_median_s": round(statistics.median(warm), 3),
                      "warm_min_s": round(min(warm), 3)}))


if __name__ == "__main__":
    main()
