"""Reading a control-plane Machine's infrastructure object (any provider's kind).

k0smotron decides "only the version changed" partly from the infrastructure Machine's
``cloned-from`` annotations (PROTOCOLS.md section 2). The kind is whatever the provider
defines, so its plural comes from API discovery. Results are cached briefly; only
out-of-date control-plane Machines are looked up at all.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import anyio

from fleet.kube import KubeClient, KubeError, NotFoundError
from fleet.kube.resources import Resource
from fleet.model import InfraMachineInfo, MachineInfo, TemplateRef, infra_machine_from


@dataclass(frozen=True, slots=True)
class _Cached:
    info: InfraMachineInfo
    at: float


class InfraMachines:
    def __init__(self, client: KubeClient, *, ttl: float = 10.0) -> None:
        self.client = client
        self.ttl = ttl
        self._resources: dict[tuple[str, str], Resource | str] = {}
        self._cache: dict[tuple[str, str, str, str], _Cached] = {}

    async def resource(self, group: str, kind: str) -> Resource | str:
        """The Resource for (group, kind), or a string saying why it cannot be found."""
        key = (group, kind)
        if key in self._resources:
            return self._resources[key]
        try:
            if group:
                found = await self.client.request("GET", f"/apis/{group}")
                gv = str((found.get("preferredVersion") or {}).get("groupVersion") or "")
                listing = await self.client.request("GET", f"/apis/{gv}")
            else:
                gv = "v1"
                listing = await self.client.request("GET", "/api/v1")
        except NotFoundError:
            result: Resource | str = f"API group {group!r} is not served"
            self._resources[key] = result
            return result
        except KubeError as e:
            return f"discovery of {group!r} failed: {e}"  # transient: not cached
        version = gv.split("/", 1)[1] if "/" in gv else gv
        result = f"kind {kind} is not served in {gv}"
        for r in listing.get("resources") or []:
            if r.get("kind") == kind and "/" not in str(r.get("name")):
                result = Resource(group, version, str(r["name"]), kind,
                                  namespaced=bool(r.get("namespaced")))
                break
        self._resources[key] = result
        return result

    async def lookup(self, ref: TemplateRef | None, namespace: str) -> InfraMachineInfo:
        if ref is None:
            return InfraMachineInfo(error="Machine has no infrastructureRef")
        key = (ref.group, ref.kind, namespace, ref.name)
        cached = self._cache.get(key)
        if cached is not None and time.monotonic() - cached.at < self.ttl:
            return cached.info
        res = await self.resource(ref.group, ref.kind)
        if isinstance(res, str):
            info = InfraMachineInfo(error=res)
        else:
            try:
                obj = await self.client.get(res, ref.name, namespace if res.namespaced else None)
                info = infra_machine_from(obj)
            except NotFoundError:
                info = InfraMachineInfo(error=f"{ref} not found")
            except KubeError as e:
                info = InfraMachineInfo(error=f"reading {ref}: {e}")
        self._cache[key] = _Cached(info, time.monotonic())
        return info

    async def for_machines(self, machines: Iterable[MachineInfo]
                           ) -> dict[tuple[str, str], InfraMachineInfo]:
        """The infrastructure objects of ``machines`` (looked up concurrently), by the
        Machine's (namespace, name)."""
        out: dict[tuple[str, str], InfraMachineInfo] = {}

        async def one(m: MachineInfo) -> None:
            out[(m.ref.namespace, m.ref.name)] = await self.lookup(m.infrastructure,
                                                                   m.ref.namespace)

        async with anyio.create_task_group() as tg:
            for m in machines:
                tg.start_soon(one, m)
        return out
