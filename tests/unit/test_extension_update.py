"""Pure helpers of the UpdateMachine service: role, owner, node name."""

from __future__ import annotations

from fleet.extension.update import (
    machine_owner,
    machine_role,
    node_name_of,
)


def machine(labels: dict[str, str] | None = None, refs: list[dict[str, object]] | None = None,
            node: str | None = None) -> dict[str, object]:
    m: dict[str, object] = {"metadata": {"name": "m1", "namespace": "ns", "labels": labels or {},
                                         "ownerReferences": refs or []},
                            "spec": {"clusterName": "c1"}}
    if node:
        m["status"] = {"nodeRef": {"name": node}}
    return m


def test_role_owner_and_node_name() -> None:
    worker = machine({"cluster.x-k8s.io/deployment-name": "md-0"},
                     [{"kind": "MachineSet", "name": "md-0-abc", "controller": True}])
    assert machine_role(worker) == "worker"
    assert machine_owner(worker) == ("MachineDeployment", "md-0")
    cp = machine({"cluster.x-k8s.io/control-plane": ""},
                 [{"kind": "K0sControlPlane", "name": "cp", "controller": True}])
    assert machine_role(cp) == "controller"
    assert machine_owner(cp) == ("K0sControlPlane", "cp")
    lone = machine(refs=[{"kind": "MachineSet", "name": "ms", "controller": True}])
    assert machine_owner(lone) == ("MachineSet", "ms")
    assert machine_owner(machine()) == ("", "")
    assert node_name_of(machine(node="ip-10-0-0-1")) == "ip-10-0-0-1"
    assert node_name_of(machine()) == "m1"
