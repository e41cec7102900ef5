"""Wire format of the in-place hooks: golden fixtures and Go's encoding of []byte."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from fleet.extension.canupdate import can_update_machine, can_update_machine_set
from fleet.extension.wire import (
    HOOKS_API_VERSION,
    CanUpdateMachineRequest,
    CanUpdateMachineSetRequest,
    Patch,
    PatchType,
    ResponseStatus,
    UpdateMachineRequest,
    UpdateMachineResponse,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hooks"


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


# -- golden request/response pairs ------------------------------------------------------

@pytest.mark.parametrize("stem", [
    "canupdatemachineset-request-version",
    "canupdatemachineset-request-failuredomain",
    "canupdatemachineset-request-kubeadm",
])
def test_can_update_machine_set_golden(stem: str) -> None:
    req = CanUpdateMachineSetRequest.model_validate(load(f"{stem}.json"))
    got = can_update_machine_set(req).to_wire()
    assert got == load(f"{stem.replace('request', 'response')}.json")


def test_can_update_machine_golden() -> None:
    req = CanUpdateMachineRequest.model_validate(load("canupdatemachine-request-version.json"))
    got = can_update_machine(req).to_wire()
    assert got == load("canupdatemachine-response-version.json")


def test_golden_patches_decode_to_the_expected_json_patch() -> None:
    """The base64 in the golden files is exactly Go's StdEncoding of these bytes."""
    resp = load("canupdatemachineset-response-version.json")
    raw = base64.b64decode(resp["machineSetPatch"]["patch"], validate=True)
    assert json.loads(raw) == [
        {"op": "replace", "path": "/spec/template/spec/version", "value": "v1.32.1+k0s.0"}]
    assert resp["machineSetPatch"]["patchType"] == "JSONPatch"
    resp = load("canupdatemachine-response-version.json")
    for key in ("machinePatch", "bootstrapConfigPatch"):
        assert json.loads(base64.b64decode(resp[key]["patch"])) == [
            {"op": "replace", "path": "/spec/version", "value": "v1.32.1+k0s.0"}]
    assert "infrastructureMachinePatch" not in resp


def test_declines_carry_no_patch_fields_at_all() -> None:
    for stem in ("failuredomain", "kubeadm"):
        resp = load(f"canupdatemachineset-response-{stem}.json")
        assert resp["status"] == "Success"
        assert not {k for k in resp if k.endswith("Patch")}
        assert resp["message"].startswith("not in place: ")


def test_update_machine_request_fixture_validates() -> None:
    req = UpdateMachineRequest.model_validate(load("updatemachine-request.json"))
    assert req.desired.machine["spec"]["version"] == "v1.32.1+k0s.0"
    assert req.settings == {"owner": "platform-team"}
    assert req.desired.bootstrap_config is not None
    assert req.desired.bootstrap_config["kind"] == "K0sWorkerConfig"


# -- Go's []byte: standard base64 with padding ------------------------------------------

@given(st.binary(max_size=300))
def test_patch_bytes_round_trip_as_go_std_base64(data: bytes) -> None:
    p = Patch(patch_type=PatchType.JSON_PATCH, patch=data)
    wire = p.to_wire()
    if data:
        assert wire["patch"] == base64.standard_b64encode(data).decode()
    else:
        assert "patch" not in wire  # omitempty
    assert Patch.model_validate(wire) == p
    assert Patch.model_validate_json(json.dumps(wire)) == p


def test_patch_decoding_is_std_not_urlsafe() -> None:
    data = bytes([0xFB, 0xFF, 0xBF])  # '+//' in std, '-__' in urlsafe
    std = base64.standard_b64encode(data).decode()
    assert std == "+/+/"
    assert Patch.model_validate({"patchType": "JSONPatch", "patch": std}).patch == data
    with pytest.raises(ValidationError):
        Patch.model_validate({"patchType": "JSONPatch", "patch": "-_-_"})
    with pytest.raises(ValidationError):
        Patch.model_validate({"patchType": "JSONPatch", "patch": "e30"})  # missing padding
    # Go's decoder skips newlines inside the text.
    assert Patch.model_validate({"patchType": "JSONPatch", "patch": "e3\n0="}).patch == b"{}"
    with pytest.raises(ValidationError):
        Patch.model_validate({"patchType": "StrategicMergePatch", "patch": "e30="})


def test_update_machine_response_always_has_retry_after_seconds() -> None:
    done = UpdateMachineResponse(status=ResponseStatus.SUCCESS)
    assert done.to_wire() == {"apiVersion": HOOKS_API_VERSION, "kind": "UpdateMachineResponse",
                              "status": "Success", "retryAfterSeconds": 0}
    assert done.done
    failed = UpdateMachineResponse.failure("boom")
    assert failed.to_wire()["retryAfterSeconds"] == 0
    assert failed.to_wire()["message"] == "boom"
    assert not failed.done
    with pytest.raises(ValidationError):
        UpdateMachineResponse(status=ResponseStatus.SUCCESS, retry_after_seconds=2**31)


# -- request validation -----------------------------------------------------------------

def test_request_type_meta_is_checked_when_present() -> None:
    body = load("updatemachine-request.json")
    with pytest.raises(ValidationError, match="kind"):
        UpdateMachineRequest.model_validate({**body, "kind": "CanUpdateMachineRequest"})
    with pytest.raises(ValidationError, match="apiVersion"):
        UpdateMachineRequest.model_validate(
            {**body, "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha2"})
    # Absent TypeMeta is fine (CAPI always sends it; curl users may not).
    bare = {k: v for k, v in body.items() if k not in ("apiVersion", "kind")}
    assert UpdateMachineRequest.model_validate(bare).desired.machine


@pytest.mark.parametrize("mutate, needle", [
    (lambda b: b.pop("desired"), "desired"),
    (lambda b: b["desired"].pop("machine"), "machine"),
    (lambda b: b["desired"]["machine"].pop("metadata"), "metadata"),
    (lambda b: b["desired"]["machine"]["metadata"].pop("name"), "name"),
    (lambda b: b["desired"]["machine"].__setitem__("spec", []), "spec"),
    (lambda b: b["desired"]["machine"]["metadata"].__setitem__("labels", {"a": 1}), "labels"),
    (lambda b: b.__setitem__("settings", {"a": 1}), "settings"),
    (lambda b: b["desired"].__setitem__("bootstrapConfig", "x"), "bootstrapConfig"),
])
def test_malformed_requests_are_rejected_with_the_field_named(mutate: Any, needle: str) -> None:
    body = load("updatemachine-request.json")
    mutate(body)
    with pytest.raises(ValidationError) as e:
        UpdateMachineRequest.model_validate(body)
    assert needle in str(e.value)


def test_optional_objects_absent_null_or_empty() -> None:
    body = load("updatemachine-request.json")
    empty: list[dict[str, Any] | None] = [None, {}]
    for value in empty:
        body["desired"]["bootstrapConfig"] = value
        assert UpdateMachineRequest.model_validate(body).desired.bootstrap_config is None
    del body["desired"]["bootstrapConfig"]
    assert UpdateMachineRequest.model_validate(body).desired.bootstrap_config is None
    body["settings"] = None
    assert UpdateMachineRequest.model_validate(body).settings == {}
