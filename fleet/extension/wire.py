"""Request and response bodies of Cluster API's in-place update hooks, as they travel.

Modelled on the Go types of ``sigs.k8s.io/cluster-api/api/runtime/hooks/v1alpha1``
(Cluster API v1.12: ``common_types.go``, ``discovery_types.go``,
``inplaceupdate_types.go``). What matters on the wire:

- every body carries ``apiVersion: hooks.runtime.cluster.x-k8s.io/v1alpha1`` and a
  ``kind`` (CAPI sets both on requests; it decodes responses into typed structs, so
  they are informative there, and we always send them);
- ``status`` is ``Success`` or ``Failure``; ``message`` is omitted when empty;
- ``retryAfterSeconds`` (an int32) is always present on UpdateMachine responses;
- a ``Patch`` is ``{"patchType": "JSONPatch"|"JSONMergePatch", "patch": <bytes>}`` and
  Go's ``encoding/json`` writes ``[]byte`` as *standard* base64 with padding;
- the Machine/MachineSet in a request keeps only name, namespace, labels, annotations
  and spec (no uid, no status); the other objects only apiVersion, kind, that metadata
  and spec.

Objects inside requests stay plain dicts (the project's ``KubeObject``); the models
check the shape this extension relies on and nothing more.
"""

from __future__ import annotations

import base64
import binascii
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)

HOOKS_GROUP = "hooks.runtime.cluster.x-k8s.io"
HOOKS_VERSION = "v1alpha1"
HOOKS_API_VERSION = f"{HOOKS_GROUP}/{HOOKS_VERSION}"
INT32_MAX = 2**31 - 1


class ResponseStatus(StrEnum):
    SUCCESS = "Success"
    FAILURE = "Failure"


class PatchType(StrEnum):
    JSON_PATCH = "JSONPatch"
    JSON_MERGE_PATCH = "JSONMergePatch"


class FailurePolicy(StrEnum):
    IGNORE = "Ignore"
    FAIL = "Fail"


class Hook(StrEnum):
    """The hooks this extension serves, named as CAPI's catalog names them."""

    DISCOVERY = "Discovery"
    CAN_UPDATE_MACHINE = "CanUpdateMachine"
    CAN_UPDATE_MACHINE_SET = "CanUpdateMachineSet"
    UPDATE_MACHINE = "UpdateMachine"


def _decode_go_bytes(value: Any) -> bytes:
    """A Go ``[]byte`` from JSON: standard base64 (``encoding/base64.StdEncoding``).

    Go's decoder skips CR and LF inside the text and requires padding; so do we.
    """
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if value is None:
        return b""
    if not isinstance(value, str):
        raise ValueError("expected a base64 string")
    text = value.replace("\r", "").replace("\n", "")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as e:
        raise ValueError(f"not standard base64: {e}") from None


def _encode_go_bytes(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


GoBytes = Annotated[
    bytes,
    BeforeValidator(_decode_go_bytes),
    PlainSerializer(_encode_go_bytes, return_type=str, when_used="always"),
]


class WireModel(BaseModel):
    """Lenient about fields it does not know (CAPI may add some), strict about types."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class Patch(WireModel):
    patch_type: PatchType = Field(alias="patchType")
    patch: GoBytes = b""

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"patchType": str(self.patch_type)}
        if self.patch:  # Go: `json:"patch,omitempty"` drops an empty slice
            out["patch"] = _encode_go_bytes(self.patch)
        return out


# -- objects inside requests ------------------------------------------------------------

def _require_object(value: Any, what: str, *, spec: bool = True) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be an object")
    meta = value.get("metadata")
    if not isinstance(meta, dict):
        raise ValueError(f"{what}.metadata must be an object")
    for key in ("name", "namespace"):
        if key in meta and not isinstance(meta[key], str):
            raise ValueError(f"{what}.metadata.{key} must be a string")
    for key in ("labels", "annotations"):
        m = meta.get(key)
        if m is not None and not (
            isinstance(m, dict) and all(isinstance(v, str) for v in m.values())
        ):
            raise ValueError(f"{what}.metadata.{key} must map strings to strings")
    for key in ("apiVersion", "kind"):
        if key in value and not isinstance(value[key], str):
            raise ValueError(f"{what}.{key} must be a string")
    if spec and not isinstance(value.get("spec", {}), dict):
        raise ValueError(f"{what}.spec must be an object")
    return value


def _named_object(what: str) -> Any:
    def check(value: Any) -> dict[str, Any]:
        obj = _require_object(value, what)
        if not obj["metadata"].get("name"):
            raise ValueError(f"{what}.metadata.name is required")
        return obj

    return BeforeValidator(check)


def _optional_object(what: str) -> Any:
    def check(value: Any) -> dict[str, Any] | None:
        # runtime.RawExtension with omitzero: absent, null or {} all mean "none".
        if value is None or value == {}:
            return None
        return _require_object(value, what)

    return BeforeValidator(check)


MachineObject = Annotated[dict[str, Any], _named_object("machine")]
MachineSetObject = Annotated[dict[str, Any], _named_object("machineSet")]


class RequestBase(WireModel):
    """Fields common to every hook request (CommonRequest + TypeMeta)."""

    KIND: ClassVar[str] = ""

    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = None
    settings: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _type_meta(cls, data: Any) -> Any:
        # Checked before the fields, so a request sent to the wrong hook says so first.
        if not isinstance(data, dict):
            return data
        api_version, kind = data.get("apiVersion"), data.get("kind")
        if api_version is not None and api_version != HOOKS_API_VERSION:
            raise ValueError(f"apiVersion {str(api_version)[:80]!r} not served; expected "
                             f"{HOOKS_API_VERSION}")
        if kind is not None and kind != cls.KIND:
            raise ValueError(f"kind {str(kind)[:80]!r} sent to the {cls.KIND} handler")
        if "settings" in data and data["settings"] is None:
            data = {k: v for k, v in data.items() if k != "settings"}
        return data


class DiscoveryRequest(RequestBase):
    KIND: ClassVar[str] = "DiscoveryRequest"


class MachineObjects(WireModel):
    """CanUpdateMachineRequestObjects / UpdateMachineRequestObjects."""

    machine: MachineObject
    infrastructure_machine: Annotated[
        dict[str, Any] | None, _optional_object("infrastructureMachine")
    ] = Field(default=None, alias="infrastructureMachine")
    bootstrap_config: Annotated[
        dict[str, Any] | None, _optional_object("bootstrapConfig")
    ] = Field(default=None, alias="bootstrapConfig")


class MachineSetObjects(WireModel):
    """CanUpdateMachineSetRequestObjects."""

    machine_set: MachineSetObject = Field(alias="machineSet")
    infrastructure_machine_template: Annotated[
        dict[str, Any] | None, _optional_object("infrastructureMachineTemplate")
    ] = Field(default=None, alias="infrastructureMachineTemplate")
    bootstrap_config_template: Annotated[
        dict[str, Any] | None, _optional_object("bootstrapConfigTemplate")
    ] = Field(default=None, alias="bootstrapConfigTemplate")


class CanUpdateMachineRequest(RequestBase):
    KIND: ClassVar[str] = "CanUpdateMachineRequest"

    current: MachineObjects
    desired: MachineObjects


class CanUpdateMachineSetRequest(RequestBase):
    KIND: ClassVar[str] = "CanUpdateMachineSetRequest"

    current: MachineSetObjects
    desired: MachineSetObjects


class UpdateMachineRequest(RequestBase):
    KIND: ClassVar[str] = "UpdateMachineRequest"

    desired: MachineObjects


# -- responses --------------------------------------------------------------------------

class ResponseBase(WireModel):
    KIND: ClassVar[str] = ""

    status: ResponseStatus
    message: str = ""

    def _common(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "apiVersion": HOOKS_API_VERSION,
            "kind": self.KIND,
            "status": str(self.status),
        }
        if self.message:
            out["message"] = self.message
        return out

    def to_wire(self) -> dict[str, Any]:
        """The JSON object exactly as CAPI's Go types would serialize it."""
        return self._common()

    @classmethod
    def failure(cls, message: str) -> Self:
        return cls(status=ResponseStatus.FAILURE, message=message)


class GroupVersionHook(WireModel):
    api_version: str = Field(alias="apiVersion")
    hook: str


class ExtensionHandler(WireModel):
    name: str
    request_hook: GroupVersionHook = Field(alias="requestHook")
    timeout_seconds: int | None = Field(default=None, alias="timeoutSeconds", ge=0, le=30)
    failure_policy: FailurePolicy | None = Field(default=None, alias="failurePolicy")

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "requestHook": {"apiVersion": self.request_hook.api_version,
                            "hook": self.request_hook.hook},
        }
        if self.timeout_seconds is not None:
            out["timeoutSeconds"] = self.timeout_seconds
        if self.failure_policy is not None:
            out["failurePolicy"] = str(self.failure_policy)
        return out


class DiscoveryResponse(ResponseBase):
    KIND: ClassVar[str] = "DiscoveryResponse"

    handlers: tuple[ExtensionHandler, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        out = self._common()
        if self.handlers:
            out["handlers"] = [h.to_wire() for h in self.handlers]
        return out


class CanUpdateMachineResponse(ResponseBase):
    KIND: ClassVar[str] = "CanUpdateMachineResponse"

    machine_patch: Patch | None = Field(default=None, alias="machinePatch")
    infrastructure_machine_patch: Patch | None = Field(
        default=None, alias="infrastructureMachinePatch")
    bootstrap_config_patch: Patch | None = Field(default=None, alias="bootstrapConfigPatch")

    def to_wire(self) -> dict[str, Any]:
        out = self._common()
        for key, p in (("machinePatch", self.machine_patch),
                       ("infrastructureMachinePatch", self.infrastructure_machine_patch),
                       ("bootstrapConfigPatch", self.bootstrap_config_patch)):
            if p is not None:
                out[key] = p.to_wire()
        return out


class CanUpdateMachineSetResponse(ResponseBase):
    KIND: ClassVar[str] = "CanUpdateMachineSetResponse"

    machine_set_patch: Patch | None = Field(default=None, alias="machineSetPatch")
    infrastructure_machine_template_patch: Patch | None = Field(
        default=None, alias="infrastructureMachineTemplatePatch")
    bootstrap_config_template_patch: Patch | None = Field(
        default=None, alias="bootstrapConfigTemplatePatch")

    def to_wire(self) -> dict[str, Any]:
        out = self._common()
        for key, p in (("machineSetPatch", self.machine_set_patch),
                       ("infrastructureMachineTemplatePatch",
                        self.infrastructure_machine_template_patch),
                       ("bootstrapConfigTemplatePatch", self.bootstrap_config_template_patch)):
            if p is not None:
                out[key] = p.to_wire()
        return out


class UpdateMachineResponse(ResponseBase):
    KIND: ClassVar[str] = "UpdateMachineResponse"

    retry_after_seconds: int = Field(default=0, alias="retryAfterSeconds", ge=0, le=INT32_MAX)

    @field_validator("retry_after_seconds", mode="before")
    @classmethod
    def _int32(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("retryAfterSeconds must be an integer")
        return v

    def to_wire(self) -> dict[str, Any]:
        out = self._common()
        out["retryAfterSeconds"] = self.retry_after_seconds  # no omitempty in the Go type
        return out

    @property
    def done(self) -> bool:
        return self.status is ResponseStatus.SUCCESS and self.retry_after_seconds == 0


ResponseKind = Literal[
    "DiscoveryResponse", "CanUpdateMachineResponse", "CanUpdateMachineSetResponse",
    "UpdateMachineResponse",
]

REQUEST_TYPES: dict[Hook, type[RequestBase]] = {
    Hook.DISCOVERY: DiscoveryRequest,
    Hook.CAN_UPDATE_MACHINE: CanUpdateMachineRequest,
    Hook.CAN_UPDATE_MACHINE_SET: CanUpdateMachineSetRequest,
    Hook.UPDATE_MACHINE: UpdateMachineRequest,
}
RESPONSE_TYPES: dict[Hook, type[ResponseBase]] = {
    Hook.DISCOVERY: DiscoveryResponse,
    Hook.CAN_UPDATE_MACHINE: CanUpdateMachineResponse,
    Hook.CAN_UPDATE_MACHINE_SET: CanUpdateMachineSetResponse,
    Hook.UPDATE_MACHINE: UpdateMachineResponse,
}


def describe_validation_error(e: ValidationError) -> str:
    """One readable line naming each offending field (no input values echoed back)."""
    parts = []
    for err in e.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "(body)"
        parts.append(f"{loc}: {err['msg']}")
    more = len(e.errors()) - 5
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)
