"""The hooks' behaviour, independent of HTTP: a validated request in, a response out."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.config import ExtensionMode
from fleet.extension.canupdate import (
    can_update_machine,
    can_update_machine_set,
    declined_machine,
    declined_machine_set,
)
from fleet.extension.catalog import HANDLERS
from fleet.extension.update import UpdateMachineService
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
            return declined_machine(DISABLED) if never else \
                can_update_machine(req, self.patch_type)
        if isinstance(req, CanUpdateMachineSetRequest):
            return declined_machine_set(DISABLED) if never else \
                can_update_machine_set(req, self.patch_type)
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
