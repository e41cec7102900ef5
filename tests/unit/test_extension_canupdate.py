"""CanUpdateMachine(Set): only a k0s version change is done in place, and the patch works.

Round trips apply the returned patch the way CAPI does (``internal/util/patch``): the
patch is applied to the whole current object with an independent RFC 6902 / RFC 7386
implementation, then only the spec part is copied back, and the result is compared
with desired the way CAPI compares (the Machine spec minus the fields CAPI ignores).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fleet.contract.versions import K0sVersion
from fleet.extension.canupdate import (
    Decision,
    can_update_machine,
    decide_machine,
    decide_machine_set,
    machine_spec_for_diff,
)
from fleet.extension.wire import (
    CanUpdateMachineRequest,
    CanUpdateMachineSetRequest,
    Patch,
    PatchType,
    ResponseStatus,
)

NS = "fleet-prod"


# -- CAPI's side, re-done independently ---------------------------------------------------

def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def capi_apply(obj: dict[str, Any], patch: Patch | None, spec_path: tuple[str, ...]) -> Any:
    if patch is None:
        return obj
    doc = json.loads(patch.patch)
    if patch.patch_type is PatchType.JSON_PATCH:
        patched = jsonpatch.JsonPatch(doc).apply(copy.deepcopy(obj))
    else:
        patched = merge_patch(copy.deepcopy(obj), doc)
    out = copy.deepcopy(obj)
    src, dst = patched, out
    for key in spec_path[:-1]:
        src, dst = src[key], dst.setdefault(key, {})
    dst[spec_path[-1]] = src[spec_path[-1]]
    return out


def get(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def capi_equal_machine(patched: dict[str, Any], desired: dict[str, Any],
                       spec_path: tuple[str, ...]) -> bool:
    a, b = get(patched, spec_path), get(desired, spec_path)
    return machine_spec_for_diff(a) == machine_spec_for_diff(b) and \
        a.get("version") == b.get("version")


# -- builders -----------------------------------------------------------------------------

def machine(version: str | None, **spec: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "clusterName": "c1",
        "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io",
                                    "kind": "K0sWorkerConfig", "name": "m1"}},
        "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                              "kind": "DockerMachine", "name": "m1"},
        **spec,
    }
    if version is not None:
        s["version"] = version
    return {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m1", "namespace": NS}, "spec": s}


def bootstrap(kind: str = "K0sWorkerConfig", group: str = "bootstrap.cluster.x-k8s.io",
              **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{group}/v1beta2", "kind": kind,
            "metadata": {"name": "m1", "namespace": NS}, "spec": {"args": ["--debug"], **spec}}


def infra(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "DockerMachine",
            "metadata": {"name": "m1", "namespace": NS},
            "spec": {"customImage": "img", **spec}}


def machine_request(cur: dict[str, Any], want: dict[str, Any], *,
                    cur_boot: dict[str, Any] | None = None,
                    want_boot: dict[str, Any] | None = None,
                    cur_infra: dict[str, Any] | None = None,
                    want_infra: dict[str, Any] | None = None) -> CanUpdateMachineRequest:
    cb = bootstrap() if cur_boot is None else cur_boot
    return CanUpdateMachineRequest.model_validate({
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
        "kind": "CanUpdateMachineRequest",
        "current": {"machine": cur, "infrastructureMachine": cur_infra or infra(),
                    "bootstrapConfig": cb},
        "desired": {"machine": want, "infrastructureMachine": want_infra or infra(),
                    "bootstrapConfig": want_boot if want_boot is not None else cb},
    })


def machine_set(version: str, **tspec: Any) -> dict[str, Any]:
    m = machine(version, **tspec)
    m["spec"]["bootstrap"]["configRef"]["kind"] = "K0sWorkerConfigTemplate"
    return {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
            "metadata": {"name": "ms1", "namespace": NS},
            "spec": {"clusterName": "c1", "replicas": 3,
                     "template": {"metadata": {"labels": {"a": "b"}}, "spec": m["spec"]}}}


def template(kind: str, **tspec: Any) -> dict[str, Any]:
    return {"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2" if kind.startswith("K0s")
            else "infrastructure.cluster.x-k8s.io/v1beta2",
            "kind": kind, "metadata": {"name": "t1", "namespace": NS},
            "spec": {"template": {"spec": tspec}}}


def set_request(cur: dict[str, Any], want: dict[str, Any], *,
                boot_kind: str = "K0sWorkerConfigTemplate",
                cur_boot: dict[str, Any] | None = None,
                want_boot: dict[str, Any] | None = None,
                want_infra: dict[str, Any] | None = None) -> CanUpdateMachineSetRequest:
    b = cur_boot or template(boot_kind, args=["--debug"])
    i = template("DockerMachineTemplate", customImage="img")
    return CanUpdateMachineSetRequest.model_validate({
        "current": {"machineSet": cur, "infrastructureMachineTemplate": i,
                    "bootstrapConfigTemplate": b},
        "desired": {"machineSet": want, "infrastructureMachineTemplate": want_infra or i,
                    "bootstrapConfigTemplate": want_boot or b},
    })


# -- acceptance and round trips -----------------------------------------------------------

@pytest.mark.parametrize("patch_type", list(PatchType))
def test_machine_version_change_round_trips(patch_type: PatchType) -> None:
    req = machine_request(machine("v1.31.3+k0s.0"), machine("v1.32.1+k0s.0"))
    d = decide_machine(req, patch_type)
    assert d.in_place and d.machine_patch is not None
    assert d.machine_patch.patch_type is patch_type
    patched = capi_apply(req.current.machine, d.machine_patch, ("spec",))
    assert capi_equal_machine(patched, req.desired.machine, ("spec",))
    assert d.bootstrap_patch is None  # bootstrap spec unchanged
    assert "v1.31.3+k0s.0 -> v1.32.1+k0s.0" in d.reason


@pytest.mark.parametrize("patch_type", list(PatchType))
def test_machine_set_version_change_round_trips(patch_type: PatchType) -> None:
    req = set_request(machine_set("v1.31.3+k0s.0"), machine_set("v1.32.0+k0s.1"))
    d = decide_machine_set(req, patch_type)
    assert d.in_place and d.machine_patch is not None
    path = ("spec", "template", "spec")
    patched = capi_apply(req.current.machine_set, d.machine_patch, path)
    assert capi_equal_machine(patched, req.desired.machine_set, path)
    # only the version path is touched
    doc = json.loads(d.machine_patch.patch)
    if patch_type is PatchType.JSON_PATCH:
        assert doc == [{"op": "replace", "path": "/spec/template/spec/version",
                        "value": "v1.32.0+k0s.1"}]
    else:
        assert doc == {"spec": {"template": {"spec": {"version": "v1.32.0+k0s.1"}}}}


@pytest.mark.parametrize("patch_type", list(PatchType))
def test_bootstrap_config_version_is_patched_too(patch_type: PatchType) -> None:
    """K0sWorkerConfig.spec.version (k0smotron) may carry the version: add/replace/remove."""
    cases = [
        (bootstrap(version="v1.31.3+k0s.0"), bootstrap(version="v1.32.1+k0s.0")),  # replace
        (bootstrap(), bootstrap(version="v1.32.1+k0s.0")),                          # add
    ]
    if patch_type is PatchType.JSON_PATCH:
        cases.append((bootstrap(version="v1.31.3+k0s.0"), bootstrap()))             # remove
    for cur_boot, want_boot in cases:
        req = machine_request(machine("v1.31.3+k0s.0"), machine("v1.32.1+k0s.0"),
                              cur_boot=cur_boot, want_boot=want_boot)
        d = decide_machine(req, patch_type)
        assert d.in_place, d.reason
        assert req.current.bootstrap_config is not None
        assert req.desired.bootstrap_config is not None
        patched = capi_apply(req.current.bootstrap_config, d.bootstrap_patch, ("spec",))
        assert patched["spec"] == req.desired.bootstrap_config["spec"]


def test_bootstrap_template_version_add_on_machine_set() -> None:
    cur = template("K0sWorkerConfigTemplate", args=["--debug"])
    want = template("K0sWorkerConfigTemplate", args=["--debug"], version="v1.32.1+k0s.0")
    req = set_request(machine_set("v1.31.3+k0s.0"), machine_set("v1.32.1+k0s.0"),
                      cur_boot=cur, want_boot=want)
    d = decide_machine_set(req)
    assert d.in_place and d.bootstrap_patch is not None
    patched = capi_apply(cur, d.bootstrap_patch, ("spec", "template", "spec"))
    assert patched["spec"]["template"]["spec"] == want["spec"]["template"]["spec"]


def test_fields_capi_ignores_do_not_make_us_decline() -> None:
    cur = machine("v1.31.3+k0s.0", taints=[{"key": "a", "effect": "NoSchedule"}],
                  providerID="docker:///a", minReadySeconds=5,
                  deletion={"nodeDrainTimeoutSeconds": 10})
    want = machine("v1.32.1+k0s.0", readinessGates=[{"conditionType": "X"}],
                   deletion={"nodeDrainTimeoutSeconds": 99, "nodeDeletionTimeoutSeconds": 3})
    want["spec"]["infrastructureRef"]["name"] = "m1-new"
    d = decide_machine(machine_request(cur, want))
    assert d.in_place, d.reason


def test_equal_versions_spelled_differently_still_get_a_patch() -> None:
    d = decide_machine(machine_request(machine("v1.31.3-k0s.0"), machine("v1.31.3+k0s.0")))
    assert d.in_place and d.machine_patch is not None


def test_nothing_to_change() -> None:
    d = decide_machine(machine_request(machine("v1.31.3+k0s.0"), machine("v1.31.3+k0s.0")))
    assert d.in_place and d.machine_patch is None and d.bootstrap_patch is None


# -- declines -----------------------------------------------------------------------------

def declined(d: Decision, needle: str) -> None:
    assert not d.in_place
    assert d.machine_patch is None and d.bootstrap_patch is None
    assert d.reason.startswith("not in place: ")
    assert needle in d.reason, d.reason


def test_declines() -> None:
    up = (machine("v1.31.3+k0s.0"), machine("v1.32.1+k0s.0"))
    declined(decide_machine(machine_request(machine("v1.31.3+k0s.0"),
                                            machine("v1.32.1+k0s.0", failureDomain="b"))),
             "spec.failureDomain")
    declined(decide_machine(machine_request(*up, cur_boot=bootstrap("KubeadmConfig"))),
             "KubeadmConfig")
    declined(decide_machine(machine_request(*up, cur_boot=bootstrap(group="example.com"))),
             "example.com")
    declined(decide_machine(machine_request(*up, want_boot=bootstrap("K0sControllerConfig"))),
             "kind changes")
    declined(decide_machine(machine_request(*up, want_boot=bootstrap(args=["--other"]))),
             "K0sWorkerConfig spec.args")
    declined(decide_machine(machine_request(*up, want_infra=infra(customImage="other"))),
             "DockerMachine spec.customImage")
    declined(decide_machine(machine_request(machine("v1.32.1+k0s.0"),
                                            machine("v1.31.3+k0s.0"))), "NoDowngrade")
    declined(decide_machine(machine_request(machine("v1.31.3+k0s.0"), machine("latest"))),
             "not a k0s version")
    declined(decide_machine(machine_request(machine(None), machine("v1.32.1+k0s.0"))),
             "current spec.version")
    declined(decide_machine_set(set_request(machine_set("v1.31.3+k0s.0"),
                                            machine_set("v1.32.1+k0s.0"),
                                            boot_kind="K0sWorkerConfig")),
             "K0sWorkerConfigTemplate")
    req = machine_request(*up)
    no_boot = req.model_copy(update={
        "current": req.current.model_copy(update={"bootstrap_config": None})})
    declined(decide_machine(no_boot), "no bootstrap config")


def test_a_skip_of_two_minors_is_declined_naming_the_rule() -> None:
    """k0s upgrades one minor at a time: v1.31 -> v1.33 is not done in place, for a
    Machine or a MachineSet, and the answer names the rule; one minor is."""
    declined(decide_machine(machine_request(machine("v1.31.3+k0s.0"),
                                            machine("v1.33.1+k0s.0"))), "OneMinorAtATime")
    declined(decide_machine_set(set_request(machine_set("v1.31.3+k0s.0"),
                                            machine_set("v1.33.1+k0s.0"))), "OneMinorAtATime")
    declined(decide_machine_set(set_request(machine_set("v1.32.1+k0s.0"),
                                            machine_set("v1.31.3+k0s.0"))), "NoDowngrade")
    wire = can_update_machine(machine_request(machine("v1.31.3+k0s.0"),
                                              machine("v1.33.1+k0s.0"))).to_wire()
    assert wire["status"] == ResponseStatus.SUCCESS and "OneMinorAtATime" in wire["message"]
    assert not [k for k in wire if k.endswith("Patch")]
    assert decide_machine_set(set_request(machine_set("v1.31.3+k0s.0"),
                                          machine_set("v1.32.0+k0s.0"))).in_place


def test_decline_answer_is_success_without_patches() -> None:
    req = machine_request(machine("v1.31.3+k0s.0"), machine("v1.32.1+k0s.0", failureDomain="x"))
    wire = can_update_machine(req).to_wire()
    assert wire["status"] == ResponseStatus.SUCCESS
    assert not [k for k in wire if k.endswith("Patch")]


# -- property: accepted exactly when only the version changes (upwards) --------------------

versions = st.builds(lambda a, b, c, k: f"v{a}.{b}.{c}+k0s.{k}",
                     st.integers(1, 2), st.integers(0, 40), st.integers(0, 12), st.integers(0, 3))
scalars = st.one_of(st.text(max_size=5), st.integers(-3, 3), st.booleans())
small_specs = st.dictionaries(st.sampled_from(["failureDomain", "minReadySeconds", "taints",
                                               "providerID", "extra", "nodeDeletion"]),
                              scalars, max_size=3)


@settings(max_examples=300)
@given(cur_v=versions, want_v=versions, cur_extra=small_specs, want_extra=small_specs,
       patch_type=st.sampled_from(list(PatchType)))
def test_property_in_place_iff_only_version_differs(
        cur_v: str, want_v: str, cur_extra: dict[str, Any], want_extra: dict[str, Any],
        patch_type: PatchType) -> None:
    cur, want = machine(cur_v, **cur_extra), machine(want_v, **want_extra)
    req = machine_request(cur, want)
    d = decide_machine(req, patch_type)
    others_equal = machine_spec_for_diff(cur["spec"]) == machine_spec_for_diff(want["spec"])
    c, w = K0sVersion.parse(cur_v), K0sVersion.parse(want_v)
    upgrade = w >= c and w.major == c.major and w.minor - c.minor <= 1
    assert d.in_place == (others_equal and upgrade), d.reason
    if d.in_place:
        patched = capi_apply(cur, d.machine_patch, ("spec",))
        assert capi_equal_machine(patched, want, ("spec",))
    else:
        assert d.machine_patch is None and d.bootstrap_patch is None


@settings(max_examples=150)
@given(cur_v=versions, want_v=versions, patch_type=st.sampled_from(list(PatchType)))
def test_property_machine_set_round_trip(cur_v: str, want_v: str, patch_type: PatchType) -> None:
    assume(K0sVersion.parse(want_v) >= K0sVersion.parse(cur_v))
    req = set_request(machine_set(cur_v), machine_set(want_v))
    c, w = K0sVersion.parse(cur_v), K0sVersion.parse(want_v)
    if (w.major, w.minor) > (c.major, c.minor + 1):  # more than one minor: declined
        assert not decide_machine_set(req, patch_type).in_place
        return
    d = decide_machine_set(req, patch_type)
    assert d.in_place
    path = ("spec", "template", "spec")
    patched = capi_apply(req.current.machine_set, d.machine_patch, path)
    assert capi_equal_machine(patched, req.desired.machine_set, path)
