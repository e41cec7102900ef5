"""The handlers this extension offers, their names and the URL paths CAPI calls.

CAPI computes a handler's URL as ``<service path>/<group>/<version>/<lowercased hook>/
<lowercased handler name>`` (``runtimecatalog.GVHToPath``); discovery has no name.
After discovery CAPI registers each handler as ``<handler name>.<ExtensionConfig name>``
and splits that on the dot, so the ExtensionConfig's own name must not contain dots.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.extension.wire import (
    HOOKS_API_VERSION,
    HOOKS_GROUP,
    HOOKS_VERSION,
    ExtensionHandler,
    FailurePolicy,
    GroupVersionHook,
    Hook,
)


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    hook: Hook
    name: str
    timeout_seconds: int
    # Fail, never Ignore: an ignored CanUpdate error reads as "cannot update in place" and
    # CAPI would then recreate Machines; an ignored UpdateMachine error would be a success.
    failure_policy: FailurePolicy = FailurePolicy.FAIL

    def discovery_entry(self) -> ExtensionHandler:
        return ExtensionHandler(
            name=self.name,
            request_hook=GroupVersionHook(api_version=HOOKS_API_VERSION, hook=str(self.hook)),
            timeout_seconds=self.timeout_seconds,
            failure_policy=self.failure_policy,
        )


HANDLERS: tuple[HandlerSpec, ...] = (
    HandlerSpec(Hook.CAN_UPDATE_MACHINE, "can-update-machine", timeout_seconds=5),
    HandlerSpec(Hook.CAN_UPDATE_MACHINE_SET, "can-update-machineset", timeout_seconds=5),
    # Reads the Machine, the NodePlan and the workload Node: several round trips.
    HandlerSpec(Hook.UPDATE_MACHINE, "update-machine", timeout_seconds=15),
)
HANDLER_BY_HOOK = {h.hook: h for h in HANDLERS}


def hook_path(hook: Hook, name: str = "", prefix: str = "") -> str:
    base = f"{prefix.rstrip('/')}/{HOOKS_GROUP}/{HOOKS_VERSION}/{str(hook).lower()}"
    return f"{base}/{name.lower()}" if name else base


DISCOVERY_PATH = hook_path(Hook.DISCOVERY)
