"""The Cluster API objects the dispatcher writes: the one writer of versions
(K0sControlPlane, K0smotronControlPlane, MachineDeployment, MachineSet, worker config
template, Machine), the pauses around a version write, an owner's rollout status and the
annotations removed.
"""

from __future__ import annotations

from typing import Any

from fleet.controllers.dispatcher.core import OWNER_RESOURCES, DispatcherCore, _condition_list
from fleet.kube import KubeObject
from fleet.kube.resources import MACHINE_SETS, MACHINES
from fleet.planner.actions import (
    AnnotateWorkerVersion,
    PatchMachineSetVersion,
    PatchMachineVersion,
    PauseObject,
    RecordWrittenVersion,
    ReleasePause,
    RemoveAnnotation,
    SetRolloutStatus,
    WriteVersion,
)
from fleet.world.model import (
    ANN_CAPI_PAUSED,
    ANN_MACHINE_RUNNING_VERSION,
    ANN_PAUSED_FOR,
    ANN_WRITTEN_VERSION,
    KIND_MD,
    KIND_WORKER_TEMPLATE,
)


class OwnerWrites(DispatcherCore):
    # -- Machines and owners ------------------------------------------------------------------
    async def _do_PatchMachineVersion(self, a: PatchMachineVersion) -> None:
        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            record = a.record_running and ann.get(ANN_MACHINE_RUNNING_VERSION) != a.version
            if (obj.get("spec") or {}).get("version") == a.version and not record:
                return None
            patch: dict[str, Any] = {"spec": {"version": a.version}}
            if record:
                patch["metadata"] = {"annotations": {ANN_MACHINE_RUNNING_VERSION: a.version}}
            return patch

        await self._patch(self.mgmt, MACHINES, a.machine.name, a.machine.namespace, mutate)

    async def _do_AnnotateWorkerVersion(self, a: AnnotateWorkerVersion) -> None:
        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            if ann.get(ANN_MACHINE_RUNNING_VERSION) == a.version:
                return None
            return {"metadata": {"annotations": {ANN_MACHINE_RUNNING_VERSION: a.version}}}

        await self._patch(self.mgmt, MACHINES, a.machine.name, a.machine.namespace, mutate)

    async def _do_SetRolloutStatus(self, a: SetRolloutStatus) -> None:
        res = OWNER_RESOURCES[a.owner.kind]
        now = self.clock()
        counts = a.counts.as_status()

        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            status = obj.get("status") or {}
            conds = _condition_list(status.get("conditions") or [], a.conditions, now)
            if conds == status.get("conditions") and status.get("k0sFleet") in (None, counts):
                return None  # (None: a CRD that prunes it; never write in a loop)
            return {"status": {"conditions": conds, "k0sFleet": counts}}

        await self._patch(self.mgmt, res, a.owner.name, a.owner.namespace, mutate,
                          subresource="status")

    async def _do_RemoveAnnotation(self, a: RemoveAnnotation) -> None:
        res = OWNER_RESOURCES[a.obj.kind]

        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            if ann.get(a.key) != a.value:
                return None
            return {"metadata": {"annotations": {a.key: None}}}

        await self._patch(self.mgmt, res, a.obj.name, a.obj.namespace, mutate)

    # -- the one writer of versions ----------------------------------------------------------
    async def _do_RecordWrittenVersion(self, a: RecordWrittenVersion) -> None:
        res = OWNER_RESOURCES[a.owner.kind]

        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            if ann.get(ANN_WRITTEN_VERSION) == a.version:
                return None
            if _object_version(a.owner.kind, obj) != a.version:
                return None  # changed meanwhile: the next pass decides afresh
            return {"metadata": {"annotations": {ANN_WRITTEN_VERSION: a.version}}}

        if await self._patch(self.mgmt, res, a.owner.name, a.owner.namespace, mutate):
            obj = self._owner_obj(a.owner)
            await self.event(obj or a.owner, "VersionAdopted",
                             f"k0s-fleet writes this object's version from now on (recorded "
                             f"{a.version}" + (f"; FleetUpgrade {a.intent.name}" if a.intent
                                               else "") + ")", action="Adopt")

    async def _do_WriteVersion(self, a: WriteVersion) -> None:
        res = OWNER_RESOURCES[a.owner.kind]

        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            current = _object_version(a.owner.kind, obj)
            paused_ok = not a.pause or (ANN_CAPI_PAUSED in ann
                                        and ann.get(ANN_PAUSED_FOR) == a.version)
            if current == a.version and ann.get(ANN_WRITTEN_VERSION) == a.version and paused_ok:
                return None  # done already
            if current != a.expected or ann.get(ANN_WRITTEN_VERSION) != a.expected:
                return None  # someone else wrote it meanwhile: never race (reported next pass)
            if a.pause and ANN_CAPI_PAUSED in ann and ANN_PAUSED_FOR not in ann:
                return None  # paused by someone else: not ours to take over
            annotations: dict[str, str | None] = {ANN_WRITTEN_VERSION: a.version}
            if a.pause:
                annotations |= {ANN_CAPI_PAUSED: "", ANN_PAUSED_FOR: a.version}
            return {"metadata": {"annotations": annotations}, "spec": _version_patch(
                a.owner.kind, a.version)}

        obj = await self._patch(self.mgmt, res, a.owner.name, a.owner.namespace, mutate)
        if obj is not None:
            await self.event(obj, "VersionWritten",
                             f"k0s-fleet wrote version {a.version} (was {a.expected})"
                             + ("; reconciliation paused (cluster.x-k8s.io/paused) until every "
                                "Machine is on it" if a.pause else "")
                             + (f"; FleetUpgrade {a.intent.name}" if a.intent else ""),
                             action="WriteVersion")

    async def _do_PauseObject(self, a: PauseObject) -> None:
        res = OWNER_RESOURCES[a.owner.kind]

        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            if ANN_CAPI_PAUSED in ann:
                return None  # paused already (by us, or by someone else: then left alone)
            patch: dict[str, Any] = {"metadata": {"annotations": {ANN_CAPI_PAUSED: "",
                                                                  ANN_PAUSED_FOR: a.version}}}
            if a.template_version and _object_version(a.owner.kind, obj) != a.version:
                patch["spec"] = _version_patch(a.owner.kind, a.version)
            return patch

        await self._patch(self.mgmt, res, a.owner.name, a.owner.namespace, mutate)

    async def _do_ReleasePause(self, a: ReleasePause) -> None:
        res = OWNER_RESOURCES[a.owner.kind]

        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            if ANN_PAUSED_FOR not in ann:
                return None  # not paused by k0s-fleet (or released already)
            if _object_version(a.owner.kind, obj) != a.version:
                return None
            return {"metadata": {"annotations": {ANN_CAPI_PAUSED: None, ANN_PAUSED_FOR: None}}}

        # No Event (one request per object and rollout): VersionWritten said the pause
        # lasts until every Machine is on the version, and K0sFleetUpToDate turning True
        # (and, under a FleetUpgrade, UpgradeCompleted) says that moment.
        await self._patch(self.mgmt, res, a.owner.name, a.owner.namespace, mutate)

    async def _do_PatchMachineSetVersion(self, a: PatchMachineSetVersion) -> None:
        def mutate(obj: KubeObject) -> dict[str, Any] | None:
            tspec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
            if tspec.get("version") == a.version:
                return None
            return {"spec": {"template": {"spec": {"version": a.version}}}}

        await self._patch(self.mgmt, MACHINE_SETS, a.machine_set.name, a.machine_set.namespace,
                          mutate)


def _object_version(kind: str, obj: KubeObject) -> str | None:
    spec = obj.get("spec") or {}
    if kind in (KIND_MD, "MachineSet", KIND_WORKER_TEMPLATE):
        return ((spec.get("template") or {}).get("spec") or {}).get("version")
    return spec.get("version")


def _version_patch(kind: str, version: str) -> dict[str, Any]:
    if kind in (KIND_MD, "MachineSet", KIND_WORKER_TEMPLATE):
        return {"template": {"spec": {"version": version}}}
    return {"version": version}
