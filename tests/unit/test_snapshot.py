"""One snapshot builder: the controller's watch caches and the one-shot lists of ``plan``
and ``status`` give the same snapshot, unreadable objects included."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from fleet.config.models import FleetConfig
from fleet.kube.cache import Kept, ObjectCache
from fleet.world.clusters import control_node_cache, node_cache
from fleet.world.records import node_records
from fleet.world.snapshot import (
    Listed,
    ManagementObjects,
    ObjectSource,
    build_snapshot,
    cluster_nodes,
    fleet_clusters,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def obj(kind: str, name: str, rv: str = "1", **body: Any) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv,
                                       "uid": f"u-{name}", **body.pop("meta", {})}, **body}


CLUSTERS = [obj("Cluster", "c1"), obj("Cluster", "c2")]
OBJECTS = {
    "MachineDeployment": [obj("MachineDeployment", "md", spec={
        "clusterName": "c1", "replicas": 2, "template": {"spec": {"version": "v1.31.1+k0s.0"}}})],
    "MachineSet": [],
    "K0sControlPlane": [],
    "Machine": [
        obj("Machine", "m1", meta={"labels": {"cluster.x-k8s.io/deployment-name": "md"}},
            spec={"clusterName": "c1", "version": "v1.31.1+k0s.0"}),
        # unreadable: a spec that is not a mapping
        obj("Machine", "m2", spec="garbage"),
        obj("Machine", "other", spec={"clusterName": "not-in-fleet", "version": "v1.31.1"}),
    ],
    "NodePlan": [obj("NodePlan", "p1", spec={"clusterName": "c1", "version": "v1.31.1"}),
                 obj("NodePlan", "p2", spec=["not", "a", "mapping"])],
    "FleetUpgrade": [],
}
NODES = [obj("Node", "n1", meta={"namespace": ""}), obj("Node", "bad", status="nope")]


def objects_of(make: type[Listed] | type[ObjectCache]) -> ManagementObjects:
    def source(kind: str) -> ObjectSource:
        if make is Listed:
            return Listed(kind, OBJECTS[kind])
        cache = ObjectCache(kind)
        for o in OBJECTS[kind]:
            cache.observe(o)
        return cache

    return ManagementObjects(
        deployments=source("MachineDeployment"), machine_sets=source("MachineSet"),
        control_planes=source("K0sControlPlane"), machines=source("Machine"),
        nodeplans=source("NodePlan"), fleet_upgrades=source("FleetUpgrade"))


def test_caches_and_one_shot_lists_give_the_same_snapshot() -> None:
    clusters = fleet_clusters(FleetConfig(), CLUSTERS)
    assert set(clusters) == {("ns", "c1"), ("ns", "c2")}
    cache = node_cache()
    for o in NODES:
        cache.observe(o)
    from_cache = cluster_nodes(cache, control_node_cache())
    nodes = {("ns", "c1"): cluster_nodes(node_records(NODES), []), ("ns", "c2"): None}
    assert nodes[("ns", "c1")] == from_cache
    assert set(cache.unreadable) == {("ns", "bad")}
    built = [build_snapshot(now=NOW, objects=objects_of(make), clusters=clusters, nodes=nodes,
                            infra={}, autopilot_plans={}) for make in (Listed, ObjectCache)]
    assert built[0] == built[1]
    snap = built[0]
    # the unreadable Machine and NodePlan are skipped, not fatal; foreign ones left out
    assert sorted(snap.machines) == [("ns", "m1")]
    assert sorted(snap.nodeplans) == [("ns", "p1")]
    assert sorted(snap.deployments) == [("ns", "md")]
    assert snap.nodes[("ns", "c2")] is None
    assert "n1" in (snap.nodes[("ns", "c1")] or {})


def test_a_rebuild_from_the_caches_decodes_only_what_it_cannot_remember(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Caches keeping projections (bytes): a second build parses no unchanged object and
    decodes none but the unreadable ones (whose failure is not remembered)."""
    def kept_source(kind: str) -> ObjectCache:
        cache = ObjectCache(kind, keep=lambda o: o)
        for o in OBJECTS[kind]:
            cache.observe(o)
        return cache

    objects = ManagementObjects(
        deployments=kept_source("MachineDeployment"), machine_sets=kept_source("MachineSet"),
        control_planes=kept_source("K0sControlPlane"), machines=kept_source("Machine"),
        nodeplans=kept_source("NodePlan"), fleet_upgrades=kept_source("FleetUpgrade"))
    clusters = fleet_clusters(FleetConfig(), CLUSTERS)
    nodes: dict[tuple[str, str], Any] = {("ns", "c1"): {}, ("ns", "c2"): None}
    decoded: list[str] = []
    original = Kept.as_object

    def as_object(self: Kept) -> dict[str, Any]:
        obj = original(self)
        decoded.append(obj["metadata"]["name"])
        return obj

    monkeypatch.setattr(Kept, "as_object", as_object)
    first = build_snapshot(now=NOW, objects=objects, clusters=clusters, nodes=nodes,
                           infra={}, autopilot_plans={})
    assert sorted(decoded) == ["m1", "m2", "md", "other", "p1", "p2"]
    decoded.clear()
    again = build_snapshot(now=NOW, objects=objects, clusters=clusters, nodes=nodes,
                           infra={}, autopilot_plans={})
    assert again == first and sorted(decoded) == ["m2", "p2"]
    assert first == build_snapshot(now=NOW, objects=objects_of(Listed), clusters=clusters,
                                   nodes=nodes, infra={}, autopilot_plans={})
