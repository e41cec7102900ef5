"""Eligibility: in place only when the k0s version is the only thing out of date."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime

import pytest

from fleet.world.eligibility import (
    control_plane_eligibility,
    kubelet_form,
    machine_deployment_eligibility,
)
from fleet.world.model import (
    ANN_K0S_CONFIG,
    ANN_MACHINE_RUNNING_VERSION,
    ROLE_CONTROLLER,
    ROLE_WORKER,
    ControlPlaneInfo,
    InfraMachineInfo,
    MachineDeploymentInfo,
    MachineInfo,
    MachineSetInfo,
    NodeInfo,
    ObjectRef,
    TemplateRef,
    control_plane_from,
    deployment_from,
    machine_from,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BOOT = TemplateRef("bootstrap.cluster.x-k8s.io", "K0sWorkerConfigTemplate", "w-v1")
INFRA = TemplateRef("infrastructure.cluster.x-k8s.io", "DockerMachineTemplate", "w-v1")
CP_INFRA = TemplateRef("infrastructure.cluster.x-k8s.io", "DockerMachineTemplate", "cp-v1")
CONFIG = {"args": ["--enable-metrics-scraper"], "files": [{"path": "/etc/x", "content": "y"}]}


def md(version: str = "v1.31.3+k0s.0", **kw: object) -> MachineDeploymentInfo:
    return MachineDeploymentInfo(ref=ObjectRef("MachineDeployment", "ns", "md"), cluster="c",
                                 replicas=3, version=version, max_unavailable=1,
                                 bootstrap=BOOT, infrastructure=INFRA, **kw)  # type: ignore[arg-type]


def ms(**kw: object) -> MachineSetInfo:
    base = MachineSetInfo(ref=ObjectRef("MachineSet", "ns", "ms"), cluster="c", deployment="md",
                          bootstrap=BOOT, infrastructure=INFRA)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def worker(version: str | None = "v1.31.2+k0s.0", **kw: object) -> MachineInfo:
    base = MachineInfo(ref=ObjectRef("Machine", "ns", "w-0"), cluster="c", version=version,
                       role=ROLE_WORKER, created=T0, machine_set="ms")
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def kcp(version: str = "v1.31.3+k0s.0", **kw: object) -> ControlPlaneInfo:
    base = ControlPlaneInfo(ref=ObjectRef("K0sControlPlane", "ns", "cp"), cluster="c",
                            replicas=3, version=version, infrastructure=CP_INFRA,
                            k0s_config=CONFIG)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def cp(version: str | None = "v1.31.2+k0s.0", config: object = CONFIG,
       infra: InfraMachineInfo | None = None, **kw: object) -> MachineInfo:
    anns = {} if config is None else {ANN_K0S_CONFIG: config if isinstance(config, str)
                                      else json.dumps({**config, "k0s": {"spec": {"x": 1}}})}  # type: ignore[dict-item]
    base = MachineInfo(ref=ObjectRef("Machine", "ns", "cp-0"), cluster="c", version=version,
                       role=ROLE_CONTROLLER, created=T0, annotations=anns,
                       infra=infra or InfraMachineInfo(CP_INFRA.name, CP_INFRA.group_kind))
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


class TestMachineDeployment:
    def test_only_version_changed_is_in_place(self) -> None:
        e = machine_deployment_eligibility(worker(), md(), ms())
        assert (e.up_to_date, e.in_place, e.reasons) == (False, True, ())

    @pytest.mark.parametrize("spelling", ["v1.31.3+k0s.0", "v1.31.3", "v1.31.3-k0s.0",
                                          "1.31.3+k0s.0"])
    def test_version_spellings_are_the_same_release(self, spelling: str) -> None:
        node = NodeInfo("w-0", running_version=spelling)
        assert machine_deployment_eligibility(worker(spelling), md(), ms(), node).up_to_date

    def test_spec_version_alone_is_not_up_to_date(self) -> None:
        # CAPI's in-place flow sets spec.version before UpdateMachine has run.
        m = worker("v1.31.3+k0s.0")
        node = NodeInfo("w-0", running_version="v1.31.2+k0s.0")
        assert not machine_deployment_eligibility(m, md(), ms(), node).up_to_date

    def test_a_rolled_back_node_is_not_up_to_date(self) -> None:
        m = worker("v1.31.3+k0s.0", annotations={ANN_MACHINE_RUNNING_VERSION: "v1.31.3+k0s.0"})
        node = NodeInfo("w-0", running_version="v1.31.2+k0s.0")
        assert not machine_deployment_eligibility(m, md(), ms(), node).up_to_date

    def test_a_stock_node_is_judged_by_its_kubelet(self) -> None:
        up = NodeInfo("w-0", kubelet_version="v1.31.3+k0s")
        down = NodeInfo("w-0", kubelet_version="v1.31.2+k0s")
        m = worker("v1.31.3+k0s.0")
        assert machine_deployment_eligibility(m, md(), ms(), up).up_to_date
        assert not machine_deployment_eligibility(m, md(), ms(), down).up_to_date
        assert kubelet_form("v1.31.3+k0s.0") == "v1.31.3+k0s"

    def test_running_version_annotation_counts_as_up_to_date(self) -> None:
        m = worker(annotations={ANN_MACHINE_RUNNING_VERSION: "v1.31.3+k0s.0"})
        assert machine_deployment_eligibility(m, md(), ms()).up_to_date

    def test_k0s_build_number_is_a_different_release(self) -> None:
        e = machine_deployment_eligibility(worker("v1.31.3+k0s.1"), md(), ms())
        assert not e.up_to_date and e.in_place

    def test_bootstrap_template_change_is_not_in_place(self) -> None:
        e = machine_deployment_eligibility(
            worker(), md(), ms(bootstrap=dataclasses.replace(BOOT, name="w-v0")))
        assert not e.in_place
        assert "bootstrap template changed" in e.reason

    def test_infrastructure_template_change_is_not_in_place(self) -> None:
        e = machine_deployment_eligibility(
            worker(), md(), ms(infrastructure=dataclasses.replace(INFRA, kind="OtherTemplate")))
        assert not e.in_place and "infrastructure template changed" in e.reason

    def test_failure_domain_change_is_not_in_place(self) -> None:
        e = machine_deployment_eligibility(worker(), md(failure_domain="b"), ms())
        assert not e.in_place and "failure domain" in e.reason

    def test_unknown_machine_set_is_not_in_place(self) -> None:
        e = machine_deployment_eligibility(worker(), md(), None)
        assert not e.in_place and "MachineSet" in e.reason

    def test_bad_versions(self) -> None:
        e = machine_deployment_eligibility(worker("banana"), md(), ms())
        assert not e.in_place and "not a k0s version" in e.reason
        e = machine_deployment_eligibility(worker(), md("latest"), ms())
        assert not e.in_place and "not a k0s version" in e.reason
        e = machine_deployment_eligibility(worker(None), md(), ms())
        assert not e.in_place and "no version" in e.reason

    def test_deleting_machine_is_not_in_place(self) -> None:
        e = machine_deployment_eligibility(worker(deleting=True), md(), ms())
        assert not e.in_place and "deleted" in e.reason

    def test_several_reasons_are_all_reported(self) -> None:
        e = machine_deployment_eligibility(
            worker(), md(failure_domain="z"),
            ms(bootstrap=None, infrastructure=dataclasses.replace(INFRA, name="old")))
        assert len(e.reasons) == 3


class TestControlPlane:
    def test_only_version_changed_is_in_place(self) -> None:
        e = control_plane_eligibility(cp(), kcp())
        assert (e.up_to_date, e.in_place) == (False, True), e.reason

    def test_up_to_date(self) -> None:
        assert control_plane_eligibility(cp("v1.31.3-k0s.0"), kcp()).up_to_date

    @pytest.mark.parametrize("strategy", ["Recreate", "RecreateDeleteFirst"])
    def test_recreate_strategy_is_not_in_place(self, strategy: str) -> None:
        e = control_plane_eligibility(cp(), kcp(update_strategy=strategy))
        assert not e.in_place and f"updateStrategy is {strategy}" in e.reason

    def test_k0s_config_change_is_not_in_place(self) -> None:
        e = control_plane_eligibility(cp(), kcp(k0s_config={**CONFIG, "args": ["--other"]}))
        assert not e.in_place and "k0sConfigSpec changed (args)" in e.reason

    def test_k0s_member_is_not_compared(self) -> None:
        # kcp.k0s_config excludes `k0s`; the annotation's `k0s` differs: still in place.
        assert control_plane_eligibility(cp(), kcp()).in_place

    def test_empty_values_compare_like_go_omitempty(self) -> None:
        e = control_plane_eligibility(cp(config={**CONFIG, "preStartCommands": []}), kcp())
        assert e.in_place, e.reason

    def test_missing_or_bad_config_annotation_is_not_in_place(self) -> None:
        assert "annotation" in control_plane_eligibility(cp(config=None), kcp()).reason
        assert "annotation" in control_plane_eligibility(cp(config="{not json"), kcp()).reason

    def test_infra_cloned_from_other_template_is_not_in_place(self) -> None:
        e = control_plane_eligibility(
            cp(infra=InfraMachineInfo("cp-v0", CP_INFRA.group_kind)), kcp())
        assert not e.in_place and "infrastructure template changed" in e.reason
        e = control_plane_eligibility(
            cp(infra=InfraMachineInfo(CP_INFRA.name, "Other.infrastructure.x")), kcp())
        assert not e.in_place

    def test_unreadable_infra_machine_is_not_in_place(self) -> None:
        e = control_plane_eligibility(cp(infra=InfraMachineInfo(error="403 forbidden")), kcp())
        assert not e.in_place and "403 forbidden" in e.reason


def test_parsing_from_api_objects() -> None:
    md_obj = {
        "metadata": {"name": "md", "namespace": "ns", "uid": "u1"},
        "spec": {"clusterName": "c", "replicas": 6,
                 "rollout": {"strategy": {"type": "RollingUpdate",
                                          "rollingUpdate": {"maxUnavailable": "50%"}}},
                 "template": {"spec": {"version": "v1.31.3", "bootstrap": {"configRef": {
                     "apiGroup": BOOT.group, "kind": BOOT.kind, "name": BOOT.name}},
                     "infrastructureRef": {"apiVersion": f"{INFRA.group}/v1beta1",
                                           "kind": INFRA.kind, "name": INFRA.name}}}},
    }
    parsed = deployment_from(md_obj)
    assert (parsed.replicas, parsed.max_unavailable, parsed.bootstrap, parsed.infrastructure) \
        == (6, "50%", BOOT, INFRA)
    v1beta1 = {**md_obj, "spec": {**md_obj["spec"], "rollout": None,  # type: ignore[dict-item]
                                  "strategy": {"rollingUpdate": {"maxUnavailable": 2}}}}
    assert deployment_from(v1beta1).max_unavailable == 2

    m = machine_from({
        "metadata": {"name": "cp-0", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {"cluster.x-k8s.io/control-plane": ""},
                     "ownerReferences": [{"kind": "K0sControlPlane", "name": "cp"}]},
        "spec": {"clusterName": "c", "version": "v1.31.2"},
        "status": {"nodeRef": {"name": "node-x"}},
    })
    assert (m.role, m.owner, m.node_name, m.created) == (
        ROLE_CONTROLLER, ObjectRef("K0sControlPlane", "ns", "cp"), "node-x", T0)
    k = control_plane_from({"metadata": {"name": "cp", "namespace": "ns",
                                         "labels": {"cluster.x-k8s.io/cluster-name": "c"}},
                            "spec": {"version": "v1.31.3", "replicas": 3,
                                     "k0sConfigSpec": {"k0s": {"a": 1}, "args": ["x"]}}})
    assert (k.cluster, k.update_strategy, dict(k.k0s_config)) == ("c", "InPlace", {"args": ["x"]})

