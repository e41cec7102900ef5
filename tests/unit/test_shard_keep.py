"""What a sharded replica keeps of the clusters it does not hold (fleet/kept.py
FOREIGN_SPECS), and that a foreign cluster is judged the same from it.

* the foreign subset of an object equals the foreign subset of its held copy (giving a
  shard back projects the held copies down: :meth:`ObjectCache.rekeep`), and is a subset
  of it;
* a foreign Secret keeps no kubeconfig, an object naming no cluster is kept in full;
* read again once its cluster is held, the cache holds the held subset again;
* on randomized fleets (versions of Machines and owners, version records, deletions,
  NodePlans in every phase, holders' summaries), the rollout's progress of every foreign
  cluster (:func:`fleet.rollout.progress.clusters_from_snapshot` of its snapshot part) is
  the same from the foreign subset as from the held one.
"""

from __future__ import annotations

import copy
import random
from datetime import UTC, datetime
from typing import Any

import pytest

from fleet.clusters import ClusterRegistry, kubeconfig_secret
from fleet.config import FleetConfig
from fleet.controllers.observe import ManagementView
from fleet.controllers.parts import FleetParts
from fleet.kept import CAPI_CLUSTER_LABEL, FOREIGN_SPECS, cluster_of, projection
from fleet.kube.cache import ObjectCache
from fleet.kube.resources import (
    CLUSTERS,
    FLEET_UPGRADES,
    K0S_CONTROL_PLANES,
    MACHINE_DEPLOYMENTS,
    MACHINE_SETS,
    MACHINES,
    NODE_PLANS,
    SECRETS,
    Resource,
)
from fleet.model import ClusterKey, machine_from
from fleet.nodeplan import build_nodeplan
from fleet.rollout.progress import clusters_from_snapshot
from fleet.signal import RUNNING_VERSION_KEY
from fleet.testing.capi import (
    cluster_object,
    control_plane_machine_object,
    control_plane_object,
    deployment_object,
    machine_set_object,
    worker_machine_object,
)

NS = "fleet"
V1, V2, V3 = "v1.31.2+k0s.0", "v1.31.3+k0s.0", "v1.31.4+k0s.0"
NOW = datetime(2026, 12, 1, tzinfo=UTC)
PHASES = ("Pending", "InProgress", "Completed", "Failed")


def _served(res: Resource, body: dict[str, Any], rv: int) -> dict[str, Any]:
    obj = copy.deepcopy(body)
    obj.setdefault("apiVersion", res.api_version)
    obj.setdefault("kind", res.kind)
    obj["metadata"].update(uid=f"uid-{rv}", resourceVersion=str(rv),
                           creationTimestamp="2026-01-01T00:00:00Z")
    return obj


def cluster_objects(rng: random.Random, i: int) -> list[tuple[Resource, dict[str, Any]]]:
    """One CAPI cluster in a random state of a rollout to V2 (objects as served)."""
    name = f"c{i:03d}"
    rv = 1000 * (i + 1)
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": name,
                  "clusters": [{"name": name, "cluster": {"server": f"https://{name}:6443"}}]}
    owner = {"apiVersion": CLUSTERS.api_version, "kind": "Cluster", "name": name, "uid": "u"}
    kcp_owner = {"apiVersion": K0S_CONTROL_PLANES.api_version, "kind": "K0sControlPlane",
                 "name": f"{name}-cp", "uid": "u", "controller": True}
    owner_version = {f"{name}-cp": rng.choice((V1, V2, V3)), f"{name}-md": rng.choice((V1, V2))}
    out: list[tuple[Resource, dict[str, Any]]] = [
        (CLUSTERS, _served(CLUSTERS, cluster_object(NS, name), rv)),
        (SECRETS, _served(SECRETS, kubeconfig_secret(f"{name}-kubeconfig", NS, name,
                                                     kubeconfig), rv + 1)),
    ]
    kcp = _served(K0S_CONTROL_PLANES, control_plane_object(
        NS, name, owner_version[f"{name}-cp"], 3, owner), rv + 2)
    md = _served(MACHINE_DEPLOYMENTS, deployment_object(
        NS, name, owner_version[f"{name}-md"], 3), rv + 3)
    for obj in (kcp, md):
        if rng.random() < 0.5:  # what the holder last wrote
            obj["status"] = {"conditions": [{
                "type": "K0sFleetUpToDate", "status": rng.choice(("True", "False")),
                "reason": "x", "message": f"{rng.randint(0, 3)}/3 machines on "
                                          f"{rng.choice((V1, V2))}"}]}
    out += [(K0S_CONTROL_PLANES, kcp), (MACHINE_DEPLOYMENTS, md),
            (MACHINE_SETS, _served(MACHINE_SETS, machine_set_object(NS, name, V1, 3), rv + 4))]
    for j in range(6):
        cp = j < 3
        m = f"{name}-cp-{j}" if cp else f"{name}-md-{j}"
        body = (control_plane_machine_object(NS, name, m, rng.choice((V1, V2)), kcp_owner)
                if cp else worker_machine_object(NS, name, m, rng.choice((V1, V2)),
                                                 md=f"{name}-md", ms=f"{name}-md-ms"))
        obj = _served(MACHINES, body, rv + 10 + j)
        obj["status"] = {"nodeRef": {"name": rng.choice((m, f"node-{m}"))}}
        ann = obj["metadata"].setdefault("annotations", {})
        if rng.random() < 0.4:
            ann[RUNNING_VERSION_KEY] = rng.choice((V1, V2))
        if rng.random() < 0.1:
            obj["metadata"]["deletionTimestamp"] = "2026-11-30T00:00:00Z"
        out.append((MACHINES, obj))
        if rng.random() < 0.5:
            plan = build_nodeplan(
                machine=obj, node_name=m, role="controller" if cp else "worker",
                version=rng.choice((V1, V2)), url="https://x.invalid/k0s", sha256=None,
                allow_unverified=True, owner_kind="K0sControlPlane" if cp
                else "MachineDeployment", owner_name=f"{name}-cp" if cp else f"{name}-md")
            plan = _served(NODE_PLANS, plan, rv + 30 + j)
            plan["status"] = {"phase": rng.choice(PHASES), "message": "m"}
            out.append((NODE_PLANS, plan))
    return out


def fleet_upgrade() -> dict[str, Any]:
    return {"apiVersion": FLEET_UPGRADES.api_version, "kind": FLEET_UPGRADES.kind,
            "metadata": {"name": "to-v2", "namespace": NS, "resourceVersion": "7",
                         "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"version": V2}}


def foreign_progress(objects: list[tuple[Resource, dict[str, Any]]], sharded: bool
                     ) -> dict[ClusterKey, Any]:
    """Every cluster built as another replica's; ``sharded``: kept as a sharded replica
    that holds none of them keeps them (else as one replica keeps everything)."""
    config = FleetConfig.model_validate(
        {"management": {"namespace": NS}, "clusters": {"namespaces": [NS]}},
        by_alias=True, by_name=False)
    parts = FleetParts(config)
    view = ManagementView(Any, namespaces=[NS], intent_namespace=NS,  # type: ignore[arg-type]
                          on_object=parts.listener,
                          holds=(lambda _c: False) if sharded else None)
    parts.attach(view.caches, ClusterRegistry(view[SECRETS], on_change=lambda: None))
    view[FLEET_UPGRADES].observe(fleet_upgrade())
    for res, obj in objects:
        view[res].observe(copy.deepcopy(obj))
    members = parts.refresh_members()
    parts.foreign = frozenset(members)
    parts.rebuild(sorted(parts.take_dirty()), NOW, {})
    return {k: clusters_from_snapshot(p) for k, p in parts.parts.items()}


@pytest.mark.parametrize("seed", range(8))
def test_a_foreign_cluster_is_judged_the_same_from_the_foreign_subset(seed: int) -> None:
    rng = random.Random(seed)
    objects = [o for i in range(12) for o in cluster_objects(rng, i)]
    whole = foreign_progress(objects, sharded=False)
    kept = foreign_progress(objects, sharded=True)
    assert len(whole) == 12
    assert kept == whole
    # the fleets vary: not every cluster is in the same state
    assert len({repr(v) for v in whole.values()}) > 1


def all_objects() -> list[tuple[Resource, dict[str, Any]]]:
    rng = random.Random(1)
    return [o for i in range(6) for o in cluster_objects(rng, i)]


@pytest.mark.parametrize("res", sorted(FOREIGN_SPECS, key=lambda r: r.kind))
def test_the_foreign_subset_of_the_held_copy_is_the_foreign_subset(res: Resource) -> None:
    held = projection(res)
    foreign = projection(res, lambda _c: False)
    assert held is not None and foreign is not None
    for r, obj in all_objects():
        if r is not res:
            continue
        full = held(copy.deepcopy(obj))
        small = foreign(copy.deepcopy(obj))
        assert foreign(copy.deepcopy(full)) == small
        assert len(str(small)) < len(str(full))
        assert projection(res, lambda _c: True)(copy.deepcopy(obj)) == full  # type: ignore[misc]


def test_a_foreign_kubeconfig_is_not_kept_one_naming_no_cluster_is() -> None:
    secret = kubeconfig_secret("x-kubeconfig", NS, "x", {"clusters": []})
    keep = projection(SECRETS, lambda _c: False)
    assert keep is not None
    assert cluster_of(SECRETS, secret) == (NS, "x")
    assert keep(copy.deepcopy(secret)) == {"metadata": {
        "name": "x-kubeconfig", "namespace": NS,
        "labels": {CAPI_CLUSTER_LABEL: "x"}}}
    del secret["metadata"]["labels"]
    assert cluster_of(SECRETS, secret) is None
    assert "value" in keep(copy.deepcopy(secret))["stringData"]
    machine = worker_machine_object(NS, "y", "y-md-0", V1, md="y-md", ms="y-md-ms")
    del machine["metadata"]["labels"][CAPI_CLUSTER_LABEL]
    assert cluster_of(MACHINES, machine) == (NS, "y")  # by spec.clusterName


def test_a_cluster_taken_is_read_again_in_full_and_given_back_dropped() -> None:
    held: set[ClusterKey] = set()
    cache = ObjectCache("Machine", keep=projection(MACHINES, held.__contains__))
    changes: list[Any] = []
    cache.on_object = changes.append
    (obj,) = [o for r, o in all_objects() if r is MACHINES][:1]
    cache.observe(copy.deepcopy(obj))
    name, ns = obj["metadata"]["name"], obj["metadata"]["namespace"]
    small = cache.get(name, ns)
    assert small is not None and "uid" not in small["metadata"]
    assert cache.parsed((ns, name), machine_from).ref.uid == ""
    held.add((ns, obj["spec"]["clusterName"]))
    cache.rekeep([(ns, name)])  # nothing to gain without reading it again
    assert cache.get(name, ns) == small
    cache.observe(copy.deepcopy(obj))  # read again (same resourceVersion)
    full = cache.get(name, ns)
    assert full is not None and full["metadata"]["uid"] == obj["metadata"]["uid"]
    assert full["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]
    # the parse remembered for this resourceVersion is not the foreign subset's
    parsed = cache.parsed((ns, name), machine_from)
    assert parsed.ref.uid == obj["metadata"]["uid"] and parsed.infrastructure is not None
    before = len(changes)
    held.clear()
    cache.rekeep([(ns, name)])
    assert cache.get(name, ns) == small
    assert len(changes) == before + 1  # its cluster is rebuilt from the foreign subset
    assert cache.parsed((ns, name), machine_from).infrastructure is None
