"""Driving the runtime extension as Cluster API does."""

from __future__ import annotations

import base64
import copy
import json
import ssl
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import anyio
import jsonpatch

from fleet.extension import (
    ExtensionServer,
    UpdateMachineService,
)
from fleet.extension.catalog import HANDLER_BY_HOOK, hook_path
from fleet.extension.wire import Hook
from fleet.kube import KubeClient
from fleet.kube.resources import MACHINES

SCALE = 0.01  # seconds of test time per second of retryAfterSeconds


UPDATE_IN_PROGRESS = "in-place-updates.internal.cluster.x-k8s.io/update-in-progress"


PENDING_HOOKS = "runtime.cluster.x-k8s.io/pending-hooks"


def path_of(hook: Hook) -> str:
    return hook_path(hook, HANDLER_BY_HOOK[hook].name)


@dataclass
class Extension:
    server: ExtensionServer
    ssl: ssl.SSLContext
    service: UpdateMachineService


@dataclass
class Call:
    status: str
    message: str
    retry_after: int


@dataclass
class CapiDriver:
    ext: Extension
    mgmt: KubeClient
    calls: list[Call] = field(default_factory=list)
    seen: anyio.Event = field(default_factory=anyio.Event)

    async def post(self, hook: Hook, body: dict[str, Any]) -> dict[str, Any]:
        timeout = HANDLER_BY_HOOK[hook].timeout_seconds
        return await self.post_path(f"{path_of(hook)}?timeout={timeout}s", body)

    async def post_path(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.ext.server.url}{path}"
        async with aiohttp.ClientSession() as s, \
                s.post(url, data=json.dumps(body).encode(), ssl=self.ext.ssl) as r:
            assert r.status == 200, await r.text()
            doc: dict[str, Any] = await r.json()
            return doc

    async def can_update_machine_set(self, current: dict[str, Any],
                                     desired: dict[str, Any]) -> bool:
        """CAPI's canExtensionsUpdateMachineSet: patch current, then compare with desired."""
        def template() -> dict[str, Any]:
            return {"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
                    "kind": "K0sWorkerConfigTemplate",
                    "metadata": {"name": "md-0", "namespace": current["metadata"]["namespace"]},
                    "spec": {"template": {"spec": {"args": ["--debug"]}}}}
        infra = {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
                 "kind": "DockerMachineTemplate",
                 "metadata": {"name": "md-0", "namespace": current["metadata"]["namespace"]},
                 "spec": {"template": {"spec": {"customImage": "img"}}}}
        req = {"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
               "kind": "CanUpdateMachineSetRequest",
               "current": {"machineSet": current, "infrastructureMachineTemplate": infra,
                           "bootstrapConfigTemplate": template()},
               "desired": {"machineSet": desired, "infrastructureMachineTemplate": infra,
                           "bootstrapConfigTemplate": template()}}
        resp = await self.post(Hook.CAN_UPDATE_MACHINE_SET, req)
        assert resp["status"] == "Success", resp
        patch = resp.get("machineSetPatch")
        if not patch:
            return False
        assert patch["patchType"] == "JSONPatch"
        ops = json.loads(base64.b64decode(patch["patch"], validate=True))
        patched = jsonpatch.JsonPatch(ops).apply(copy.deepcopy(current))
        return bool(patched["spec"]["template"]["spec"] == desired["spec"]["template"]["spec"])

    async def start_in_place(self, machine: dict[str, Any], version: str) -> dict[str, Any]:
        """What the MachineSet controller does before UpdateMachine: desired spec + markers."""
        meta = machine["metadata"]
        return await self.mgmt.patch(MACHINES, meta["name"], {
            "metadata": {"annotations": {UPDATE_IN_PROGRESS: "", PENDING_HOOKS: "UpdateMachine"}},
            "spec": {"version": version}}, meta["namespace"])

    async def update_machine_once(self, machine_name: str, namespace: str) -> Call:
        m = await self.mgmt.get(MACHINES, machine_name, namespace)
        # cleanupMachine: only name, namespace, labels, annotations and spec travel.
        desired = {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                   "metadata": {k: m["metadata"][k] for k in
                                ("name", "namespace", "labels", "annotations")
                                if k in m["metadata"]},
                   "spec": m["spec"]}
        infra = {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
                 "kind": "DockerMachine",
                 "metadata": {"name": machine_name, "namespace": namespace,
                              "annotations": {UPDATE_IN_PROGRESS: ""}},
                 "spec": {"customImage": "img"}}
        resp = await self.post(Hook.UPDATE_MACHINE, {
            "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1",
            "kind": "UpdateMachineRequest",
            "desired": {"machine": desired, "infrastructureMachine": infra}})
        assert resp["kind"] == "UpdateMachineResponse"
        assert isinstance(resp["retryAfterSeconds"], int)
        call = Call(resp["status"], resp.get("message", ""), resp["retryAfterSeconds"])
        self.calls.append(call)
        self.seen.set()
        self.seen = anyio.Event()
        return call

    async def drive(self, machine_name: str, namespace: str, *, max_calls: int = 200) -> Call:
        """Call UpdateMachine until done or Failure, sleeping retryAfterSeconds (scaled)."""
        for _ in range(max_calls):
            call = await self.update_machine_once(machine_name, namespace)
            if call.status != "Success" or call.retry_after == 0:
                if call.status == "Success":
                    meta = (await self.mgmt.get(MACHINES, machine_name, namespace))["metadata"]
                    await self.mgmt.patch(MACHINES, machine_name, {"metadata": {"annotations": {
                        UPDATE_IN_PROGRESS: None, PENDING_HOOKS: None}}}, namespace)
                    assert meta["name"] == machine_name
                return call
            await anyio.sleep(call.retry_after * SCALE)
        raise AssertionError(f"UpdateMachine never finished: {self.calls[-3:]}")
