"""What a sharded replica keeps of the clusters it does not hold (fleet/world/kept.py
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
import dataclasses
import random
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.config.models import FleetConfig
from fleet.contract.nodeplan import build_nodeplan
from fleet.contract.signal import RUNNING_VERSION_KEY
from fleet.controllers.observe import ManagementView
from fleet.controllers.parts import FleetParts
from fleet.extension.exclusion import ExtensionExclusion
from fleet.kube.cache import ForeignKept, Kept, ObjectCache
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
from fleet.rollout.gate import FleetView, RolloutGate
from fleet.rollout.policy import RolloutPolicy
from fleet.rollout.progress import (
    clusters_from_snapshot,
    fingerprint,
    foreign_digest,
    part_progress,
)
from fleet.rollout.state import RolloutState
from fleet.testing.capi import (
    cluster_object,
    control_plane_machine_object,
    control_plane_object,
    deployment_object,
    machine_set_object,
    worker_machine_object,
)
from fleet.world.clusters import ClusterRegistry, kubeconfig_secret
from fleet.world.kept import (
    CAPI_CLUSTER_LABEL,
    FOREIGN_SPECS,
    FOREIGN_ZDICT,
    cluster_of,
    foreign,
    projection,
)
from fleet.world.model import ClusterKey, deployment_from, machine_from

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


CONFIG = FleetConfig.model_validate(
    {"management": {"namespace": NS}, "clusters": {"namespaces": [NS]},
     "rollout": {"maxConcurrentClusters": 3, "waves": [
         {"name": "canary",
          "clusterSelector": {"matchLabels": {"test.k0s-fleet.io/cluster": "c000"}}},
         {"name": "rest"}]}},
    by_alias=True, by_name=False)


def foreign_parts(objects: list[tuple[Resource, dict[str, Any]]], sharded: bool,
                  digest: bool = True) -> tuple[FleetParts, ManagementView]:
    """Every cluster built as another replica's; ``sharded``: kept as a sharded replica
    that holds none of them keeps them (else as one replica keeps everything);
    ``digest``: their parts are foreign digests (else parts built from every object)."""
    parts = FleetParts(CONFIG)
    parts.digest = foreign_digest  # as the controller with the rollout policy does
    view = ManagementView(Any, namespaces=[NS], intent_namespace=NS,  # type: ignore[arg-type]
                          on_object=parts.listener,
                          holds=(lambda _c: False) if sharded else None)
    parts.attach(view.caches, ClusterRegistry(view[SECRETS], on_change=lambda: None))
    view[FLEET_UPGRADES].observe(fleet_upgrade())
    for res, obj in objects:
        view[res].observe(copy.deepcopy(obj))
    members = parts.refresh_members()
    parts.foreign = frozenset(members) if digest else frozenset()
    parts.rebuild(sorted(parts.take_dirty()), NOW, {})
    return parts, view


def foreign_progress(objects: list[tuple[Resource, dict[str, Any]]], sharded: bool
                     ) -> dict[ClusterKey, Any]:
    """The rollout progress of every cluster as a replica that acts on none keeps it."""
    parts, _ = foreign_parts(objects, sharded)
    assert all(p.progress is not None and not p.machines for p in parts.parts.values())
    return {k: part_progress(p) for k, p in parts.parts.items()}


def full_progress(objects: list[tuple[Resource, dict[str, Any]]]) -> dict[ClusterKey, Any]:
    """The reference: every cluster judged as another replica's, from its part built from
    all of its objects as served (one replica, nothing dropped, nothing digested)."""
    parts, _ = foreign_parts(objects, sharded=False, digest=False)
    assert all(p.progress is None and p.machines for p in parts.parts.values())
    return {k: clusters_from_snapshot(dataclasses.replace(p, foreign=frozenset({k})))
            for k, p in parts.parts.items()}


def decide(progress: dict[ClusterKey, Any], admitted: dict[str, str]) -> Any:
    """The fleet gate's decision over ``progress`` (every cluster's), with ``admitted``."""
    clusters = [c for k in sorted(progress) for c in progress[k]]
    state = RolloutState(admitted=admitted)
    return RolloutGate(CONFIG).evaluate(FleetView(clusters, state=state, fleet_writer=False),
                                        NOW)


def random_fleet(seed: int, n: int = 12) -> list[tuple[Resource, dict[str, Any]]]:
    rng = random.Random(seed)
    return [o for i in range(n) for o in cluster_objects(rng, i)]


@pytest.mark.parametrize("seed", range(8))
def test_a_foreign_cluster_is_judged_the_same_from_the_foreign_subset(seed: int) -> None:
    objects = random_fleet(seed)
    reference = full_progress(objects)
    whole = foreign_progress(objects, sharded=False)
    kept = foreign_progress(objects, sharded=True)
    assert len(reference) == 12
    assert whole == reference
    assert kept == reference
    # the fleets vary: not every cluster is in the same state
    assert len({repr(v) for v in reference.values()}) > 1


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 14),
       admit=st.lists(st.integers(0, 13), max_size=4))
def test_the_gate_decides_the_same_on_foreign_digests_as_on_full_objects(
        seed: int, n: int, admit: list[int]) -> None:
    """What a sharded replica keeps of the clusters it does not hold (compressed subsets,
    no parse memo, a digest per cluster) leads the fleet gate to the decision it takes on
    every object as served: every cluster's phase, verdict and reason, the waves, the
    admissions, the wake-up."""
    objects = random_fleet(seed, n)
    reference = full_progress(objects)
    kept = foreign_progress(objects, sharded=True)
    assert kept == reference
    fps = {k: fingerprint(v) for k, v in reference.items()}
    admitted = {f"{NS}/c{i:03d}": fps.get((NS, f"c{i:03d}"), "x") for i in admit}
    assert decide(kept, admitted) == decide(reference, admitted)


def test_a_foreign_object_is_kept_compressed_and_not_parsed_twice() -> None:
    """A foreign cluster's objects are kept as compressed bytes (no JSON, no remembered
    parse); taken, they are read in full and their parses remembered again."""
    objects = random_fleet(3, 2)
    _, view = foreign_parts(objects, sharded=True)
    for res in (MACHINES, MACHINE_DEPLOYMENTS, MACHINE_SETS, K0S_CONTROL_PLANES):
        cache = view[res]
        assert cache._entries and all(isinstance(e, ForeignKept)
                                      for e in cache._entries.values())
        assert not cache._memo
        for key, entry in cache._entries.items():
            assert len(entry.body) < len(Kept.of(cache.get(key[1], key[0]) or {}).body)
    plain, _ = foreign_parts(objects, sharded=False)
    for res in (MACHINES, MACHINE_DEPLOYMENTS):
        for key in view[res].object_keys():
            assert view[res].get(key[1], key[0]) == (
                projection(res, lambda _c: False) or (lambda o: o))(
                    plain.caches[res].get(key[1], key[0]) or {})


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


def test_a_taken_owner_is_kept_plain_and_given_back_compressed() -> None:
    held: set[ClusterKey] = set()
    cache = ObjectCache("MachineDeployment",
                        keep=projection(MACHINE_DEPLOYMENTS, held.__contains__),
                        foreign=foreign(MACHINE_DEPLOYMENTS, held.__contains__),
                        zdict=FOREIGN_ZDICT)
    (obj,) = [o for r, o in all_objects() if r is MACHINE_DEPLOYMENTS][:1]
    del obj["metadata"]["labels"]  # its cluster by spec.clusterName
    key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
    cache.observe(copy.deepcopy(obj))
    small = cache.get(key[1], key[0])
    assert isinstance(cache._entries[key], ForeignKept)
    first = cache.parsed(key, deployment_from)
    assert cache.parsed(key, deployment_from) is not first  # not remembered
    held.add((NS, obj["spec"]["clusterName"]))
    cache.rekeep([key])  # taken (runner: warm_taken)
    assert type(cache._entries[key]) is Kept and cache.get(key[1], key[0]) == small
    assert cache.parsed(key, deployment_from) is cache.parsed(key, deployment_from)
    assert cache.parsed(key, deployment_from) == first
    held.clear()
    cache.rekeep([key])  # given back
    assert isinstance(cache._entries[key], ForeignKept) and not cache._memo


def test_the_controller_s_policy_keeps_foreign_parts_as_digests() -> None:
    """As cli/controller.py composes it (the rollout policy inside the extension's
    exclusion), the controller's FleetParts get the digest; without a rollout policy,
    nothing reads other replicas' clusters' progress and parts stay whole."""
    rollout = RolloutPolicy(cast(Any, None), CONFIG, recorder=cast(Any, None))
    exclusion = ExtensionExclusion(cast(Any, None), CONFIG, rollout)
    assert exclusion.digest is not None
    assert ExtensionExclusion(cast(Any, None), CONFIG, None).digest is None
    objects = random_fleet(5, 3)
    parts, _ = foreign_parts(objects, sharded=True)
    full, _ = foreign_parts(objects, sharded=False, digest=False)
    digest = exclusion.digest
    for key, whole in full.parts.items():
        judged = dataclasses.replace(whole, foreign=frozenset({key}))
        assert part_progress(digest(judged, {})) == clusters_from_snapshot(judged) \
            == part_progress(parts.parts[key])
