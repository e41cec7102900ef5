"""The hooks' behaviour, independent of HTTP: a validated request in, a response out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleet.config.models import ExtensionMode
from fleet.extension.admission import check_cluster_skew
from fleet.extension.canupdate import (
    MACHINE_SET_VERSION,
    MACHINE_VERSION,
    Decision,
    decide_machine,
    decide_machine_set,
    declined_machine,
    declined_machine_set,
    machine_answer,
    machine_set_answer,
)
from fleet.extension.catalog import HANDLERS
from fleet.extension.update import LABEL_CONTROL_PLANE, UpdateMachineService
from fleet.extension.wire import (
    CanUpdateMachineRequest,
    CanUpdateMachineSetRequest,
    DiscoveryResponse,
    Hook,
    PatchType,
    RequestBase,
    ResponseBase,
    ResponseStatus,
    UpdateMachineRequest,
    UpdateMachineResponse,
)

DISABLED = ("not in place: k0s-fleet's runtime extension is disabled (extension.mode=never); "
            "the standalone k0s-fleet controller handles in-place upgrades")


@dataclass
class ExtensionHandlers:
    """``update`` None: UpdateMachine is not wired (answers Failure, never guesses)."""

    update: UpdateMachineService | None = None
    mode: ExtensionMode = ExtensionMode.AUTO
    patch_type: PatchType = PatchType.JSON_PATCH

    async def handle(self, hook: Hook, req: RequestBase) -> ResponseBase:
        never = ExtensionMode(self.mode) is ExtensionMode.NEVER
        if hook is Hook.DISCOVERY:
            return DiscoveryResponse(status=ResponseStatus.SUCCESS,
                                     handlers=tuple(h.discovery_entry() for h in HANDLERS))
        if isinstance(req, CanUpdateMachineRequest):
            if never:
                return declined_machine(DISABLED)
            machine = req.desired.machine
            labels = (machine.get("metadata") or {}).get("labels") or {}
            role = "controller" if LABEL_CONTROL_PLANE in labels else "worker"
            return machine_answer(await self._with_cluster_skew(
                decide_machine(req, self.patch_type), machine, MACHINE_VERSION, role))
        if isinstance(req, CanUpdateMachineSetRequest):
            if never:
                return declined_machine_set(DISABLED)
            return machine_set_answer(await self._with_cluster_skew(
                decide_machine_set(req, self.patch_type), req.desired.machine_set,
                MACHINE_SET_VERSION, "worker"))
        if isinstance(req, UpdateMachineRequest):
            if never:
                return UpdateMachineResponse.failure(
                    "k0s-fleet's runtime extension is disabled (extension.mode=never); its "
                    "CanUpdate hooks decline, so CAPI should not call UpdateMachine")
            if self.update is None:
                return UpdateMachineResponse.failure(
                    "UpdateMachine is not wired to a management cluster client in this process")
            return await self.update.handle(req)
        raise TypeError(f"no handler for {hook} with {type(req).__name__}")

    async def _with_cluster_skew(self, d: Decision, desired: Mapping[str, Any],
                                 version_path: tuple[str, ...], role: str) -> Decision:
        """An in-place answer is withdrawn when the desired version breaks the cluster's
        skew (a worker on a newer minor than its oldest control plane, a control plane
        more than one minor ahead of a worker), read from the management cluster when
        UpdateMachine is wired to it. Reading only; CAPI then does its own rollout."""
        if not d.in_place or self.update is None:
            return d
        version: Any = desired
        for key in version_path:
            version = version.get(key) if isinstance(version, Mapping) else None
        namespace = str((desired.get("metadata") or {}).get("namespace") or "")
        cluster = str((desired.get("spec") or {}).get("clusterName") or "")
        if not isinstance(version, str) or not namespace or not cluster:
            return d
        control_planes, workers = await self.update.cluster_versions(namespace, cluster)
        refusal = check_cluster_skew(role, version, control_planes, workers,
                                     what=f"cluster {namespace}/{cluster}'s {role}s")
        return d if refusal is None else Decision.decline(str(refusal))
