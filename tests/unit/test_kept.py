"""What the controller keeps of the management objects (fleet/world/kept.py) is everything its
readers use: the snapshot's parsers give the same answer on the kept subset as on the
whole object, for the objects the test builders write (as the API server returns them,
with CAPI's status and server bookkeeping) and for odd ones; so do the dispatcher's
readers (NodePlan body, Event reference, status conditions) and the kubeconfig reader."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from fleet.config.models import FleetConfig
from fleet.contract.nodeplan import build_nodeplan
from fleet.controllers.dispatcher.core import _condition_list
from fleet.controllers.dispatcher.owners import _object_version
from fleet.events import Regarding
from fleet.kube.cache import Kept, NotHeld, ObjectCache
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
from fleet.kube.watch import object_key
from fleet.testing.capi import (
    cluster_object,
    control_plane_machine_object,
    control_plane_object,
    deployment_object,
    machine_set_object,
    worker_machine_object,
)
from fleet.world.clusters import kubeconfig_from_secret, kubeconfig_secret, secret_digest
from fleet.world.kept import SPECS, project, projection
from fleet.world.model import (
    Condition,
    cluster_from,
    control_plane_from,
    deployment_from,
    machine_from,
    machine_set_from,
)
from fleet.world.snapshot import fleet_cluster

NS, CLUSTER, V = "fleet", "c1", "v1.31.2+k0s.0"
KUBECONFIG = {"apiVersion": "v1", "kind": "Config",
              "clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443",
                                                     "certificate-authority-data": "Q0E=" * 300}}],
              "users": [{"name": "u", "user": {"token": "t" * 900}}],
              "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
              "current-context": "x"}
CLUSTER_OWNER = {"apiVersion": CLUSTERS.api_version, "kind": "Cluster", "name": CLUSTER,
                 "uid": "u-cluster"}
KCP_OWNER = {"apiVersion": K0S_CONTROL_PLANES.api_version, "kind": K0S_CONTROL_PLANES.kind,
             "name": f"{CLUSTER}-cp", "uid": "u-kcp", "controller": True}
NOW = "2026-01-01T00:00:00Z"


def _conditions(*types: str) -> list[dict[str, Any]]:
    return [{"type": t, "status": "True", "reason": t, "message": f"{t} is fine " * 4,
             "lastTransitionTime": NOW, "observedGeneration": 3} for t in types]


def served(res: Resource, body: dict[str, Any], rv: int = 42, **status: Any) -> dict[str, Any]:
    """``body`` as the API server returns it: server metadata, managedFields, a status."""
    obj = copy.deepcopy(body)
    obj.setdefault("apiVersion", res.api_version)
    obj.setdefault("kind", res.kind)
    meta = obj["metadata"]
    meta.update(uid=f"uid-{meta['name']}", resourceVersion=str(rv), generation=3,
                creationTimestamp=NOW, managedFields=[{
                    "manager": "capi", "operation": "Update", "apiVersion": res.api_version,
                    "time": NOW, "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {f"f:x{i}": {} for i in range(30)}}}])
    meta.setdefault("annotations", {})["kubectl.kubernetes.io/last-applied-configuration"] = \
        json.dumps(body)
    if status:
        obj["status"] = status
    return obj


def realistic() -> dict[Resource, list[dict[str, Any]]]:
    """One cluster's objects from fleet/testing/capi.py's builders, as CAPI leaves them."""
    md, ms = f"{CLUSTER}-md", f"{CLUSTER}-md-ms"
    machine_status = {
        "nodeRef": {"apiVersion": "v1", "kind": "Node", "name": "node-0", "uid": "n"},
        "phase": "Running", "bootstrapReady": True, "infrastructureReady": True,
        "addresses": [{"type": "InternalIP", "address": "10.0.0.9"}],
        "nodeInfo": {"kubeletVersion": "v1.31.2+k0s", "architecture": "amd64",
                     "machineID": "0" * 32, "kernelVersion": "6.1.0"},
        "conditions": _conditions("Ready", "BootstrapReady", "InfrastructureReady",
                                  "NodeHealthy", "UpToDate"),
        "deprecated": {"v1beta1": {"conditions": _conditions("Ready", "NodeHealthy")}},
    }
    rollout_status = {"conditions": _conditions("Available", "MachinesReady", "RollingOut"),
                      "k0sFleet": {"nodes": 3, "upgraded": 1}, "replicas": 3,
                      "readyReplicas": 3, "observedGeneration": 3,
                      "selector": "cluster.x-k8s.io/cluster-name=c1"}
    cp = control_plane_object(NS, CLUSTER, V, 3, CLUSTER_OWNER)
    cp["spec"]["k0sConfigSpec"]["files"] = [{"path": "/etc/x", "content": "y" * 500}]
    odd_md = deployment_object(NS, "c3", V, 2)  # paused, cluster named in the template only
    del odd_md["spec"]["clusterName"]
    odd_md["spec"]["paused"] = True
    odd_md["spec"]["template"]["spec"]["failureDomain"] = "fd-1"
    odd_ms = machine_set_object(NS, "c3", V, 2)
    odd_ms["spec"]["template"]["spec"]["failureDomain"] = "fd-1"
    odd_cp = control_plane_object(NS, "c3", V, 1, CLUSTER_OWNER)
    odd_cp["spec"]["updateStrategy"] = "Recreate"
    # Machines whose owner is found from their ownerReferences only (no name label)
    cp_by_ref = control_plane_machine_object(NS, CLUSTER, "cp-1", V, KCP_OWNER)
    del cp_by_ref["metadata"]["labels"]["cluster.x-k8s.io/control-plane-name"]
    w_by_ref = worker_machine_object(NS, CLUSTER, "w-2", V, md=md, ms=ms)
    del w_by_ref["metadata"]["labels"]["cluster.x-k8s.io/set-name"]
    w_by_ref["metadata"]["ownerReferences"] = [{"kind": "MachineSet", "name": ms, "uid": "y"}]
    secret = kubeconfig_secret(f"{CLUSTER}-kubeconfig", NS, CLUSTER, KUBECONFIG)
    secret["data"]["other"] = "b3RoZXI="
    secret["metadata"]["annotations"] = {"note": "not read"}
    return {
        CLUSTERS: [served(CLUSTERS, cluster_object(NS, CLUSTER),
                          phase="Provisioned", conditions=_conditions("Available")),
                   served(CLUSTERS, {**cluster_object(NS, "paused"),
                                     "spec": {"paused": True}})],
        SECRETS: [served(SECRETS, secret)],
        K0S_CONTROL_PLANES: [served(K0S_CONTROL_PLANES, cp, **rollout_status),
                             served(K0S_CONTROL_PLANES, odd_cp)],
        MACHINE_DEPLOYMENTS: [
            served(MACHINE_DEPLOYMENTS, deployment_object(NS, CLUSTER, V, 7), **rollout_status),
            served(MACHINE_DEPLOYMENTS, deployment_object(
                NS, "c2", V, 2, max_unavailable=None)),
            served(MACHINE_DEPLOYMENTS, odd_md)],
        MACHINE_SETS: [served(MACHINE_SETS, machine_set_object(NS, CLUSTER, V, 7),
                              **rollout_status), served(MACHINE_SETS, odd_ms)],
        MACHINES: [
            served(MACHINES, control_plane_machine_object(NS, CLUSTER, "cp-0", V, KCP_OWNER),
                   **machine_status),
            served(MACHINES, {**worker_machine_object(NS, CLUSTER, "w-0", V, md=md, ms=ms),
                              }, **machine_status),
            served(MACHINES, cp_by_ref, **machine_status),
            served(MACHINES, w_by_ref),
            # created, not provisioned yet: no status; being deleted
            {**worker_machine_object(NS, CLUSTER, "w-1", V, md=md, ms=ms),
             "metadata": {**worker_machine_object(NS, CLUSTER, "w-1", V, md=md, ms=ms)[
                 "metadata"], "deletionTimestamp": NOW, "resourceVersion": "7",
                 "ownerReferences": [{"kind": "MachineSet", "name": ms, "uid": "x"}]}},
        ],
    }


PARSERS: dict[Resource, Callable[[dict[str, Any]], Any]] = {
    CLUSTERS: cluster_from,
    MACHINE_DEPLOYMENTS: deployment_from,
    MACHINE_SETS: machine_set_from,
    K0S_CONTROL_PLANES: control_plane_from,
    MACHINES: machine_from,
    SECRETS: secret_digest,
}


def kept_copy(res: Resource, obj: dict[str, Any], *, whole: bool = False) -> dict[str, Any]:
    """What a reader gets back from the cache after the cache was given ``obj``; with
    ``whole``, from a cache that keeps the whole object (as before fleet/world/kept.py: less
    managedFields and kubectl's last-applied annotation, which it never kept)."""
    cache = ObjectCache(res.kind, keep=None if whole else projection(res))
    cache.observe(copy.deepcopy(obj))
    meta = obj.get("metadata") or {}
    got = cache.get(str(meta.get("name") or ""), str(meta.get("namespace") or ""))
    assert got is not None
    return got


def outcome(parse: Callable[[dict[str, Any]], Any], obj: dict[str, Any]) -> Any:
    """What ``parse`` makes of ``obj``: its value, or the type of error it raises."""
    try:
        return parse(obj)
    except (TypeError, ValueError, AttributeError, KeyError) as e:
        return type(e)


CASES = [(res, i) for res, objs in realistic().items() for i in range(len(objs))]


@pytest.mark.parametrize(("res", "index"), CASES,
                         ids=[f"{r.kind}-{i}" for r, i in CASES])
def test_parsers_read_the_same_from_the_kept_subset(res: Resource, index: int) -> None:
    served_obj = realistic()[res][index]
    full = kept_copy(res, served_obj, whole=True)
    kept = kept_copy(res, served_obj)
    assert outcome(PARSERS[res], kept) == outcome(PARSERS[res], full)
    # who it is (the snapshot's index and the kubeconfig's cluster read it off the object)
    assert object_key(kept) == object_key(full) == object_key(served_obj)
    assert kept["metadata"].get("labels") == full["metadata"].get("labels") or \
        res is MACHINE_DEPLOYMENTS  # (an MD's cluster is its spec's)
    assert kept["metadata"]["resourceVersion"] == full["metadata"]["resourceVersion"]
    assert "managedFields" not in kept["metadata"]
    assert len(json.dumps(kept)) <= len(json.dumps(full))


def test_fleet_membership_reads_the_same_from_kept_clusters() -> None:
    config = FleetConfig.model_validate({"clusters": {
        "labelSelector": f"test.k0s-fleet.io/cluster in ({CLUSTER},paused)"}})
    for obj in realistic()[CLUSTERS]:
        full = kept_copy(CLUSTERS, obj, whole=True)
        assert fleet_cluster(config, kept_copy(CLUSTERS, obj)) == fleet_cluster(config, full)


def test_kept_secret_holds_the_kubeconfig_and_nothing_else() -> None:
    full = realistic()[SECRETS][0]
    kept = kept_copy(SECRETS, full)
    assert kubeconfig_from_secret(kept) == kubeconfig_from_secret(full) == KUBECONFIG
    assert secret_digest(kept) == secret_digest(full)
    # kept decoded (a quarter smaller than base64), the other keys dropped
    assert "data" not in kept and set(kept["stringData"]) == {"value"}
    assert secret_digest(kept) != secret_digest({**full, "data": {"value": "b3RoZXI="}})
    assert "annotations" not in kept["metadata"]
    assert kept["metadata"]["labels"] == full["metadata"]["labels"]  # cluster-name label
    for key in ("stringData",):  # stringData (a kubeconfig written by hand) is read too
        hand = {**full, "data": {}, key: {"value": "apiVersion: v1", "junk": "x"}}
        assert kept_copy(SECRETS, hand)[key] == {"value": "apiVersion: v1"}
        assert secret_digest(kept_copy(SECRETS, hand)) == secret_digest(hand)


def test_dispatcher_readers_get_what_they_read() -> None:
    objs = realistic()
    for served_machine in objs[MACHINES][:2]:
        kept = kept_copy(MACHINES, served_machine)
        machine = kept_copy(MACHINES, served_machine, whole=True)
        args: dict[str, Any] = {"node_name": "node-0", "role": "worker", "version": V,
                                "url": "https://x/k0s", "sha256": "0" * 64}
        assert build_nodeplan(machine=kept, **args) == build_nodeplan(machine=machine, **args)
    for res in (CLUSTERS, MACHINES, MACHINE_DEPLOYMENTS, K0S_CONTROL_PLANES, MACHINE_SETS):
        kept = kept_copy(res, objs[res][0])
        full = kept_copy(res, objs[res][0], whole=True)
        assert Regarding.of(kept) == Regarding.of(full)
        assert _object_version(full["kind"], kept) == _object_version(full["kind"], full)
        assert kept["metadata"]["annotations"] == full["metadata"]["annotations"]
    # the rollout status write merges into every condition: they are kept whole
    wanted = (Condition("K0sFleetUpgraded", "True", "Done", ""),)
    for res in (MACHINE_DEPLOYMENTS, K0S_CONTROL_PLANES, MACHINE_SETS):
        full = objs[res][0]
        kept = kept_copy(res, full)
        assert kept["status"] == {"conditions": full["status"]["conditions"],
                                  "k0sFleet": full["status"]["k0sFleet"]}
        now = datetime(2026, 1, 2, tzinfo=UTC)
        assert _condition_list(kept["status"]["conditions"], wanted, now) == \
            _condition_list(full["status"]["conditions"], wanted, now)


ODD: list[tuple[Resource, dict[str, Any]]] = [
    (MACHINES, {"metadata": {"name": "m", "namespace": NS}}),
    (MACHINES, {"metadata": {"name": "m", "namespace": NS}, "spec": "not a mapping"}),
    (MACHINES, {"metadata": {"name": "m", "namespace": NS, "labels": None,
                             "ownerReferences": ["junk", {"kind": "MachineSet"}]},
                "spec": {"version": 3}, "status": {"nodeRef": "node-0"}}),
    (MACHINES, {"metadata": {"name": "m", "namespace": NS,
                             "labels": {"cluster.x-k8s.io/control-plane": ""},
                             "ownerReferences": [{"kind": "K0sControlPlane"}]},
                "status": {"nodeRef": None}}),
    (MACHINES, {"metadata": {"name": "m", "namespace": NS, "annotations": ["a"]}}),
    (MACHINE_DEPLOYMENTS, {"metadata": {"name": "d", "namespace": NS},
                           "spec": {"template": {"spec": None}, "replicas": "x",
                                    "strategy": {"rollingUpdate": {"maxSurge": "25%"}}}}),
    (MACHINE_DEPLOYMENTS, {"metadata": {"name": "d", "namespace": NS},
                           "spec": {"template": "x"}, "status": {"conditions": "x"}}),
    (MACHINE_DEPLOYMENTS, {"metadata": {"name": "d", "namespace": NS},
                           "spec": {"template": {"spec": {"bootstrap": {"configRef": 1}}}},
                           "status": {"k0sFleet": ["x"]}}),
    (MACHINE_DEPLOYMENTS, {"metadata": {"name": "d", "namespace": NS},
                           "spec": {"clusterName": "c9", "template": {"spec": {}}}}),
    (MACHINE_SETS, {"metadata": {"name": "s", "namespace": NS}, "spec": None}),
    (MACHINE_SETS, {"metadata": {"name": "s", "namespace": NS,
                                 "creationTimestamp": "not a time"}}),
    (K0S_CONTROL_PLANES, {"metadata": {"name": "k", "namespace": NS},
                          "spec": {"k0sConfigSpec": "x", "machineTemplate": []}}),
    (K0S_CONTROL_PLANES, {"metadata": {"name": "k", "namespace": NS},
                          "spec": {"k0sConfigSpec": {"k0s": {"a": 1}, "args": ["x"]}}}),
    (K0S_CONTROL_PLANES, {"metadata": {"name": "k", "namespace": NS}, "status": []}),
    (CLUSTERS, {"metadata": {"name": "c", "namespace": NS, "labels": "x"}}),
    (CLUSTERS, {"metadata": {"name": "c", "namespace": NS}, "spec": {"paused": "yes"}}),
    (SECRETS, {"metadata": {"name": "s", "namespace": NS}}),
    (SECRETS, {"metadata": {"name": "s", "namespace": NS}, "data": {"value": "!!"}}),
    (SECRETS, {"metadata": {"name": "s", "namespace": NS}, "data": "x"}),
    (SECRETS, {"metadata": {"name": "s", "namespace": NS}, "data": {"value": 5}}),
    (SECRETS, {"metadata": {"name": "s", "namespace": NS}, "data": {"value": "/w=="}}),
    (SECRETS, {"metadata": {"name": "s", "namespace": NS}, "data": {"value": "e30="}}),
    (SECRETS, {"metadata": {"name": "s", "namespace": NS}, "data": {"value": ""}}),
    (SECRETS, {"metadata": {"name": "s", "namespace": NS}, "data": None,
               "stringData": {"value": "clusters: [a]"}}),
]


@pytest.mark.parametrize(("res", "obj"), ODD, ids=[f"{r.kind}-{i}" for i, (r, _) in
                                                    enumerate(ODD)])
def test_odd_objects_read_the_same_kept_or_whole(res: Resource, obj: dict[str, Any]) -> None:
    kept = kept_copy(res, obj)
    obj = kept_copy(res, obj, whole=True)
    assert outcome(PARSERS[res], kept) == outcome(PARSERS[res], obj)
    if res is SECRETS:
        assert outcome(kubeconfig_from_secret, kept) == outcome(kubeconfig_from_secret, obj)


def test_project_keeps_what_the_spec_names_and_odd_values_as_they_are() -> None:
    spec = {"a": True, "b": {"c": True}, "d": lambda v: "f(d)"}
    assert project({"a": {"x": 1}, "b": {"c": 2, "e": 3}, "d": 4, "z": 5}, spec) == \
        {"a": {"x": 1}, "b": {"c": 2}, "d": "f(d)"}
    assert project({"b": "str"}, spec) == {"b": "str"}
    assert project([1], spec) == [1]
    assert project({}, spec) == {}


def test_only_management_kinds_are_projected() -> None:
    assert set(SPECS) == {CLUSTERS, MACHINE_DEPLOYMENTS, MACHINE_SETS,
                          K0S_CONTROL_PLANES, MACHINES}
    assert projection(SECRETS) is not None
    assert projection(NODE_PLANS) is None and projection(FLEET_UPGRADES) is None


# -- the cache holding them ---------------------------------------------------------------

def machine(rv: int, *, version: str = V, phase: str = "Running") -> dict[str, Any]:
    return served(MACHINES, worker_machine_object(NS, CLUSTER, "w-0", version, md="d", ms="s"),
                  rv=rv, phase=phase, nodeRef={"name": "w-0"})


def test_cache_tells_listeners_only_of_kept_changes_and_keeps_the_newest_version() -> None:
    changes: list[dict[str, Any] | None] = []
    cache = ObjectCache("Machine", keep=projection(MACHINES), on_object=changes.append)
    cache.observe(machine(10))
    assert len(changes) == 1 and changes[0] is not None
    assert changes[0]["spec"]["version"] == V
    # a status field nobody reads moved: the newer version is kept (the base of the
    # next patch's precondition) but nothing read changed
    cache.observe(machine(11, phase="Deleting"))
    assert len(changes) == 1 and cache.resource_version("w-0", NS) == "11"
    got = cache.object("w-0", NS)
    assert got is not None and got["metadata"]["resourceVersion"] == "11"
    assert "phase" not in got["status"]
    # older events are ignored; a kept field moving is a change
    cache.observe(machine(9, version="v1.30.0+k0s.0"))
    assert cache.get("w-0", NS)["spec"]["version"] == V  # type: ignore[index]
    cache.observe(machine(12, version="v1.32.0+k0s.0"))
    assert len(changes) == 2 and cache.version == 2
    assert cache.get("w-0", NS)["spec"]["version"] == "v1.32.0+k0s.0"  # type: ignore[index]
    # every read is a fresh copy: a caller's edit never reaches the cache
    got = cache.get("w-0", NS)
    assert got is not None
    got["spec"]["version"] = "edited"
    assert cache.get("w-0", NS)["spec"]["version"] == "v1.32.0+k0s.0"  # type: ignore[index]
    assert ("fleet", "w-0") in cache and len(cache) == 1
    # deletion: listeners get the last kept object; a late event cannot resurrect it
    cache.forget(machine(13))
    assert changes[-1] is not None and changes[-1]["metadata"]["name"] == "w-0"
    cache.observe(machine(12))
    assert cache.get("w-0", NS) is None and ("fleet", "w-0") not in cache


def test_kept_entry_is_one_bytes_object_without_the_resource_version() -> None:
    full = machine(77)
    kept = Kept.of(project(full, SPECS[MACHINES]))
    assert kept.resource_version == "77" and b"77" not in kept.body.replace(b"w-0", b"")
    assert kept.as_object()["metadata"]["resourceVersion"] == "77"
    assert kept.as_object() == kept.as_object() and kept.as_object() is not kept.as_object()
    # a Machine as CAPI leaves it (status, conditions) keeps under a third of its JSON
    full = kept_copy(MACHINES, realistic()[MACHINES][1], whole=True)
    kept = Kept.of(project(full, SPECS[MACHINES]))
    assert len(kept.body) * 3 < len(json.dumps(full))


def counting_decodes(monkeypatch: pytest.MonkeyPatch) -> list[Kept]:
    """Every decode of a kept entry (Kept.as_object) from now on."""
    decoded: list[Kept] = []
    original = Kept.as_object

    def as_object(self: Kept) -> dict[str, Any]:
        decoded.append(self)
        return original(self)

    monkeypatch.setattr(Kept, "as_object", as_object)
    return decoded


def test_a_remembered_parse_neither_decodes_nor_parses_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    changes: list[dict[str, Any] | None] = []
    cache = ObjectCache("Machine", keep=projection(MACHINES), on_object=changes.append)
    decoded = counting_decodes(monkeypatch)
    parsed: list[dict[str, Any]] = []

    def parse(obj: dict[str, Any]) -> Any:
        parsed.append(obj)
        return machine_from(obj)

    cache.observe(machine(10))
    # the listener is told of the kept subset as it was kept, with its resourceVersion,
    # without decoding the bytes just encoded
    assert decoded == [] and changes == [cache.get("w-0", NS)]
    decoded.clear()
    key = (NS, "w-0")
    first = cache.parsed(key, parse)
    assert len(decoded) == 1 and len(parsed) == 1 and first.version == V
    assert cache.parsed(key, parse) is first
    assert len(decoded) == 1 and len(parsed) == 1  # remembered: not even decoded
    cache.parsed(key, parse, tag="other")  # another parser's memo
    assert len(decoded) == 2 and len(parsed) == 2
    # a newer version is parsed afresh (even one whose kept subset did not move)
    cache.observe(machine(11, version="v1.32.0+k0s.0"))
    assert cache.parsed(key, parse).version == "v1.32.0+k0s.0" and len(parsed) == 3
    # what a listener parsed from the object it was told of is remembered too
    cache.observe(machine(12, version="v1.33.0+k0s.0"))
    told = changes[-1]
    assert told is not None and told["metadata"]["resourceVersion"] == "12"
    assert cache.parsed_object(told, parse).version == "v1.33.0+k0s.0"
    n_decoded, n_parsed = len(decoded), len(parsed)
    assert cache.parsed(key, parse).version == "v1.33.0+k0s.0"
    assert (len(decoded), len(parsed)) == (n_decoded, n_parsed)
    # an object not held is not an unreadable one (the snapshot would log and skip it)
    with pytest.raises(NotHeld) as e:
        cache.parsed((NS, "gone"), parse)
    assert not isinstance(e.value, KeyError) and "Machine fleet/gone" in str(e.value)
    assert cache.describe(key) == (NS, "w-0", "12")
