"""Memory of one sharded replica per own and per foreign cluster (issue #13 target 2),
measured with tracemalloc in this process, no server.

A replica keeps the management caches (:class:`fleet.controllers.observe.ManagementView`,
fed through ``ObjectCache.observe`` exactly as watch events are, with the controller's
``FleetParts`` listening), a snapshot part per cluster (``FleetParts.rebuild``, foreign
for the clusters another replica holds), the fleet's merged snapshot (``Merger``) and
the rollout policy's progress per cluster (``ProgressMemo``) and the wave gate's index
and verdicts (``RolloutGate.evaluate``, phase "gate"). Each cluster is what
``bench/management_memory.py`` builds (fleet/testing/capi.py's objects as the API server
returns them; ``--capi-status``: with the status a CAPI manager writes), with a
FleetUpgrade to the version they run (steady state after a rollout).

Four measurements of N clusters each: one replica (not sharded: no ``holds``), and a
sharded replica holding every cluster (own), none (foreign) and ``--held`` of them
(mixed); bytes still allocated once everything is built, divided by N. The workload
side of an own cluster (its client, Node records) is not included:
``bench/registry_memory.py`` measures it.

    .venv/bin/python bench/shard_memory.py --clusters 200 --held 0.1 [--capi-status] [--reflectors]
"""

from __future__ import annotations

import argparse
import functools
import gc
import inspect
import json
import sys
import tracemalloc
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from management_memory import NS, V, cluster_objects

from fleet.config.models import FleetConfig
from fleet.controllers.observe import ManagementView
from fleet.controllers.parts import FleetParts
from fleet.kube.resources import FLEET_UPGRADES, SECRETS, Resource
from fleet.kube.watch import Reflector, WatchEvent
from fleet.planner.incremental import Merger
from fleet.rollout.gate import FleetView, RolloutGate
from fleet.rollout.progress import ProgressMemo
from fleet.world.clusters import ClusterRegistry
from fleet.world.model import ClusterKey

try:
    from fleet.rollout.progress import foreign_digest
except ImportError:  # code from before foreign digests (the "before" numbers)
    foreign_digest = None  # type: ignore[assignment]

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def fleet_upgrade() -> dict[str, Any]:
    return {"apiVersion": FLEET_UPGRADES.api_version, "kind": FLEET_UPGRADES.kind,
            "metadata": {"name": "to-current", "namespace": NS, "resourceVersion": "7",
                         "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"version": V}}


class Replica:
    """What one replica holds for the management side of its fleet."""

    def __init__(self, held: set[ClusterKey] | None) -> None:
        self.config = FleetConfig.model_validate(
            {"management": {"namespace": NS}, "clusters": {"namespaces": [NS]}},
            by_alias=True, by_name=False)
        self.parts = FleetParts(self.config)
        self.parts.sharded = held is not None  # as FleetController sets it
        self.parts.digest = foreign_digest  # as with the rollout policy (if the code has it)
        # held None: one replica (no sharding), every cluster its own
        self.view = ManagementView(cast(Any, None), namespaces=[NS], intent_namespace=NS,
                                   on_object=self.parts.listener,
                                   holds=None if held is None else held.__contains__)
        self.registry = ClusterRegistry(self.view[SECRETS], on_change=lambda: None)
        self.parts.attach(self.view.caches, self.registry)
        self.merger = Merger()
        self.progress = ProgressMemo()
        self.gate = RolloutGate(self.config)
        self.kept: list[Any] = []
        self.phases: dict[str, int] = {}  # bytes allocated at the end of each phase

    def _phase(self, name: str) -> None:
        gc.collect()
        self.phases[name] = tracemalloc.get_traced_memory()[0]

    def build(self, raw: list[tuple[str, bytes]], held: set[ClusterKey] | None,
              reflectors: bool = False) -> None:
        view = self.view
        view[FLEET_UPGRADES].observe(fleet_upgrade())
        by_kind = {res.kind: res for res in view.caches}
        if reflectors:
            self._reflect(raw, by_kind)
        else:
            for kind, body in raw:
                view[by_kind[kind]].observe(json.loads(body))  # decoded as a watch event is
        for cache in view.caches.values():
            cache.mark_synced()
        self._phase("caches")
        members = self.parts.refresh_members()
        self.parts.foreign = frozenset(k for k in members if held is not None and k not in held)
        self.parts.rebuild(sorted(self.parts.take_dirty()), NOW, {})
        self._phase("parts")
        fleet = self.merger.merge(self.parts.parts, NOW)
        self.kept = [fleet]
        self._phase("merged")
        clusters = self.progress.clusters(fleet)
        self.kept.append(clusters)
        self._phase("progress")
        # the wave gate's index and verdicts over the whole fleet (own and foreign alike)
        self.kept.append(self.gate.evaluate(FleetView(clusters, fleet_writer=held is None),
                                            NOW))
        self._phase("gate")


    def _reflect(self, raw: list[tuple[str, bytes]], by_kind: dict[str, Resource]) -> None:
        """Each object as an ADDED event through a Reflector per resource, as
        ManagementView.run builds them (no server: the events are applied as a watch
        applies them), so that what the watches keep per object is counted too."""
        view = self.view
        has_versions = "versions" in inspect.signature(Reflector).parameters

        def reflector(res: Resource) -> Reflector:
            extra: dict[str, Any] = {}
            if has_versions and res is not SECRETS:  # as ManagementView.run
                extra["versions"] = functools.partial(view[res].versions, NS)
            return Reflector(cast(Any, None), res, namespace=NS, listener=view[res].on_event,
                             keep_objects=False, **extra)

        self.reflectors = {res: reflector(res) for res in by_kind.values()}

        async def feed() -> None:
            for kind, body in raw:
                await self.reflectors[by_kind[kind]]._apply(
                    WatchEvent("ADDED", json.loads(body)))

        anyio.run(feed)


def raw_objects(clusters: int, capi_status: bool) -> list[tuple[str, bytes]]:
    out = []
    for i in range(clusters):
        for res, objs in cluster_objects(i, capi_status).items():
            out += [(res.kind, json.dumps(o).encode()) for o in objs]
    return out


def measure(raw: list[tuple[str, bytes]], held: set[ClusterKey] | None,
            reflectors: bool = False) -> tuple[int, dict[str, int], Replica]:
    """Bytes allocated by one replica built from ``raw`` (``held``: its own clusters; None:
    not sharded), and
    by each phase: the management caches, the parts (with the caches' parse memo), the
    merged snapshot, the rollout progress."""
    gc.collect()
    tracemalloc.start()
    replica = Replica(held)
    replica.build(raw, held, reflectors)
    gc.collect()
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    phases, last = {}, 0
    for name, at in replica.phases.items():
        phases[name], last = at - last, at
    return size, phases, replica


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clusters", type=int, default=200)
    p.add_argument("--held", type=float, default=0.1,
                   help="fraction of the clusters this replica holds in the mixed run")
    p.add_argument("--capi-status", action="store_true",
                   help="objects with the status a Cluster API manager writes")
    p.add_argument("--reflectors", action="store_true",
                   help="feed the objects through the watches' Reflectors (what they keep "
                        "per object counted under caches)")
    args = p.parse_args()
    if not args.clusters > 0 or not 0 <= args.held <= 1:
        p.error("--clusters must be positive and --held between 0 and 1")
    n = args.clusters
    raw = raw_objects(n, args.capi_status)
    keys = [(NS, f"c{i:04d}") for i in range(n)]
    if args.reflectors:
        anyio.run(anyio.sleep, 0)  # the event loop's one-time imports, not the first build's
    alone, alone_phases, r_alone = measure(raw, None, args.reflectors)
    del r_alone
    own, own_phases, r_own = measure(raw, set(keys), args.reflectors)
    assert len(r_own.parts.parts) == n and not r_own.parts.foreign
    del r_own
    foreign, foreign_phases, r_foreign = measure(raw, set(), args.reflectors)
    assert len(r_foreign.parts.foreign) == n
    del r_foreign
    held = set(keys[:round(args.held * n)])
    mixed, _, r_mixed = measure(raw, held, args.reflectors)
    del r_mixed
    per_own, per_foreign = own / n, foreign / n
    predicted = per_own * len(held) + per_foreign * (n - len(held))
    print(f"{n} clusters: {per_own:9.0f} B per own cluster, {per_foreign:9.0f} B per foreign "
          f"cluster, {alone / n:9.0f} B per cluster of one replica (not sharded)")
    print(f"{'bytes per cluster':20} {'one replica':>11} {'own':>9} {'foreign':>9}")
    for name in own_phases:
        print(f"{name:20} {alone_phases[name] / n:11.0f} {own_phases[name] / n:9.0f} "
              f"{foreign_phases[name] / n:9.0f}")
    print(f"mixed ({len(held)} own, {n - len(held)} foreign): {mixed / n:9.0f} B per cluster "
          f"(own x {len(held)} + foreign x {n - len(held)} = {predicted / n:9.0f})")
    print(json.dumps({"clusters": n, "capi_status": args.capi_status, "held": len(held),
                      "reflectors": args.reflectors,
                      "one_replica_bytes_per_cluster": round(alone / n),
                      "own_bytes_per_cluster": round(per_own),
                      "foreign_bytes_per_cluster": round(per_foreign),
                      "mixed_bytes_per_cluster": round(mixed / n),
                      "one_replica_phases": {k: round(v / n) for k, v in alone_phases.items()},
                      "own_phases": {k: round(v / n) for k, v in own_phases.items()},
                      "foreign_phases": {k: round(v / n) for k, v in foreign_phases.items()}}))


if __name__ == "__main__":
    main()
